"""Language-model study: pieces with hand-checked values, and the tiny comparison end to end."""
from __future__ import annotations

import json
import math

import pytest
import torch

from models.corpus import CorpusMissingError, load_corpus
from pipelines.flows.language_model import (
    TINY,
    LMStudyError,
    get_batch,
    lr_at,
    paired_tests,
    run_comparison,
    split_corpus,
)


def _text(n=20_000, seed=0):
    g = torch.Generator().manual_seed(seed)
    words = [b"the ", b"cat ", b"sat ", b"on ", b"a ", b"mat. ", b"and ", b"dog "]
    idx = torch.randint(0, len(words), (n // 4,), generator=g).tolist()
    return b"".join(words[i] for i in idx)[:n]


def test_corpus_missing_raises_typed_error_with_fetch_hint(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETFUL_DATA", str(tmp_path))
    with pytest.raises(CorpusMissingError, match="models.corpus fetch"):
        load_corpus()
    f = tmp_path / "x.bin"
    f.write_bytes(b"abcdef")
    assert load_corpus(f, max_bytes=3) == b"abc"


def test_batches_are_next_byte_shifted_and_split_90_10():
    data = bytes(range(200)) * 5
    train, val = split_corpus(data, 0.1, 8)
    assert len(val) == 100 and len(train) == 900
    x, y = get_batch(train, 8, 4, torch.Generator().manual_seed(0))
    assert x.shape == (4, 8) and torch.equal(x[:, 1:], y[:, :-1])
    with pytest.raises(LMStudyError):
        split_corpus(b"tiny", 0.1, 8)


def test_cosine_schedule_hand_values():
    cfg = TINY.__class__(steps=100, lr=1e-3, min_lr=1e-4, warmup_frac=0.1)
    assert lr_at(0, cfg) == pytest.approx(1e-4)  # (0+1)/10 of lr
    assert lr_at(10, cfg) == pytest.approx(1e-3)
    assert lr_at(55, cfg) == pytest.approx(1e-4 + 0.5 * 9e-4)  # half-way through the cosine
    assert lr_at(100, cfg) == pytest.approx(1e-4)


def test_paired_tests_hand_values():
    res = paired_tests([1.0, 2.0, 3.0], [1.5, 2.5, 3.75])
    assert res["mean_diff_swa_minus_sv"] == pytest.approx((0.5 + 0.5 + 0.75) / 3)
    diffs = [0.5, 0.5, 0.75]
    m = sum(diffs) / 3
    sd = math.sqrt(sum((d - m) ** 2 for d in diffs) / 2)
    assert res["t"] == pytest.approx(m / (sd / math.sqrt(3)))
    assert 0 < res["wilcoxon_p"] <= 1
    assert math.isnan(paired_tests([1.0], [2.0])["t_p"])


def test_tiny_comparison_end_to_end(tmp_path):
    res = run_comparison(TINY, [0, 1], _text(), progress=False)
    assert len(res["per_seed"]) == 2
    for row in res["per_seed"]:
        # the window is the hybrid's measured active state plus the chunk
        assert row["window"] == min(TINY.block, round(row["mean_active_state"]) + TINY.chunk)
        assert 0 < row["mean_active_state"] <= TINY.block
        assert 0.5 < row["sv_bpb"] < 9.0 and 0.5 < row["swa_bpb"] < 9.0
    assert math.isfinite(res["tests"]["t"])
    json.dumps(res)  # JSON-serialisable


def test_flow_writes_json_with_prefect(prefect_harness, tmp_path):
    from pipelines.flows.language_model import language_model_flow

    corpus = tmp_path / "c.txt"
    corpus.write_bytes(_text())
    out = tmp_path / "r.json"
    language_model_flow(corpus=str(corpus), seeds=[0], tiny=True, out=str(out))
    res = json.loads(out.read_text())
    assert res["study"] == "language_model" and res["per_seed"][0]["seed"] == 0
