"""``forgetful deterioration``: per-hour prediction of a composite event within the next 6 hours.

LSTM vs causal softmax attention vs causal SV-hybrid attention (chunk-frozen gate, batched
training path), each trained with several seeds (one Prefect task per model × seed) on the
``train`` split, early-stopped on ``val``, scored on ``test``, beside a trivial "event now"
baseline (the current hour's event flag). Causal features (forward fill + training median), sliding
48-h blocks read after 48 h of carried context (or whole stays, ``--mode stay``); labels on
filled values (default) or observed-only (``--label observed``). See :mod:`pipelines.deterioration`.

Evaluation: per seed, AUROC/AUPRC with a stay-clustered bootstrap CI; across seeds, the mean and
seed-level SD; the seed-averaged predictions of every model and the baseline are scored on ONE
set of stay-clustered resamples, which gives each a real interval (plotted) and the paired
differences between models. Defaults are small: on the demo (3 models × 3 seeds, at most 12
epochs) this step took 3.0 min at load 4-11 and 5.2 min at load 9-13 on 2 shared cores (measured
2026-12-01 inside run-all; SV attention trains 5-10x longer than the others).

Progress: one bar over every model × seed × epoch, its label the latest epoch's model, seed, train
and validation loss and the seconds that model has trained; one line per trained model × seed
(epochs, best validation loss, test AUROC, seconds). ``-q`` / ``--no-progress`` hide both.
"""
from __future__ import annotations

import itertools
import sys
import threading
import time

import numpy as np
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from pipelines import deterioration as det
from pipelines import jsonout, runner, study_inputs, task_cache
from pipelines import warehouse as wh

SEED_TEXT = "seed 001 §5: AUROC 0.696 (SV-attention) vs 0.783 (LSTM) vs 0.751 (softmax)"
LABELS = {"lstm": "LSTM", "softmax": "causal softmax", "sv_attention": "causal SV attention",
          "event_now": "event now (trivial baseline)"}
BASELINE = "event_now"


@task(name="deterioration-train", cache_policy=NO_CACHE, persist_result=False,
      retries=2, retry_delay_seconds=runner.IO_RETRY_DELAYS, retry_condition_fn=runner.retry_transient_io)
@task_cache.cached
def train_task(warehouse: str, content_hash: str, model: str, seed: int, window: int, size: dict,
               max_epochs: int, n_boot: int, mode: str = "sliding", context: int = 48, label: str = "filled",
               protocol: str = det.PROTOCOL) -> dict:
    stats = det.feature_stats(warehouse)
    data = {s: det.load_split(warehouse, s, window, mode=mode, context=context, label=label, stats=stats)
            for s in ("train", "val", "test")}
    return det.train_and_test(data["train"], data["val"], data["test"], model, seed, window=window, size=size,
                              max_epochs=max_epochs, n_boot=n_boot, return_predictions=True)


def aggregate(runs: list[dict], models: list[str]) -> dict:
    """Per model over seeds: mean and seed-level SD of AUROC/AUPRC, and (legacy key) the mean of
    the per-seed CI bounds — not an interval; the real one is ``auroc_seedavg_low/high``."""
    out = {}
    for m in models:
        rs = [r for r in runs if r["model"] == m]
        au = np.array([r["auroc"] for r in rs])
        ap = np.array([r["auprc"] for r in rs])
        sd = (lambda a: float(a.std(ddof=1)) if len(a) > 1 else 0.0)
        out[m] = {"auroc_mean": float(au.mean()), "auroc_sd": sd(au), "auprc_mean": float(ap.mean()),
                  "auprc_sd": sd(ap), "auroc_ci_low_mean": float(np.mean([r["auroc_low"] for r in rs])),
                  "auroc_ci_high_mean": float(np.mean([r["auroc_high"] for r in rs])), "seeds": len(rs),
                  "epochs_mean": float(np.mean([r["epochs"] for r in rs])), "n_params": rs[0]["n_params"],
                  "train_s_mean": float(np.mean([r["train_s"] for r in rs]))}
    return out


def seed_paired(runs: list[dict], pairs, y: np.ndarray) -> dict:
    """Per-seed paired differences (same seed index, same test hours): mean and seed-level SD."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    by = {(r["model"], r["seed"]): np.asarray(r["p_test"], dtype=np.float64) for r in runs}
    seeds = sorted({r["seed"] for r in runs})
    out = {}
    for a, b in pairs:
        da = [roc_auc_score(y, by[a, s]) - roc_auc_score(y, by[b, s]) for s in seeds if (a, s) in by and (b, s) in by]
        dp = [average_precision_score(y, by[a, s]) - average_precision_score(y, by[b, s])
              for s in seeds if (a, s) in by and (b, s) in by]
        sd = (lambda v: float(np.std(v, ddof=1)) if len(v) > 1 else 0.0)
        out[f"{a} - {b}"] = {"auroc_diff_mean": float(np.mean(da)), "auroc_diff_sd": sd(da),
                             "auprc_diff_mean": float(np.mean(dp)), "auprc_diff_sd": sd(dp), "seeds": len(da)}
    return out


def train_with_progress(futures: list, jobs: list[tuple[str, int]], max_epochs: int, progress: bool) -> list[dict]:
    """The results of the training ``futures`` (one per ``(model, seed)`` of ``jobs``), in order,
    with a per-epoch progress bar and one line per finished model × seed on stderr (see the module
    docstring). Epochs trained in another process (a Dask worker) are not seen: the bar then
    moves when a model × seed finishes."""
    from prefect.futures import as_completed
    from tqdm.auto import tqdm

    bar = tqdm(total=len(futures) * max_epochs, desc="deterioration (epochs)", unit="epoch", disable=not progress,
               file=sys.stderr, leave=False)
    seen: dict[tuple[str, int], int] = {}
    lock = threading.Lock()

    def on_epoch(ev: dict) -> None:
        with lock:
            seen[ev["model"], ev["seed"]] = ev["epoch"]
            bar.update(1)
            bar.set_postfix_str(f"{LABELS.get(ev['model'], ev['model'])} seed {ev['seed']} epoch {ev['epoch']}/"
                                f"{ev['max_epochs']}: loss {ev['train_loss']:.3f}, val {ev['val_loss']:.3f}, "
                                f"{ev['elapsed_s']:.0f} s", refresh=True)

    index = {id(f): job for f, job in zip(futures, jobs)}
    local = _tasks_run_in_this_process()
    with det.epoch_progress(on_epoch if progress else None):
        for f in as_completed(futures):
            r = f.result()
            model, seed = index[id(f)]
            with lock:
                trained_here = (model, seed) in seen
                bar.update(max(0, max_epochs - seen.get((model, seed), 0)))  # early stop, or not seen here
                seen[model, seed] = max_epochs
            if progress:
                cached = local and not trained_here
                how = f"from the task cache; trained in {r['train_s']:.0f} s then" if cached else \
                    f"trained in {r['train_s']:.0f} s"
                bar.write(f"  {LABELS.get(model, model)} seed {seed}: {r['epochs']} epochs, best val loss "
                          f"{r['best_val_loss']:.3f}, test AUROC {r['auroc']:.3f} ({how})", file=sys.stderr)
    bar.close()
    return [f.result() for f in futures]


def _tasks_run_in_this_process() -> bool:
    """The current flow's tasks run in this process (a thread pool), not on Dask workers."""
    try:
        from prefect.context import FlowRunContext

        ctx = FlowRunContext.get()
        return ctx is None or "Dask" not in type(ctx.task_runner).__name__
    except Exception:  # noqa: BLE001 - no context: the flow function was called directly
        return True


def roc_figure(y: np.ndarray, scores: dict[str, np.ndarray], keys: list[str], boot: dict,
               n_points: int = 101) -> dict:
    """Line-figure spec of the test ROC curves of ``keys`` (seed-averaged predictions and the
    baseline), each on a fixed ``n_points`` false-positive-rate grid (an aggregate: no score or
    label of any hour is stored), labelled with its AUROC and stay-clustered 95 % interval."""
    from evaluation.metrics import roc_curve_points

    series = []
    for k in keys:
        c = roc_curve_points(y, scores[k], n_points=n_points)
        s = boot["scores"][k]
        series.append({"label": f"{LABELS[k]}: {s['auroc']:.3f} [{s['auroc_low']:.3f}, {s['auroc_high']:.3f}]",
                       "x": c["fpr"], "y": c["tpr"], "style": "line"})
    return {"kind": "line", "title": "test ROC of the seed-averaged predictions (legend: AUROC, 95% stay-clustered "
                                     "interval)", "xlabel": "false-positive rate", "ylabel": "true-positive rate",
            "diagonal": True, "series": series}


def _pairs(models: list[str]) -> list[tuple[str, str]]:
    order = [m for m in ("sv_attention", "softmax", "lstm") if m in models] + [m for m in models
                                                                             if m not in det.MODELS]
    return list(itertools.combinations(order, 2)) + [(m, BASELINE) for m in order]


@flow(name="deterioration", log_prints=True)
@runner.warehouse_locked
def deterioration_flow(warehouse: str = "runs/warehouse.duckdb", runs_dir: str = "runs",
                       models: tuple[str, ...] = det.MODELS, seeds: int = 3, window: int = 48,
                       max_epochs: int = 12, n_boot: int = 500, size: dict | None = None,
                       progress: bool = True, mode: str = "sliding", context: int = 48,
                       label: str = "filled") -> dict:
    t0 = time.perf_counter()
    wh.require(warehouse)
    if mode not in det.SEQUENCE_MODES or label not in det.LABEL_VARIANTS:
        raise det.StudyInputError(f"mode must be one of {det.SEQUENCE_MODES} and label one of {det.LABEL_VARIANTS}")
    # fail before any training: every split is needed (fit, early stopping, scoring) and AUROC needs events
    study_inputs.require_splits(warehouse, "deterioration", {"train": 1, "val": 1, "test": 1})
    study_inputs.require_event_stays(warehouse, "deterioration", "event_composite", 1, split="test",
                                     what="an event hour (AUROC/AUPRC need both classes)")
    h = wh.content_hash(warehouse)
    size = {**det.DEFAULT_SIZE, **(size or {})}
    names = list(models)
    jobs = [(m, s) for s in range(seeds) for m in names]
    futures = [train_task.submit(warehouse, h, m, s, window, size, max_epochs, n_boot, mode, context, label)
               for m, s in jobs]
    runs = train_with_progress(futures, jobs, max_epochs, progress)
    agg = aggregate(runs, names)

    # the test hours in scoring order (identical for every model: same loader, same protocol)
    test = det.load_split(warehouse, "test", window, mode=mode, context=context, label=label)
    y = test.scored(test.y).astype(np.int8)
    groups = test.scored(np.broadcast_to(test.group[:, None], test.m.shape))
    scores = {m: np.mean([np.asarray(r["p_test"], dtype=np.float64) for r in runs if r["model"] == m], axis=0)
              for m in names}
    if any(s.shape != y.shape for s in scores.values()):
        raise det.StudyInputError("cached predictions do not match the test hours; clear the task cache")
    assert test.now is not None
    scores[BASELINE] = test.scored(test.now).astype(np.float64)
    pairs = _pairs(names)
    boot = det.paired_cluster_bootstrap(y, scores, groups, pairs, n_boot=n_boot, seed=0)
    per_seed = seed_paired(runs, [p for p in pairs if BASELINE not in p], y)
    for p, v in per_seed.items():
        boot["pairs"][p].update({"per_seed_" + k: x for k, x in v.items()})
    for m in names:
        s = boot["scores"][m]
        agg[m].update({"auroc_seedavg": s["auroc"], "auroc_seedavg_low": s["auroc_low"],
                       "auroc_seedavg_high": s["auroc_high"], "auprc_seedavg": s["auprc"],
                       "auprc_seedavg_low": s["auprc_low"], "auprc_seedavg_high": s["auprc_high"]})
    leak = det.leakage_summary(warehouse, label=label)

    first = runs[0]
    rows = [[LABELS[r["model"]], r["seed"], r["auroc"], r["auroc_low"], r["auroc_high"], r["auprc"],
             r["auprc_low"], r["auprc_high"], r["epochs"]] for r in runs]
    summary = [[LABELS[m], agg[m]["seeds"], agg[m]["auroc_mean"], agg[m]["auroc_sd"], agg[m]["auprc_mean"],
                agg[m]["auprc_sd"], boot["scores"][m]["auroc"], boot["scores"][m]["auroc_low"],
                boot["scores"][m]["auroc_high"], boot["scores"][m]["auprc"], boot["scores"][m]["auprc_low"],
                boot["scores"][m]["auprc_high"]] for m in names]
    b = boot["scores"][BASELINE]
    summary.append([LABELS[BASELINE], 0, b["auroc"], 0.0, b["auprc"], 0.0, b["auroc"], b["auroc_low"],
                    b["auroc_high"], b["auprc"], b["auprc_low"], b["auprc_high"]])
    paired_rows = [[f"{LABELS[a]} − {LABELS[bb]}", v["auroc_diff"], v["auroc_diff_low"], v["auroc_diff_high"],
                    v["auprc_diff"], v["auprc_diff_low"], v["auprc_diff_high"],
                    v.get("per_seed_auroc_diff_mean"), v.get("per_seed_auroc_diff_sd")]
                   for (a, bb), v in zip(pairs, boot["pairs"].values())]
    cats = [LABELS[m] for m in names] + [LABELS[BASELINE]]
    keys = names + [BASELINE]
    result = {
        "study": "deterioration",
        "title": f"Deterioration prediction, next 6 h ({wh.data_kind(warehouse)})",
        "data": wh.data_kind(warehouse),
        "runtime_s": time.perf_counter() - t0,
        "seed_figure": {"text": SEED_TEXT},
        "metrics": {**{m: agg[m] for m in names}, "test_hours": first["n"], "test_positives": first["n_pos"],
                    "test_prevalence": first["prevalence"], "test_stays": first["n_groups"],
                    BASELINE: boot["scores"][BASELINE], "paired": boot["pairs"],
                    "bootstrap": {k: boot[k] for k in ("n", "n_pos", "n_groups", "n_boot_used", "n_boot_skipped",
                                                       "level", "seed")},
                    "backfill_leak_old_loader": leak, "label": label, "mode": mode},
        "tables": [
            {"title": "test AUROC / AUPRC: mean ± seed SD, and the seed-averaged predictions with a 95% "
                      "stay-clustered bootstrap interval",
             "columns": ["model", "seeds", "AUROC mean", "AUROC seed SD", "AUPRC mean", "AUPRC seed SD",
                         "AUROC (seed-avg)", "low", "high", "AUPRC (seed-avg)", "low", "high"], "rows": summary},
            {"title": "paired differences (seed-averaged predictions, same stay-clustered resamples, 95%) and the "
                      "per-seed paired AUROC difference (mean, SD)",
             "columns": ["a − b", "ΔAUROC", "low", "high", "ΔAUPRC", "low", "high", "ΔAUROC per-seed mean",
                         "per-seed SD"], "rows": paired_rows},
            {"title": "test AUROC / AUPRC per model and seed (95% stay-clustered bootstrap)",
             "columns": ["model", "seed", "AUROC", "low", "high", "AUPRC", "low", "high", "epochs"],
             "rows": rows},
            {"title": "old loader (warehouse _z, forward+back fill): scored hours fed a value from a later hour",
             "columns": ["split", "scored hours", "back-filled hours", "share"],
             "rows": [[k, v["scored_hours"], v["backfilled_hours"], v["share"]] for k, v in leak.items()]},
        ],
        "figures": [roc_figure(y, scores, keys, boot),
                    {"kind": "bar", "title": "test AUROC of the seed-averaged predictions (bars: 95% stay-clustered "
                                             "bootstrap interval)", "ylabel": "AUROC",
                     "categories": cats, "values": [boot["scores"][k]["auroc"] for k in keys],
                     "ci_low": [boot["scores"][k]["auroc_low"] for k in keys],
                     "ci_high": [boot["scores"][k]["auroc_high"] for k in keys]}],
        "config": {"horizon_h": det.HORIZON, "window_h": window, "context_h": context if mode == "sliding" else None,
                   "mode": mode, "protocol": det.PROTOCOL,
                   "sequences": ("sliding blocks of window scored hours, each read after up to context preceding "
                                 "hours of the same stay" if mode == "sliding" else "whole-stay sequences"),
                   "features": "6 causal z-scored vitals (forward fill of observed values; training-split median "
                               "before the first measurement; warehouse standardisation) + 6 observed flags",
                   "label": label, "label_definition": det.LABEL_TEXT[label],
                   "baseline": "event now: score = the current hour's event flag (same label definition)",
                   "seeds": seeds, "max_epochs": max_epochs, "early_stopping": "val BCE, patience 3",
                   "n_boot": n_boot, "size": size, "sv_gate_path": "batched FISTA + 1e-3 ridge (training path)"},
    }
    runner.write_study_result(result, runs_dir)
    return result


@runner.cli_errors
def _main(args) -> int:
    r = runner.run_cli_flow(deterioration_flow, args, warehouse=args.warehouse, runs_dir=args.runs,
                            seeds=args.seeds, window=args.window, max_epochs=args.max_epochs, n_boot=args.n_boot,
                            mode=args.mode, context=args.context, label=args.label,
                            progress=not args.no_progress)
    m = r["metrics"]
    print(f"deterioration: test {m['test_hours']} hours, {m['test_stays']} stays, prevalence {m['test_prevalence']:.3f}"
          f" (label {m['label']}, {m['mode']})")
    for k in det.MODELS:
        if k in m:
            print(f"  {LABELS[k]:<28} AUROC {m[k]['auroc_mean']:.3f} ± {m[k]['auroc_sd']:.3f}  "
                  f"AUPRC {m[k]['auprc_mean']:.3f} ± {m[k]['auprc_sd']:.3f}  ({m[k]['seeds']} seeds)")
    b = m[BASELINE]
    print(f"  {LABELS[BASELINE]:<28} AUROC {b['auroc']:.3f}  AUPRC {b['auprc']:.3f}")
    for p, v in m["paired"].items():
        print(f"  {p:<28} ΔAUROC {v['auroc_diff']:+.3f} [{v['auroc_diff_low']:+.3f}, {v['auroc_diff_high']:+.3f}]")
    print(f"  seed figure: {SEED_TEXT}")
    print(f"  runtime {r['runtime_s']:.1f}s{runner.cache_note(r)}")
    jsonout.emit(args, r)
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("deterioration", help="predict a composite event within 6 h: LSTM vs softmax vs SV attention",
                       description=__doc__)
    p.add_argument("--seeds", type=int, default=3, help="training seeds per model (default %(default)s)")
    p.add_argument("--window", type=int, default=48, help="scored hours per sliding block (default 48)")
    p.add_argument("--context", type=int, default=48,
                   help="carried context: preceding hours read before each block (default 48; 0 = disjoint windows)")
    p.add_argument("--mode", choices=det.SEQUENCE_MODES, default="sliding",
                   help="sliding blocks with carried context (default) or whole-stay sequences")
    p.add_argument("--label", choices=det.LABEL_VARIANTS, default="filled",
                   help="event definition: filled values (default, the warehouse's) or observed-only")
    p.add_argument("--max-epochs", type=int, default=12,
                   help="epoch cap; early stopping on val BCE (default %(default)s)")
    p.add_argument("--n-boot", type=int, default=500, help="stay-clustered bootstrap resamples (default %(default)s)")
    runner.add_common_args(p)
    jsonout.add_json_arg(p)
    p.set_defaults(func=_main)
