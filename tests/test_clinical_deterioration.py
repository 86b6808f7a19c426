"""Deterioration study: causal features, label variants, rows with carried context, the streaming
reader against the per-stay reference, the vectorised paired stay-clustered bootstrap against
its per-resample reference, reproducible training (seeded weights, same figures twice) and the
flow's result (tiny sizes)."""
from __future__ import annotations

import json
import shutil
import statistics
import threading
import time

import numpy as np
import pytest

from evaluation.clinical import deterioration as det
from evaluation.clinical import deterioration_reader as rd
from evaluation.clinical import deterioration_training as dtr
from evaluation.cluster_bootstrap import paired_cluster_bootstrap, paired_cluster_bootstrap_reference
from evaluation.errors import MetricError


@pytest.fixture(scope="module")
def small_wh(tmp_path_factory):
    from cohort.synthetic import make_small_warehouse

    return str(make_small_warehouse(tmp_path_factory.mktemp("det"), stays=24, seed=0))


def test_future_event_labels_by_hand():
    ev = np.array([0, 0, 1, 0, 0, 0, 0, 0, 0, 1], bool)
    y, m = det.future_event_labels(ev, 6)
    y2, m2 = det.future_event_labels_reference(ev, 6)
    assert np.array_equal(y, y2) and np.array_equal(m, m2)
    assert y.tolist() == [1, 1, 0, 1, 1, 1, 1, 1, 1, 0]
    assert m.tolist() == [True, True, True, True, False, False, False, False, False, False]


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


def test_block_features_equal_the_per_stay_functions_and_never_cross_a_stay():
    rng = np.random.default_rng(4)
    lengths = [9, 1, 0, 14, 6, 30]
    starts = np.concatenate([[0], np.cumsum(lengths)])
    raw = rng.normal(90, 20, size=(starts[-1], 6))
    obs = rng.random((starts[-1], 6)) < 0.35
    ev = rng.random(starts[-1]) < 0.2
    st = {"mean": np.full(6, 80.0), "sd": np.full(6, 10.0), "median": np.arange(6, dtype=float)}
    for label in det.LABEL_VARIANTS:
        blk = det.block_features(raw, obs, ev, starts, st, label)
        for j in range(len(lengths)):
            a, b = starts[j], starts[j + 1]
            z = (det.causal_fill_reference(raw[a:b], obs[a:b], st["median"]) - st["mean"]) / st["sd"]
            np.testing.assert_allclose(blk.x[a:b, :6], z.astype(np.float32), rtol=0, atol=0)
            e = det.label_events(raw[a:b], obs[a:b], ev[a:b], label)
            y, m = det.future_event_labels_reference(e)
            assert np.array_equal(blk.y[a:b], y) and np.array_equal(blk.m[a:b], m)
            assert np.array_equal(blk.backfilled[a:b], det.backfill_exposure(obs[a:b]))


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
    with pytest.raises(det.DeteriorationInputError):
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


@pytest.mark.parametrize("mode,window,context", [("sliding", 10, 0), ("sliding", 10, 5), ("sliding", 3, 40),
                                                 ("stay", 10, 0)])
def test_windows_cut_from_a_block_equal_the_reference_rows(mode, window, context):
    lengths = [23, 7, 0, 40, 6, 13]
    stays = _stays(lengths, seed=2)
    ref = det.sequences(stays, mode, window, context)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    blk = det.StayBlock(starts, np.concatenate([s.x for s in stays]), np.concatenate([s.events for s in stays]),
                        np.concatenate([s.y for s in stays]), np.concatenate([s.m for s in stays]),
                        np.zeros(starts[-1], bool))
    pieces = det.window_pieces(np.array(lengths), mode, window, context)
    got = det.cut_windows(blk, pieces[:, 0], pieces)
    for k in ("x", "y", "m", "group", "now", "length"):
        np.testing.assert_array_equal(getattr(got, k), getattr(ref, k), err_msg=k)
    assert pieces[:, 0].tolist() == ref.group.tolist()


def test_streamed_windows_equal_the_per_stay_reference_on_a_warehouse(small_wh):
    st = rd.feature_stats(small_wh)
    for mode, context in (("sliding", 12), ("stay", 0)):
        for label in det.LABEL_VARIANTS:
            ref = det.sequences(rd.stay_features(small_wh, "train", label, st), mode, 24, context)
            idx = rd.split_index(small_wh, "train", mode, 24, context)
            got = rd.load_windows(small_wh, idx, np.arange(idx.n_windows), st, label)
            for k in ("x", "y", "m", "group", "now", "length"):
                np.testing.assert_array_equal(getattr(got, k), getattr(ref, k), err_msg=f"{mode} {label} {k}")
            assert idx.scored_hours == int(ref.m.sum())
            # shards of 3 windows in a shuffled order: the same rows, reordered
            order = np.random.default_rng(0).permutation(idx.n_windows)
            parts = list(rd.iter_shards(small_wh, idx, order, st, label, shard=3))
            assert len(parts) == -(-idx.n_windows // 3)
            y = np.concatenate([p.scored(p.y) for p in parts])
            want = np.concatenate([ref.y[i][ref.m[i]] for i in order])
            np.testing.assert_array_equal(y, want)
    test = rd.split_index(small_wh, "test")
    a, b = test.sample_stays(3), test.sample_stays(3)
    assert a.stay_ids.tolist() == b.stay_ids.tolist() and a.stay_ids.size == 3
    assert set(a.pieces[:, 0]) <= {0, 1, 2} and test.sample_stays(None) is test
    assert test.sample_windows(2).n_windows == 2


def test_paired_cluster_bootstrap_equals_the_reference_and_the_single_model_helper():
    from evaluation.classification import auroc_auprc_with_ci

    rng = np.random.default_rng(1)
    g = np.repeat(np.arange(12), rng.integers(3, 25, 12))
    y = (rng.random(g.size) < 0.3).astype(np.int8)
    a = np.round(y + rng.normal(0, 1.0, g.size), 1)  # ties, within and across classes
    b = y + rng.normal(0, 2.0, g.size)
    now = (rng.random(g.size) < 0.5).astype(float)  # a binary score: two tie groups
    scores = {"a": a, "b": b, "a2": a.copy(), "now": now}
    pairs = [("a", "b"), ("a", "a2"), ("b", "now")]
    fast = paired_cluster_bootstrap(y, scores, g, pairs, n_boot=150, block_elems=64)
    slow = paired_cluster_bootstrap_reference(y, scores, g, pairs, n_boot=150)
    assert fast["n_boot_used"] == slow["n_boot_used"] and fast["n_groups"] == 12
    for k in scores:
        for q, v in slow["scores"][k].items():
            assert fast["scores"][k][q] == pytest.approx(v, abs=1e-12), (k, q)
    for p, d in slow["pairs"].items():
        for q, v in d.items():
            assert fast["pairs"][p][q] == pytest.approx(v, abs=1e-12), (p, q)
    ref = auroc_auprc_with_ci(y, a, n_boot=150, seed=0, groups=g)
    for k in ("auroc", "auroc_low", "auroc_high", "auprc", "auprc_low", "auprc_high"):
        assert fast["scores"]["a"][k] == pytest.approx(getattr(ref, k), abs=1e-12)
    same = fast["pairs"]["a - a2"]
    assert same["auroc_diff"] == same["auroc_diff_low"] == same["auroc_diff_high"] == 0.0
    # one positive stay among three: some resamples hold a single class (skipped, counted)
    g3, y3 = np.repeat([0, 1, 2], 4), np.repeat([1, 0, 0], 4)
    s3 = np.arange(12.0)
    f3 = paired_cluster_bootstrap(y3, {"s": s3}, g3, n_boot=60)
    r3 = paired_cluster_bootstrap_reference(y3, {"s": s3}, g3, n_boot=60)
    assert f3["n_boot_skipped"] == r3["n_boot_skipped"] > 0
    with pytest.raises(MetricError):
        paired_cluster_bootstrap(y, {"a": a}, g, [("a", "zz")], n_boot=5)
    with pytest.raises(MetricError):
        paired_cluster_bootstrap(np.zeros(4), {"a": np.arange(4.0)}, np.arange(4), n_boot=5)


def test_seeded_weights_ignore_other_threads_drawing_from_the_global_generator():
    """The cause of the irreproducible deterioration runs: ``torch.manual_seed`` + building a model
    draws from the process-wide generator, which the Prefect pool's other training thread seeds and
    draws from at the same time. Seeded weights come from a private generator instead."""
    import torch

    size = dict(dtr.DEFAULT_SIZE)
    quiet = {m: [p.detach().clone() for p in dtr.make_model(m, 12, 96, size, seed=0).parameters()]
             for m in dtr.MODELS}
    stop = threading.Event()

    def hammer():
        while not stop.is_set():
            torch.manual_seed(1)
            torch.rand(1000)

    t = threading.Thread(target=hammer)
    t.start()
    try:
        for _ in range(20):
            for m in dtr.MODELS:
                got = list(dtr.make_model(m, 12, 96, size, seed=0).parameters())
                assert all(torch.equal(a, b) for a, b in zip(got, quiet[m])), m
    finally:
        stop.set()
        t.join()
    other = list(dtr.make_model("lstm", 12, 96, size, seed=1).parameters())
    assert not torch.equal(other[0], quiet["lstm"][0])


def test_training_streams_bounded_shards_and_repeats_exactly(small_wh, monkeypatch):
    seen = []
    real = rd.load_windows

    def spy(warehouse, index, windows, *a, **k):
        seen.append(len(windows))
        return real(warehouse, index, windows, *a, **k)

    monkeypatch.setattr(rd, "load_windows", spy)
    data = dtr.study_data(small_wh, "sliding", 24, 12, "filled", val_windows=5, test_stays=2)
    assert data.val.n_windows == 5 and data.test.stay_ids.size == 2
    events = []
    kw = dict(size={"hidden": 4}, max_epochs=2, n_boot=50, train_windows=7, shard=3, return_predictions=True)
    with dtr.epoch_progress(events.append):
        r1 = dtr.train_and_test(data, "lstm", 0, **kw)
    assert seen and max(seen) <= 3  # never more than one shard of windows in memory
    assert r1["train_windows_per_epoch"] == 7 and [e["epoch"] for e in events] == list(range(1, r1["epochs"] + 1))
    assert all(np.isfinite(e["train_loss"]) and np.isfinite(e["val_loss"]) for e in events)
    assert min(e["val_loss"] for e in events) == pytest.approx(r1["best_val_loss"])
    first = len(seen)
    r2 = dtr.train_and_test(data, "lstm", 0, **kw)
    assert np.array_equal(r1["p_test"], r2["p_test"]) and r1["auroc"] == r2["auroc"]
    # the class weight's positive rate is read once per StudyData (the second fit skips that pass)
    # and equals the rate read in any other shard size (integer counts: exact)
    assert len(seen) - first < first
    assert data.train_positive_rate() == dtr.positive_rate(dtr.WindowReader(data, data.train, 2))
    assert len(events) == r1["epochs"]  # outside the block nothing is called
    tgt = dtr.scored_targets(data, shard=3)
    assert tgt["y"].shape == r1["p_test"].shape and r1["n_groups"] == 2


def test_the_epoch_event_splits_reading_rows_from_compute(small_wh, monkeypatch):
    """``read_s``: the seconds an epoch spent producing rows (the training shards and the validation
    pass), so the bench can split an epoch into reading (the same work for every model) and compute.
    A reader slowed by a known delay per shard shows it there and not in the rest of the epoch."""
    from evaluation.clinical import deterioration_bench as bench

    data = dtr.study_data(small_wh, "sliding", 24, 12, "filled", val_windows=5, test_stays=2)
    delay, calls = 0.15, []
    real = rd.load_windows

    def slow(*a, **k):
        calls.append(time.perf_counter())
        time.sleep(delay)
        return real(*a, **k)

    def epoch(patch: bool) -> tuple[float, dict]:
        events = []
        if patch:
            monkeypatch.setattr(rd, "load_windows", slow)
        with dtr.epoch_progress(lambda e: events.append((time.perf_counter(), e))):
            dtr.train_and_test(data, "lstm", 0, size={"hidden": 4}, max_epochs=1, n_boot=20, train_windows=7,
                               shard=3)
        monkeypatch.setattr(rd, "load_windows", real)
        return events[0]

    fast = epoch(False)[1]
    calls.clear()
    at, slowed = epoch(True)
    in_epoch = sum(1 for c in calls if at - slowed["elapsed_s"] - 1e-3 <= c <= at)  # shards read in the epoch
    assert in_epoch == 5  # 7 training windows and 5 validation windows, in shards of 3
    assert 0 <= fast["read_s"] <= fast["elapsed_s"]
    assert slowed["read_s"] >= delay * in_epoch
    # the delay lands in the reading, not the compute: compute less than the added delay
    assert slowed["elapsed_s"] - slowed["read_s"] < fast["elapsed_s"] - fast["read_s"] + delay
    # the bench's compute ratio is each round's (epoch - reading) over the first model's
    out = bench.bench(small_wh, ["lstm", "gru"], rounds=2, train_windows=6, n_boot=20, threads=[1])
    t, r = out["times_s"]["1"], out["read_s"]["1"]
    comp = {m: [a - b for a, b in zip(t[m], r[m])] for m in t}
    s = out["summary"]["1"]["gru"]
    assert s["compute_paired_ratio"] == bench.paired_ratio(comp["gru"], comp["lstm"])
    assert s["compute_median_s"] == statistics.median(comp["gru"]) and s["read_median_s"] == statistics.median(r["gru"])
    row = next(x for x in bench.markdown(out).splitlines() if x.startswith("| 1 | gru |"))
    assert f"| {s['read_median_s']:.2f} | {s['compute_paired_ratio']['median']:.2f}× (" in row


def _untimed(x):
    """x without its timing fields (``train_s_mean``)."""
    if isinstance(x, dict):
        return {k: _untimed(v) for k, v in x.items() if k != "train_s_mean"}
    return x


def _flow(dst, runs, **kw):
    from pipelines.flows.clinical_deterioration import deterioration_flow
    from pipelines.runtime import runner
    from pipelines.settings import DeteriorationSettings

    with runner.results_context(str(runs)):
        return deterioration_flow.with_options(task_runner=runner.make_task_runner(None, 2))(
            warehouse=str(dst), runs_dir=str(runs), progress=False, settings=DeteriorationSettings(**kw))


def test_flow_causal_protocol_baseline_paired_result_and_same_figures_twice(prefect_harness, small_wh, tmp_path):
    """Two runs on copies of the same warehouse (separate task caches), two models trained at once
    in the thread pool: every AUROC, interval and figure identical."""
    kw = dict(models=("lstm", "softmax"), seeds=2, max_epochs=1, n_boot=300, size={"hidden": 4, "d_model": 4,
              "heads": 1}, window=24, context=12, label="observed")
    res = []
    for i in (1, 2):
        runs = tmp_path / f"runs{i}"
        runs.mkdir()
        dst = runs / "warehouse.duckdb"
        shutil.copy(small_wh, dst)
        res.append(_flow(dst, runs, **kw))
    res1, res2 = res
    assert res1["figures"] == res2["figures"] and res1["tables"] == res2["tables"]
    assert _untimed(res1["metrics"]) == _untimed(res2["metrics"]) and res1["config"] == res2["config"]
    leak = rd.leakage_summary(small_wh)
    assert 0 <= leak["all"]["share"] < 0.5 and res1["metrics"]["backfill_leak_old_loader"]["all"]["share"] == \
        rd.leakage_summary(small_wh, label="observed")["all"]["share"]
    m = res1["metrics"]
    for mdl in ("lstm", "softmax"):
        assert m[mdl]["seeds"] == 2 and m[mdl]["auroc_sd"] >= 0
        assert m[mdl]["auroc_seedavg_low"] <= m[mdl]["auroc_seedavg"] <= m[mdl]["auroc_seedavg_high"]
    assert set(m["paired"]) == {"softmax - lstm", "softmax - event_now", "lstm - event_now"}
    assert m["paired"]["softmax - lstm"]["per_seed_seeds"] == 2
    assert 0.0 <= m["event_now"]["auroc"] <= 1.0 and m["label"] == "observed"
    assert m["bootstrap"]["n_boot_used"] + m["bootstrap"]["n_boot_skipped"] == 300
    roc, fig = res1["figures"]
    assert fig["categories"][-1].startswith("event now")
    assert all(lo <= v <= hi for lo, v, hi in zip(fig["ci_low"], fig["values"], fig["ci_high"]))
    # the ROC curves: one per model and the baseline, on the fixed 101-point FPR grid, non-decreasing, 0 -> 1
    assert roc["kind"] == "line" and [s["label"].split(":")[0] for s in roc["series"]] == fig["categories"]
    for s, auroc in zip(roc["series"], fig["values"]):
        assert len(s["x"]) == len(s["y"]) == 101 and s["x"][0] == 0.0 and s["x"][-1] == 1.0 and s["y"][-1] == 1.0
        assert all(a <= b for a, b in zip(s["y"], s["y"][1:])) and f"{auroc:.3f}" in s["label"]
    stored = json.loads((tmp_path / "runs1" / "deterioration" / "result.json").read_text())
    cfg = stored["config"]
    assert cfg["protocol"] == det.PROTOCOL and cfg["training"] == dtr.TRAINING and "stay_id" not in json.dumps(stored)
    assert cfg["caps"] == {**dtr.CAPS["cpu"], "seeds": 2, "max_epochs": 1} and cfg["device"] == "cpu"
    assert cfg["caps_default"] == dtr.caps_text("cpu") and cfg["n_boot"] == 300


def test_caps_are_resolved_per_device_and_stated_in_the_help():
    import argparse

    from pipelines.flows.clinical_deterioration import add_cli, resolve_caps

    assert resolve_caps("cpu") == dtr.CAPS["cpu"]
    assert resolve_caps("cuda", test_stays=0, train_windows=10)["test_stays"] is None
    assert resolve_caps("cpu", train_windows=10)["train_windows"] == 10
    for bad in (dict(device="tpu"), dict(device="cpu", val_windows=-1)):
        with pytest.raises(det.DeteriorationInputError):
            resolve_caps(**bad)
    sub = argparse.ArgumentParser().add_subparsers()
    add_cli(sub)
    helptext = " ".join(sub.choices["deterioration"].format_help().split())
    for device, c in dtr.CAPS.items():
        for key in ("train_windows", "val_windows", "test_stays", "tabular_windows", "max_epochs", "seeds"):
            v = "all" if c[key] is None else f"{c[key]:,}"
            assert f"{v} on {device}" in helptext, (key, device)


def test_epoch_bench_interleaves_models_and_repeats_the_auroc(small_wh, tmp_path):
    from evaluation.clinical import deterioration_bench as bench

    out = bench.bench(small_wh, ["lstm", "softmax"], rounds=2, train_windows=6, n_boot=20, threads=[1, 2])
    assert out["threads"] == [1, 2]
    for t in ("1", "2"):
        for m in ("lstm", "softmax"):
            assert len(out["times_s"][t][m]) == 2 and min(out["times_s"][t][m]) > 0
            assert len(out["summary"][t][m]["distinct_auroc"]) == 1  # same seed, same data: same AUROC each round
        assert out["summary"][t]["lstm"]["ratio_to_lstm"] == 1.0 == out["summary"][t]["lstm"]["cpu_ratio_to_lstm"]
        assert min(out["cpu_s"][t]["softmax"]) > 0
    assert out["train_windows"] == 6
    lines = bench.table(out, ["lstm", "softmax"])
    assert len(lines) == 5 and lines[1].split()[:2] == ["1", "lstm"] and lines[4].split()[:2] == ["2", "softmax"]
    assert bench.main(["--warehouse", small_wh, "--models", "lstm", "--rounds", "1", "--train-windows", "4",
                       "--threads", "1", "--json", str(tmp_path / "b.json")]) == 0
    b = json.loads((tmp_path / "b.json").read_text())
    assert b["rounds"] == 1 and b["threads"] == [1] and list(b["summary"]) == ["1"]
    # the README block is rendered from the result file, between its markers only
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{bench.BEGIN}\nold\n{bench.END}\noutro\n")
    assert bench.main(["--table", str(tmp_path / "b.json"), "--readme", str(readme)]) == 0
    doc = readme.read_text()
    s = b["summary"]["1"]["lstm"]
    assert doc.startswith("intro\n") and doc.endswith("outro\n") and "old" not in doc
    assert f"| 1 | lstm | {s['median_s']:.2f} ({s['min_s']:.2f}–{s['max_s']:.2f}) | 1.00× |" in doc
    assert bench.markdown(b) in doc and "1 interleaved rounds" in doc
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit):
        bench.main(["--table", str(tmp_path / "b.json"), "--readme", str(readme)])
    assert readme.read_text() == "no markers\n"


def test_readme_epoch_table_is_the_rendering_of_its_result():
    from doc_blocks import assert_block_renders

    from evaluation.clinical import deterioration_bench as bench

    sizes = assert_block_renders(bench.README_RESULT, bench.BEGIN, bench.END, bench.markdown).get("sizes")
    if sizes:  # the study's size is the SV row the size overrides stand beside
        assert sizes["sv_attention"] == dtr.DEFAULT_SIZE


def test_sv_attention_training_repeats_exactly_at_each_thread_count(small_wh):
    """Same seed, same data, same thread count: the same test predictions bit for bit for the SV
    attention model (its gate's compiled FISTA / KKT loops split problems over threads, each
    computed by the same loop), and the gate really ran (prefixes above the warm-up size)."""
    data = dtr.study_data(small_wh, "sliding", 24, 12, "filled", val_windows=5, test_stays=2)
    assert data.max_len > dtr.DEFAULT_SIZE["chunk"]  # a row past the first chunk: the gate is solved
    for t in (1, 2):
        runs = [dtr.train_and_test(data, "sv_attention", 0, max_epochs=1, n_boot=20, train_windows=8, threads=t,
                                   return_predictions=True) for _ in range(2)]
        assert np.array_equal(runs[0]["p_test"], runs[1]["p_test"]), t
        assert runs[0]["auroc"] == runs[1]["auroc"] and runs[0]["auprc"] == runs[1]["auprc"]


def test_epoch_bench_model_specs_time_a_size_beside_the_default(small_wh, monkeypatch):
    """``NAME:KEY=VALUE`` times a size override beside the study's size (its full size recorded);
    a malformed entry is a one-line usage error before any training."""
    from evaluation.clinical import deterioration_bench as bench

    # the per-round ratio: the median of each round's ratio, not the ratio of the medians
    assert bench.paired_ratio([2.0, 4.0, 6.0], [1.0, 4.0, 3.0]) == {"median": 2.0, "min": 1.0, "max": 2.0}
    assert bench.model_spec("sv_attention") == ("sv_attention", {})
    assert bench.model_spec("sv_attention:chunk=4,C=0.5") == ("sv_attention", {"chunk": 4, "C": 0.5})
    for bad in ("svm", "sv_attention:", "sv_attention:chunk", "sv_attention:chunks=4", "sv_attention:chunk=4.5",
                "sv_attention:chunk=0", "sv_attention:C=nan", "softmax:d_model=x"):
        with pytest.raises(bench.ModelSpecError):
            bench.model_spec(bad)
    for argv in (["--models", "softmax", "sv_attention:chunk=0"], ["--models", "softmax", "softmax"]):
        with pytest.raises(SystemExit):
            bench.main(["--warehouse", small_wh, *argv])
    built = []
    make = dtr.make_model
    monkeypatch.setattr(dtr, "make_model", lambda name, nf, ml, size, seed=None: (
        built.append((name, size["chunk"])), make(name, nf, ml, size, seed))[1])
    models = ["sv_attention", "sv_attention:chunk=4"]
    out = bench.bench(small_wh, models, rounds=1, train_windows=6, n_boot=20, threads=[1])
    assert out["sizes"]["sv_attention"] == dtr.DEFAULT_SIZE
    assert out["sizes"]["sv_attention:chunk=4"] == {**dtr.DEFAULT_SIZE, "chunk": 4}
    s = out["summary"]["1"]
    assert s["sv_attention"]["ratio_to_sv_attention"] == 1.0 and s["sv_attention:chunk=4"]["median_s"] > 0
    assert s["sv_attention:chunk=4"]["paired_ratio"]["median"] == (
        out["times_s"]["1"]["sv_attention:chunk=4"][0] / out["times_s"]["1"]["sv_attention"][0])
    assert sorted(set(built)) == [("sv_attention", 4), ("sv_attention", dtr.DEFAULT_SIZE["chunk"])]
    # a different gate chunk is a different model: its test AUROC is its own (same seed, same data)
    again = bench.bench(small_wh, ["sv_attention:chunk=4"], rounds=1, train_windows=6, n_boot=20, threads=[1])
    assert again["aurocs"]["1"]["sv_attention:chunk=4"] == out["aurocs"]["1"]["sv_attention:chunk=4"]
    lines = bench.table(out, models)
    assert lines[2].split()[:2] == ["1", "sv_attention:chunk=4"]
    assert "| 1 | sv_attention:chunk=4 |" in bench.markdown(out)
