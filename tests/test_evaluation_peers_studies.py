"""Peers inside the selection studies: streaming variants, paired-vs-SV helper, result keys."""
from __future__ import annotations

import numpy as np
import pytest

from evaluation.studies import streaming_eviction
from evaluation.studies.common import paired_vs_sv, vs_sv_table


def test_paired_vs_sv_hand_case_and_nan_units():
    per = {"sv": [1.0, 1.0, 0.0, float("nan")], "a": [0.0, 0.0, 0.0, 1.0], "b": [1.0, 1.0, 1.0, 1.0]}
    vs = paired_vs_sv(per, metric="m", n_boot=500)
    assert vs["diffs"]["a"]["n_units"] == 3 and vs["diffs"]["a"]["mean"] == pytest.approx(2 / 3)
    assert vs["diffs"]["b"]["mean"] == pytest.approx(-1 / 3)
    assert vs["peer_beats_sv"] == []  # b's interval [-1, 0] touches 0
    per["b"] = [2.0, 2.0, 2.0, 2.0]
    assert paired_vs_sv(per, metric="m", n_boot=200)["peer_beats_sv"] == ["b"]
    tab = vs_sv_table("t", vs, {"sv": "cert"})
    assert tab["rows"][0][0].startswith("sv") and tab["rows"][0][-1] == "cert"
    assert [r[0] for r in tab["rows"][1:]] == ["a", "b"] and tab["rows"][1][-1] == "none"


def test_stream_tova_hand_case():
    # budget 2. t=2: the query 5 attends least to key 0 -> drop 0; t=3: query 0.05 attends least to 5 -> drop it
    X = np.array([[0.0], [0.1], [5.0], [0.05]])
    assert streaming_eviction.stream_tova(X, 2, 1.0).tolist() == [1, 3]


@pytest.mark.parametrize("pol", ["leverage", "kernel_leverage", "keydiff", "snapkv"])
def test_stream_press_respects_budget(pol):
    X = np.random.default_rng(0).normal(size=(30, 3))
    kept = streaming_eviction.stream_press(X, 11, 4, pol, 1.0)
    assert kept.size == 11 and np.all(np.diff(kept) > 0)
    if pol == "snapkv":  # the last observation window (chunk) is always kept
        assert {28, 29} <= set(kept.tolist())


def test_streaming_study_reports_peers_and_certificates():
    res = streaming_eviction.run(trials=3, seed=0)
    m = res["metrics"]
    assert set(m["vs_sv"]["diffs"]) == set(streaming_eviction.POLICIES) - {"sv"}
    for p in streaming_eviction.PEERS:
        d = m["vs_sv"]["diffs"][p]
        assert d["mean"] == pytest.approx(m["sv"]["rare_recall"]["mean"] - m[p]["rare_recall"]["mean"])
    assert m["sv_offers"]["max_certified_weight_change"] < 1e-12
    assert isinstance(m["peer_beats_sv"], list)
    assert any(t["title"].startswith("streamed context: SV − policy") for t in res["tables"])
