"""Deterioration protocol: causal features, label variants, sequences with carried context, the
paired stay-clustered bootstrap and the flow's result (tiny sizes)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from pipelines import deterioration as det


def test_causal_fill_matches_reference_and_never_reads_the_future():
    rng = np.random.default_rng(0)
    raw = rng.normal(size=(30, 6))
    obs = rng.random((30, 6)) < 0.3
    obs[:5, 2] = False  # a leading gap
    med = np.arange(6, dtype=float)
    out = det.causal_fill(raw, obs, med)
    np.testing.assert_array_equal(out, det.causal_fill_reference(raw, obs, med))
    assert np.all(out[:5, 2] == 2.0)  # the training median, not the first later reading
    for t in range(30):  # changing hours > t never changes hour t
        raw2, obs2 = raw.copy(), obs.copy()
        raw2[t + 1:] = 99.0
        obs2[t + 1:] = True
        np.testing.assert_array_equal(det.causal_fill(raw2, obs2, med)[: t + 1], out[: t + 1])


def test_backfill_exposure_and_observed_label_by_hand():
    obs = np.zeros((5, 6), bool)
    obs[2, 0] = True  # hr first measured at hour 2
    obs[0, 1] = True
    assert det.backfill_exposure(obs).tolist() == [True, True, False, False, False]
    raw = np.full((5, 6), 100.0)
    raw[:, 4] = 85.0  # SpO2 below 90 (filled) at every hour but never observed
    raw[:, 5] = 37.0
    obs[3, 4] = True
    filled_events = np.ones(5, bool)
    assert det.label_events(raw, obs, filled_events, "filled").tolist() == [True] * 5
    assert det.label_events(raw, obs, filled_events, "observed").tolist() == [False, False, False, True, False]
    with pytest.raises(det.StudyInputError):
        det.label_events(raw, obs, filled_events, "nope")


def _stays(lengths, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        ev = rng.random(n) < 0.2
        y, m = det.future_event_labels(ev)
        x = np.arange(n, dtype=np.float32)[:, None].repeat(2, 1)
        out.append(det.StayFeatures(x, ev, y, m, np.zeros(n, bool)))
    return out


@pytest.mark.parametrize("mode,context", [("sliding", 0), ("sliding", 5), ("stay", 0)])
def test_sequences_score_every_hour_once_with_carried_context(mode, context):
    stays = _stays([23, 7, 40])
    d = det.sequences(stays, mode, window=10, context=context)
    want = np.concatenate([s.y[s.m] for s in stays])
    # each scored hour once, in stay/hour order; x carries the hour index
    hours = d.scored(d.x[:, :, 0])
    grp = d.scored(np.broadcast_to(d.group[:, None], d.m.shape))
    np.testing.assert_array_equal(d.scored(d.y), want)
    expect_h = np.concatenate([np.flatnonzero(s.m) for s in stays])
    np.testing.assert_array_equal(hours, expect_h)
    np.testing.assert_array_equal(grp, np.concatenate([[j] * s.m.sum() for j, s in enumerate(stays)]))
    if mode == "sliding":
        # a scored hour h sees min(context + (h mod window), h) earlier hours in its row
        row_start = d.x[:, 0, 0]
        first_scored = np.argmax(d.m, axis=1)
        assert np.all(first_scored == np.minimum(row_start + context, row_start + first_scored) - row_start)
        assert d.x.shape[1] == min(10 + context, 40)
    else:
        assert len(d.x) == 3 and d.x.shape[1] == 40


def test_paired_cluster_bootstrap_matches_single_model_helper_and_pairs():
    from evaluation.metrics import auroc_auprc_with_ci

    rng = np.random.default_rng(1)
    g = np.repeat(np.arange(12), 15)
    y = (rng.random(g.size) < 0.3).astype(np.int8)
    a = y + rng.normal(0, 1.0, g.size)
    b = y + rng.normal(0, 2.0, g.size)
    r = det.paired_cluster_bootstrap(y, {"a": a, "b": b, "a2": a.copy()}, g, [("a", "b"), ("a", "a2")], n_boot=60)
    ref = auroc_auprc_with_ci(y, a, n_boot=60, seed=0, groups=g)
    for k in ("auroc", "auroc_low", "auroc_high", "auprc", "auprc_low", "auprc_high"):
        assert r["scores"]["a"][k] == pytest.approx(getattr(ref, k), abs=1e-12)
    same = r["pairs"]["a - a2"]
    assert same["auroc_diff"] == same["auroc_diff_low"] == same["auroc_diff_high"] == 0.0
    ab = r["pairs"]["a - b"]
    assert ab["auroc_diff_low"] <= ab["auroc_diff"] <= ab["auroc_diff_high"] and ab["auroc_diff"] > 0
    assert r["n_groups"] == 12 and r["n_boot_used"] + r["n_boot_skipped"] == 60
    with pytest.raises(det.StudyInputError):
        det.paired_cluster_bootstrap(y, {"a": a}, g, [("a", "zz")], n_boot=5)


def test_flow_causal_protocol_baseline_and_paired_result(prefect_harness, tmp_path):
    from cohort.synthetic import make_small_warehouse
    from pipelines import runner
    from pipelines.flows.clinical_deterioration import deterioration_flow

    w = make_small_warehouse(tmp_path / "src", stays=24, seed=3)
    runs = tmp_path / "runs"
    runs.mkdir()
    dst = runs / "warehouse.duckdb"
    shutil.copy(w, dst)
    leak = det.leakage_summary(str(dst))
    assert 0 <= leak["all"]["share"] < 0.5
    with runner.results_context(str(runs)):
        res = deterioration_flow.with_options(task_runner=runner.make_task_runner(None, 1))(
            warehouse=str(dst), runs_dir=str(runs), models=("lstm", "softmax"), seeds=2, max_epochs=1, n_boot=30,
            size={"hidden": 4, "d_model": 4, "heads": 1}, window=24, context=12, label="observed", progress=False)
    m = res["metrics"]
    for mdl in ("lstm", "softmax"):
        assert m[mdl]["seeds"] == 2 and m[mdl]["auroc_sd"] >= 0
        assert m[mdl]["auroc_seedavg_low"] <= m[mdl]["auroc_seedavg"] <= m[mdl]["auroc_seedavg_high"]
    assert set(m["paired"]) == {"softmax - lstm", "softmax - event_now", "lstm - event_now"}
    assert m["paired"]["softmax - lstm"]["per_seed_seeds"] == 2
    assert 0.0 <= m["event_now"]["auroc"] <= 1.0 and m["label"] == "observed"
    roc, fig = res["figures"]
    assert fig["categories"][-1].startswith("event now")
    assert all(lo <= v <= hi for lo, v, hi in zip(fig["ci_low"], fig["values"], fig["ci_high"]))
    # the ROC curves: one per model and the baseline, on the fixed 101-point FPR grid, non-decreasing, 0 -> 1
    assert roc["kind"] == "line" and [s["label"].split(":")[0] for s in roc["series"]] == fig["categories"]
    for s, auroc in zip(roc["series"], fig["values"]):
        assert len(s["x"]) == len(s["y"]) == 101 and s["x"][0] == 0.0 and s["x"][-1] == 1.0 and s["y"][-1] == 1.0
        assert all(a <= b for a, b in zip(s["y"], s["y"][1:])) and f"{auroc:.3f}" in s["label"]
    stored = json.loads((runs / "deterioration" / "result.json").read_text())
    assert stored["config"]["protocol"] == det.PROTOCOL and "stay_id" not in json.dumps(stored)
