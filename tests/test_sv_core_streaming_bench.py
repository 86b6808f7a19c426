"""The StreamingGate cost profile and the streaming benchmark's tables and README block.

* :class:`sv_core.streaming.profile.CostProfile` charges exclusive time only (parts never sum to
  more than the operations took on the same clock), changes no result, and detaches cleanly;
* :func:`sv_core.streaming.profile.hot_shape` reports a support of at least ``ceil(1/C)`` keys
  (``sum alpha = 1``, ``alpha <= C``);
* the benchmark on a tiny stream renders its tables from the result alone, and ``--write-docs``
  replaces only the marker block of a decoy file (a file without markers is left unchanged).
"""
from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest

from sv_core import calibrate_C
from sv_core.bench.stream import icu_stream, main, run
from sv_core.bench.stream_tables import BEGIN, END, DocsBlockError, docs_text, write_docs
from sv_core.streaming import StreamingGate
from sv_core.streaming.profile import PARTS, CostProfile, hot_shape


def test_cost_profile_charges_exclusive_time_and_changes_nothing():
    C, sigma = calibrate_C(0.3, 40), 1.5
    X, _ = icu_stream(260, seed=3)
    plain, profiled = StreamingGate(C, sigma), StreamingGate(C, sigma)
    prof = CostProfile(profiled)
    elapsed = 0.0
    for i, x in enumerate(X):
        plain.admit(x)
        t = time.process_time()
        profiled.admit(x)
        if (i + 1) % 24 == 0:
            profiled.evict_reserve()
            plain.evict_reserve()
        if i == 200:
            profiled.forget(5)
            plain.forget(5)
        elapsed += time.process_time() - t
        prof.refresh()
    tot = prof.snapshot()
    assert set(tot) == set(PARTS) and all(v >= 0.0 for v in tot.values())
    assert tot["hot_solve"] > 0.0 and tot["exact_g"] > 0.0 and tot["screen_bound"] > 0.0
    assert sum(tot.values()) <= elapsed  # exclusive: nothing is charged twice
    P = X[::7] + 0.05
    assert np.array_equal(plain.score(P), profiled.score(P))
    assert np.array_equal(plain.ids, profiled.ids) and np.array_equal(plain.hot_ids, profiled.hot_ids)
    prof.detach()
    assert not {"admit", "evict_reserve", "forget", "_cold_g", "_account"} & set(vars(profiled))
    assert not {"admit", "forget", "evict_reserve"} & set(vars(profiled.hot_gate))
    shape = hot_shape(profiled)
    assert shape["support_lower_bound"] == math.ceil(1.0 / C - 1e-12)
    assert shape["support_lower_bound"] <= shape["n_support"] <= profiled.n_hot
    assert shape["n_margin"] <= shape["n_support"]


@pytest.fixture(scope="module")
def tiny_result():
    return run(sizes=(150, 260), window=8, stream_max=150, plain_max=400, libsvm_steps=2, threads="1",
               refit_sample=50, warmup=4, log=lambda *_: None)


def test_bench_tables_are_rendered_from_the_result(tiny_result):
    res = json.loads(json.dumps(tiny_result, default=float))  # as read back from its file
    rows = res["sizes"]
    assert [r["tokens"] for r in rows] == [150, 260] and rows[1]["how"].startswith("warm start")
    assert len(rows[1]["window"]["libsvm_s"]) == 2  # the warm start's solve counts as one re-solve
    for r in rows:
        assert r["exactness"]["score_dev_max"] <= 1e-12 and r["exactness"]["future_safe"]
        parts = r["window"]["streaming_parts_ms"]
        assert set(parts) == set(PARTS)
        work = r["window"]["streaming_work"]
        assert work["n_support"] >= work["support_lower_bound"]
    text = docs_text(res)
    assert text.count("\n| 150 | 1 |") == 1 and text.count("\n| 260 | 1 |") == 1  # peer table, 1 thread setting
    assert "| 150 | streamed |" in text and "| 260 | warm start |" in text  # breakdown table
    assert f"{rows[1]['n_hot']} / {rows[1]['n_live']}" in text
    sup = [r["window"]["streaming_work"]["n_support"] for r in rows]
    grow = f"icu stream, from {rows[0]['n_live']:,} to {rows[1]['n_live']:,} live tokens: the hot support grows as n^"
    assert grow in text and f"({sup[0]:,} → {sup[1]:,} keys" in text
    assert text.count("tokens (CPU means): plain Gate ÷ StreamingGate") == 2


def test_a_window_of_inert_tokens_only_is_marked_and_left_out_of_the_growth_line(tiny_result):
    res = json.loads(json.dumps(tiny_result, default=float))
    res["sizes"][1]["window"]["streaming_work"].update(hot_admissions_per_token=0.0, exact_checks_per_token=0.0)
    text = docs_text(res)
    assert "| 260 † | 1 |" in text and "* † the timed window held no token" in text
    assert "live tokens: the hot support grows" not in text  # one size left: no growth line
    assert "| 260 | 1 |" in docs_text(tiny_result)


def test_bench_without_refit_reports_the_certificate_only():
    res = run(sizes=(140,), window=4, stream_max=140, plain_max=0, libsvm_steps=0, threads="1",
              refit_sample=-1, log=lambda *_: None)
    e = res["sizes"][0]["exactness"]
    assert e["refit_keys"] == 0 and e["score_dev_max"] is None and e["future_safe"]
    assert e["kkt_residual_full_history"] <= 1e-12
    assert "| 140 | 1 |" in docs_text(res) and "no refit (certificate only)" in docs_text(res)


def test_write_docs_replaces_only_the_block_and_refuses_a_file_without_markers(tmp_path, tiny_result):
    path = tmp_path / "README.md"
    path.write_text(f"intro\n{BEGIN}\nold table\n{END}\ntail\n", encoding="utf-8")
    res_file = tmp_path / "bench.json"
    res_file.write_text(json.dumps(tiny_result, default=float), encoding="utf-8")
    assert main(["--table", str(res_file), "--write-docs", str(path)]) == 0
    doc = path.read_text(encoding="utf-8")
    assert doc.startswith(f"intro\n{BEGIN}\n") and doc.endswith(f"\n{END}\ntail\n") and "old table" not in doc
    assert docs_text(json.loads(res_file.read_text())) in doc
    bare = tmp_path / "other.md"
    bare.write_text("no markers here\n", encoding="utf-8")
    with pytest.raises(DocsBlockError):
        write_docs(str(bare), "x")
    assert main(["--table", str(res_file), "--write-docs", str(bare)]) == 2
    assert bare.read_text(encoding="utf-8") == "no markers here\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "bench.json", "other.md"]
