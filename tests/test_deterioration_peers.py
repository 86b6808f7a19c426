"""The deterioration study beside its strongest peers (issue 35, item 3): GRU and LightGBM (on causal
summary features of the same rows) join LSTM, softmax and SV attention in ``forgetful deterioration``;
the result reports them as YAIB does (AUROC and AUPRC, mean ± SD over seeds, stay-clustered
intervals, paired differences) and names the winner with its paired intervals, in the result, the
run-all summary row and the README's headline row."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from evaluation.clinical import deterioration as det
from evaluation.clinical import deterioration_training as dtr
from evaluation.clinical.deterioration_results import LABELS, comparison_pairs, winner


@pytest.fixture(scope="module")
def small_wh(tmp_path_factory):
    from cohort.synthetic import make_small_warehouse

    return str(make_small_warehouse(tmp_path_factory.mktemp("peers"), stays=24, seed=0))


def summary_features_reference(x: np.ndarray, windows=(6, 24)) -> np.ndarray:
    """Slow reference of :func:`tabular_peers.summary_features`: explicit loops over rows and hours."""
    N, T, F = x.shape
    V = F // 2
    out = []
    for i in range(N):
        rows = []
        for t in range(T):
            z, o = x[i, t, :V].astype(np.float64), x[i, t, V:].astype(np.float64)
            f = [*z, *o]
            for w in windows:
                lo = max(0, t - w + 1)
                zz, oo = x[i, lo:t + 1, :V].astype(np.float64), x[i, lo:t + 1, V:].astype(np.float64)
                f += [*zz.mean(0), *zz.min(0), *zz.max(0), *(z - zz[0]), *oo.mean(0)]
            rows.append(f)
        out.append(rows)
    return np.asarray(out, dtype=np.float32)


def test_summary_features_equal_the_reference_and_never_read_a_later_hour():
    from evaluation.clinical import tabular_peers as tp

    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(size=(4, 40, 6)), rng.random((4, 40, 6)) < 0.4], axis=2).astype(np.float32)
    f = tp.summary_features(x)
    assert f.shape == (4, 40, len(tp.feature_names()))
    np.testing.assert_allclose(f, summary_features_reference(x), rtol=1e-5, atol=1e-5)
    for t in range(0, 40, 3):  # changing hours > t never changes hour t
        y = x.copy()
        y[:, t + 1:] = 9.0
        np.testing.assert_array_equal(tp.summary_features(y)[:, :t + 1], f[:, :t + 1])


def test_lightgbm_repeats_exactly_for_a_seed_and_differs_across_seeds(small_wh):
    pytest.importorskip("lightgbm")
    from evaluation.clinical import tabular_peers as tp

    data = dtr.study_data(small_wh, "sliding", 24, 12, "filled", val_windows=20, test_stays=3)
    events = []
    with dtr.epoch_progress(events.append):  # one progress event: the flow's bar and its "trained in" line
        a = tp.train_and_test(data, 0, n_boot=50, return_predictions=True, train_windows=40)
    assert [(e["model"], e["epoch"], e["max_epochs"]) for e in events] == [("lightgbm", 1, 1)]
    assert events[0]["val_loss"] == pytest.approx(a["best_val_loss"])
    b = tp.train_and_test(data, 0, n_boot=50, return_predictions=True, train_windows=40)
    c = tp.train_and_test(data, 1, n_boot=50, return_predictions=True, train_windows=40)
    assert np.array_equal(a["p_test"], b["p_test"]) and a["auroc"] == b["auroc"] and a["n_params"] == b["n_params"]
    assert not np.array_equal(a["p_test"], c["p_test"])
    tgt = dtr.scored_targets(data)
    assert a["p_test"].shape == tgt["y"].shape and a["train_windows_per_epoch"] == 40 and a["epochs"] >= 1
    assert a["model"] == "lightgbm" and a["auroc_low"] <= a["auroc"] <= a["auroc_high"]


def test_the_gru_is_a_causal_sequence_model():
    torch = pytest.importorskip("torch")
    m = dtr.make_model("gru", 12, 30, dtr.DEFAULT_SIZE, seed=0).eval()
    x = torch.randn(2, 30, 12)
    with torch.no_grad():
        base = m(x)
        y = x.clone()
        y[:, 20:] = 5.0
        np.testing.assert_array_equal(m(y)[:, :20].numpy(), base[:, :20].numpy())
    assert "gru" in dtr.MODELS and "lightgbm" in det.MODELS and "lightgbm" not in dtr.MODELS


def _boot(aurocs: dict[str, float], pairs) -> dict:
    """A bootstrap result of the shape paired_cluster_bootstrap returns, made by hand."""
    sc = {k: {"auroc": a, "auroc_low": a - 0.02, "auroc_high": a + 0.02, "auprc": a / 2, "auprc_low": a / 2 - 0.01,
              "auprc_high": a / 2 + 0.01} for k, a in aurocs.items()}
    pr = {}
    for a, b in pairs:
        d = aurocs[a] - aurocs[b]
        pr[f"{a} - {b}"] = {"auroc_diff": d, "auroc_diff_low": d - 0.01, "auroc_diff_high": d + 0.01,
                            "auprc_diff": d / 2, "auprc_diff_low": d / 2 - 0.005, "auprc_diff_high": d / 2 + 0.005}
    return {"scores": sc, "pairs": pr}


def test_the_winner_reads_every_paired_difference_as_winner_minus_other():
    models = ["lstm", "gru", "softmax", "sv_attention", "lightgbm"]
    au = {"lstm": 0.785, "gru": 0.79, "softmax": 0.75, "sv_attention": 0.77, "lightgbm": 0.74}
    pairs = comparison_pairs(models)
    assert ("sv_attention", "gru") in pairs and ("gru", "lightgbm") in pairs and len(pairs) == 10 + 5
    w = winner(_boot(au, [p for p in pairs if p[1] != "event_now"]), models)
    assert w["winner"] == "gru" and set(w["versus"]) == {"lstm", "softmax", "sv_attention", "lightgbm"}
    for m, v in w["versus"].items():  # the pair is stored as "sv_attention - gru" etc.: turned around
        assert v["auroc_diff"] == pytest.approx(au["gru"] - au[m])
        assert v["auroc_diff_low"] == pytest.approx(au["gru"] - au[m] - 0.01)
        assert v["auroc_diff_low"] <= v["auroc_diff"] <= v["auroc_diff_high"]
    assert w["headline"].startswith("best: GRU, AUROC 0.790 [0.770, 0.810]; paired ΔAUROC − LSTM +0.005 "
                                    "[-0.005, +0.015]")
    assert "− causal SV attention +0.020 [+0.010, +0.030]" in w["headline"]
    assert w["claim"]["holds"] is False  # vs the runner-up LSTM: [-0.005, +0.015] does not exclude 0
    au["gru"] = 0.80
    assert winner(_boot(au, [p for p in pairs if p[1] != "event_now"]), models)["claim"]["holds"] is True
    assert winner(_boot({"lstm": 0.7}, []), ["lstm"]) is None


def test_flow_trains_gru_and_lightgbm_beside_sv_attention_and_names_the_winner(prefect_harness, small_wh,
                                                                               tmp_path):
    pytest.importorskip("lightgbm")
    from dashboards.headline import headline_rows
    from dashboards.reproduce import collect
    from pipelines.flows.clinical_deterioration import deterioration_flow
    from pipelines.flows.run_summary import summary_lines
    from pipelines.runtime import runner
    from pipelines.settings import DeteriorationSettings

    runs = tmp_path / "runs"
    runs.mkdir()
    dst = runs / "warehouse.duckdb"
    shutil.copy(small_wh, dst)
    models = ("gru", "sv_attention", "lightgbm")
    with runner.results_context(str(runs)):
        res = deterioration_flow.with_options(task_runner=runner.make_task_runner(None, 2))(
            warehouse=str(dst), runs_dir=str(runs), progress=False,
            settings=DeteriorationSettings(models=models, seeds=2, max_epochs=1, n_boot=200, window=24, context=12,
                                           size={"hidden": 4, "d_model": 4, "heads": 1}, tabular_windows=30))
    m = res["metrics"]
    for k in models:  # YAIB's report: AUROC and AUPRC, mean ± SD over seeds, stay-clustered intervals
        assert m[k]["seeds"] == 2 and m[k]["auroc_sd"] >= 0 and m[k]["auprc_sd"] >= 0
        assert m[k]["auroc_seedavg_low"] <= m[k]["auroc_seedavg"] <= m[k]["auroc_seedavg_high"]
        assert m[k]["auprc_seedavg_low"] <= m[k]["auprc_seedavg"] <= m[k]["auprc_seedavg_high"]
    assert set(m["paired"]) >= {"sv_attention - gru", "sv_attention - lightgbm", "gru - lightgbm"}
    best = max(models, key=lambda k: m[k]["auroc_seedavg"])
    assert m["winner"] == best and m["headline"].startswith(f"best: {LABELS[best]}, AUROC")
    assert len(res["claims"]) == 1 and res["claims"][0]["statement"].startswith(LABELS[best])
    cfg = res["config"]
    assert cfg["caps"]["tabular_windows"] == 30 and cfg["lightgbm"]["features"] == 72
    summary = res["tables"][0]["rows"]
    assert [r[0] for r in summary] == [LABELS[k] for k in models] + [LABELS["event_now"]]
    stored = json.loads((runs / "deterioration" / "result.json").read_text())
    assert stored["metrics"]["headline"] == m["headline"] and "stay_id" not in json.dumps(stored)
    # the run-all summary row and the README's headline row say which model wins, with its intervals
    row = next(ln for ln in summary_lines(runs, report="r.html", seconds={}, total_s=1.0)
               if ln.startswith("  deterioration "))
    assert m["headline"] in row and "claims hold" in row
    readme_row = dict(headline_rows(collect([runs])))["deterioration"]
    ranked = sorted(models, key=lambda k: -m[k]["auroc_seedavg"])
    short = {"gru": "GRU", "sv_attention": "SV attention", "lightgbm": "LightGBM"}
    assert f"best: {short[ranked[0]]}, ahead of {LABELS[ranked[1]]} by ΔAUROC " in readme_row


def test_each_model_reads_only_its_size_keys():
    """make_model reads no size key outside SIZE_KEYS[name] (the others may be anything), and a key
    inside changes the model - so a study task's cache key (its model's keys only) is complete."""
    import torch

    for name in dtr.MODELS:
        own = dtr.model_size(name, {"chunk": 4})
        assert set(own) == set(dtr.SIZE_KEYS[name])
        junk = {k: None for k in dtr.DEFAULT_SIZE if k not in own}
        m = dtr.make_model(name, 6, 24, {**junk, **own}, seed=0)
        ref = dtr.make_model(name, 6, 24, {**dtr.DEFAULT_SIZE, **own}, seed=0)
        x = torch.randn(2, 24, 6, generator=torch.Generator().manual_seed(1))
        assert torch.equal(m(x), ref(x)), name
    assert dtr.model_size("lightgbm", {"chunk": 4}) == {}
    assert dtr.model_size("sv_attention", {"chunk": 4})["chunk"] == 4
    assert dtr.make_model("sv_attention", 6, 24, {**dtr.DEFAULT_SIZE, "chunk": 4}).blocks[0].attn.chunk == 4


def test_a_changed_sv_gate_retrains_sv_attention_and_no_peer(prefect_harness, small_wh, tmp_path):
    """The task cache is keyed per model on its own size keys: a second run with another gate chunk
    trains SV attention again and serves the GRU from the cache (same result); another GRU width
    trains the GRU and serves SV attention."""
    from pipelines.flows.clinical_deterioration import deterioration_flow
    from pipelines.runtime import runner
    from pipelines.settings import DeteriorationSettings
    from pipelines.store.warehouse_files import cache_dir

    runs = tmp_path / "runs"
    runs.mkdir()
    dst = runs / "warehouse.duckdb"
    shutil.copy(small_wh, dst)
    base = {"hidden": 4, "d_model": 4, "heads": 1, "fista_iters": 10}

    def run(**size):
        with runner.results_context(str(runs)):
            res = deterioration_flow(warehouse=str(dst), runs_dir=str(runs), progress=False,
                                     settings=DeteriorationSettings(
                                         models=("gru", "sv_attention"), seeds=1, max_epochs=1, n_boot=50,
                                         window=24, context=12, size={**base, **size}))
        entries = sorted(p.name for p in cache_dir(str(dst)).glob("train_task-*.json"))
        return res, entries

    r1, e1 = run()
    r2, e2 = run(chunk=4)
    r3, e3 = run(chunk=4, hidden=6)
    assert len(e1) == 2 and len(e2) == 3 and len(e3) == 4
    assert set(e1) < set(e2) < set(e3)
    assert r2["metrics"]["gru"]["auroc_mean"] == r1["metrics"]["gru"]["auroc_mean"]
    assert r3["metrics"]["sv_attention"]["auroc_mean"] == r2["metrics"]["sv_attention"]["auroc_mean"]
    assert r2["config"]["size"]["chunk"] == 4 and r3["config"]["size"]["hidden"] == 6  # the full size, recorded


def test_size_overrides_from_the_command_line(capsys, tmp_path):
    """``forgetful deterioration --size KEY=VALUE ...`` reaches the study's settings; a bad entry is a
    one-line typed error before anything runs (the same parser as the epoch bench's NAME:KEY=VALUE)."""
    from pipelines.cli import build_parser, main
    from pipelines.flows.clinical_deterioration import settings_of

    args = build_parser().parse_args(["deterioration", "--size", "chunk=16", "C=0.5"])
    assert settings_of(args).size == {"chunk": 16, "C": 0.5}
    assert settings_of(build_parser().parse_args(["deterioration"])).size is None
    assert dtr.parse_size(["fista_iters=20"]) == {"fista_iters": 20}
    wh = tmp_path / "w.duckdb"
    for bad in (["chunk"], ["chunks=4"], ["chunk=1.5"], ["C=inf"], ["sigma=-1"], ["heads=two"]):
        with pytest.raises(det.DeteriorationInputError):
            dtr.parse_size(bad)
        assert main(["deterioration", "--warehouse", str(wh), "--size", *bad]) != 0
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "size" in err, err
    assert not wh.exists()


def test_bad_model_lists_are_typed_errors(small_wh, tmp_path):
    from pipelines.flows.clinical_deterioration import deterioration_flow
    from pipelines.settings import DeteriorationSettings

    for bad in (("lstm", "nope"), (), ("gru", "gru")):
        with pytest.raises(det.DeteriorationInputError):
            deterioration_flow.fn(warehouse=small_wh, runs_dir=str(tmp_path),
                                  settings=DeteriorationSettings(models=bad))


def test_the_preflight_knows_the_studys_models():
    from pipelines import preflight

    assert preflight.DETERIORATION_MODELS == det.MODELS
    from evaluation.clinical import meds_dev

    assert preflight.MEDS_DEV_MODELS == meds_dev.MODELS
