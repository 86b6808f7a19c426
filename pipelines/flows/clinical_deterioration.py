"""``forgetful deterioration``: per-hour prediction of a composite event within the next 6 hours.

Causal SV-hybrid attention (chunk-frozen gate, batched training path) beside the strongest peers of
hourly ICU benchmarks: LSTM, GRU, causal softmax attention and LightGBM on causal summary features
of the same rows (``--models``, default all five), each trained with several seeds (one Prefect task
per model × seed) on the ``train`` split, early-stopped on ``val``, scored on ``test``, beside a
trivial "event now" baseline. Causal features, sliding 48-h blocks after 48 h of carried context
(or whole stays, ``--mode stay``); labels on filled values (default) or observed-only (``--label
observed``). Training streams shards of windows within per-device caps (``--device``,
``--train-windows``, ``--val-windows``, ``--test-stays``, ``--tabular-windows``; 0 = no cap; the caps
used are in the result's config). The result names the winner with its paired, stay-clustered
differences against every other model. Study logic: :mod:`evaluation.clinical.deterioration`;
this module wires it.
"""
from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, replace

import numpy as np
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from dashboards.seed_figures import seed_field, seed_line
from evaluation.clinical import deterioration as det
from evaluation.clinical import deterioration_reader as rd
from evaluation.clinical import deterioration_training as dtr
from evaluation.clinical.deterioration_results import (
    BASELINE,
    LABELS,
    TRAINED_TOLERANCE,
    aggregate,
    comparison_pairs,
    deterioration_claims,
    roc_figure,
    seed_paired,
    winner,
)
from evaluation.cluster_bootstrap import paired_cluster_bootstrap
from pipelines import jsonout, study_inputs
from pipelines.runtime import runner, task_cache
from pipelines.settings import COUNT, COUNT0, DeteriorationSettings
from pipelines.store import warehouse as wh


@dataclass(frozen=True)
class TrainSpec:
    """What one model × seed's training needs besides the model and seed (the train task's
    settings, part of its cache key): sequence layout, the model's own size keys
    (:func:`~evaluation.clinical.deterioration_models.model_size`), caps, device and protocol."""

    window: int
    size: dict
    max_epochs: int
    n_boot: int
    mode: str = "sliding"
    context: int = 48
    label: str = "filled"
    protocol: str = det.PROTOCOL
    caps: dict | None = None
    device: str = "cpu"
    training: str = dtr.TRAINING


@task(name="deterioration-train", cache_policy=NO_CACHE, persist_result=False,
      retries=2, retry_delay_seconds=runner.IO_RETRY_DELAYS, retry_condition_fn=runner.retry_transient_io)
@task_cache.cached
def train_task(warehouse: str, content_hash: str, model: str, seed: int, spec: TrainSpec) -> dict:
    caps = spec.caps or {}
    data = dtr.study_data(warehouse, spec.mode, spec.window, spec.context, spec.label, caps.get("val_windows"),
                          caps.get("test_stays"))
    if model in det.TABULAR_MODELS:
        from evaluation.clinical import tabular_peers

        return tabular_peers.train_and_test(data, seed, train_windows=caps.get("tabular_windows"),
                                            n_boot=spec.n_boot, return_predictions=True)
    return dtr.train_and_test(data, model, seed, size=spec.size, max_epochs=spec.max_epochs, n_boot=spec.n_boot,
                              train_windows=caps.get("train_windows"), device=spec.device, return_predictions=True)


def resolve_caps(device: str, **given: int | None) -> dict:
    """The caps of a run: ``given`` values (0 = no cap) over the device's defaults (:data:`dtr.CAPS`)."""
    if device not in dtr.DEVICES:
        raise det.DeteriorationInputError(f"unknown device {device!r}; choose from {dtr.DEVICES}")
    out = dict(dtr.CAPS[device])
    for k, v in given.items():
        if v is not None:
            if v < 0:
                raise det.DeteriorationInputError(f"{k} must be >= 0 (0 = no cap); got {v}")
            out[k] = None if v == 0 else int(v)
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
    with dtr.epoch_progress(on_epoch if progress else None):
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
                unit = "boosting rounds" if model in det.TABULAR_MODELS else "epochs"
                bar.write(f"  {LABELS.get(model, model)} seed {seed}: {r['epochs']} {unit}, best val loss "
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


@flow(name="deterioration", log_prints=True)
@runner.warehouse_locked
def deterioration_flow(warehouse: str = "runs/warehouse.duckdb", runs_dir: str = "runs",
                       settings: DeteriorationSettings = DeteriorationSettings(), progress: bool = True) -> dict:
    """``settings.seeds``, ``max_epochs`` and the window / stay caps default to the device's caps
    (:data:`evaluation.clinical.deterioration_training.CAPS`); 0 = no cap.

    Evaluation: per seed, AUROC/AUPRC with a stay-clustered bootstrap CI; across seeds, the mean and
    seed-level SD; the seed-averaged predictions of every model and the baseline are scored on ONE
    set of stay-clustered resamples (``n_boot``), which gives each a real interval (plotted) and the
    paired differences between models, as YAIB reports its benchmark (AUROC and AUPRC, mean ± SD over
    seeds). The winner (the highest seed-averaged AUROC) is stated with its paired differences against
    every other model (``metrics.winner``, ``metrics.headline``, and a claim after the paper's that
    holds when its paired interval against the runner-up lies above 0). Same seed and data → same
    figures (:func:`evaluation.clinical.deterioration_training.deterministic_torch`).

    Progress: one bar over every model × seed × epoch, its label the latest epoch's model, seed, train
    and validation loss and the seconds that model has trained; one line per trained model × seed.
    """
    st = settings
    models = det.MODELS if st.models is None else tuple(st.models)
    seeds, window, max_epochs, n_boot = st.seeds, st.window, st.max_epochs, st.n_boot
    size, mode, context, label, device = st.size, st.mode, st.context, st.label, st.device
    t0 = time.perf_counter()
    wh.require(warehouse)
    if mode not in det.SEQUENCE_MODES or label not in det.LABEL_VARIANTS:
        raise det.DeteriorationInputError(
            f"mode must be one of {det.SEQUENCE_MODES} and label one of {det.LABEL_VARIANTS}")
    unknown = [m for m in models if m not in det.MODELS]
    if unknown or not models or len(set(models)) != len(models):
        raise det.DeteriorationInputError(f"models must be distinct names from {det.MODELS}; got {list(models)}")
    caps = resolve_caps(device, train_windows=st.train_windows, val_windows=st.val_windows, test_stays=st.test_stays,
                        tabular_windows=st.tabular_windows)
    seeds = caps["seeds"] if seeds is None else seeds
    max_epochs = caps["max_epochs"] if max_epochs is None else max_epochs
    caps.update(seeds=seeds, max_epochs=max_epochs)
    window_caps = {k: caps[k] for k in ("train_windows", "val_windows", "test_stays", "tabular_windows")}
    # fail before any training: every split is needed (fit, early stopping, scoring) and AUROC needs events
    study_inputs.require_splits(warehouse, "deterioration", {"train": 1, "val": 1, "test": 1})
    study_inputs.require_event_stays(warehouse, "deterioration", "event_composite", 1, split="test",
                                     what="an event hour (AUROC/AUPRC need both classes)")
    h = wh.content_hash(warehouse)
    size = {**dtr.DEFAULT_SIZE, **(size or {})}
    names = list(models)
    jobs = [(m, s) for s in range(seeds) for m in names]
    spec = TrainSpec(window, size, max_epochs, n_boot, mode, context, label, det.PROTOCOL, window_caps, device)
    # each task's key holds only its model's size keys: a changed SV gate re-trains no peer
    futures = [train_task.submit(warehouse, h, m, s, replace(spec, size=dtr.model_size(m, size))) for m, s in jobs]
    runs = train_with_progress(futures, jobs, max_epochs, progress)
    agg = aggregate(runs, names)

    # the test hours in scoring order (identical for every model: same reader, same protocol, same sample)
    data = dtr.study_data(warehouse, mode, window, context, label, window_caps["val_windows"],
                          window_caps["test_stays"])
    tgt = dtr.scored_targets(data)
    y, groups = tgt["y"], tgt["groups"]
    scores = {m: np.mean([np.asarray(r["p_test"], dtype=np.float64) for r in runs if r["model"] == m], axis=0)
              for m in names}
    if any(s.shape != y.shape for s in scores.values()):
        raise det.DeteriorationInputError("cached predictions do not match the test hours; clear the task cache")
    scores[BASELINE] = tgt["now"]
    pairs = comparison_pairs(names)
    boot = paired_cluster_bootstrap(y, scores, groups, pairs, n_boot=n_boot, seed=0)
    per_seed = seed_paired(runs, [p for p in pairs if BASELINE not in p], y)
    for p, v in per_seed.items():
        boot["pairs"][p].update({"per_seed_" + k: x for k, x in v.items()})
    for m in names:
        s = boot["scores"][m]
        agg[m].update({"auroc_seedavg": s["auroc"], "auroc_seedavg_low": s["auroc_low"],
                       "auroc_seedavg_high": s["auroc_high"], "auprc_seedavg": s["auprc"],
                       "auprc_seedavg_low": s["auprc_low"], "auprc_seedavg_high": s["auprc_high"]})
    leak = rd.leakage_summary(warehouse, label=label)
    win = winner(boot, names)

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
        "seed_figure": seed_field("deterioration"),
        "metrics": {**{m: agg[m] for m in names}, "test_hours": first["n"], "test_positives": first["n_pos"],
                    "test_prevalence": first["prevalence"], "test_stays": first["n_groups"],
                    BASELINE: boot["scores"][BASELINE], "paired": boot["pairs"],
                    "bootstrap": {k: boot[k] for k in ("n", "n_pos", "n_groups", "n_boot_used", "n_boot_skipped",
                                                       "level", "seed")},
                    "backfill_leak_old_loader": leak, "label": label, "mode": mode,
                    **({"winner": win["winner"], "headline": win["headline"]} if win else {})},
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
                   "n_boot": n_boot, "size": size, "sv_gate_path": "batched FISTA + 1e-3 ridge (training path)",
                   **({"lightgbm": _lightgbm_config()} if "lightgbm" in names else {}),
                   "device": device, "caps": caps, "caps_default": dtr.caps_text(device),
                   "sample": {"train_windows_per_epoch": first["train_windows_per_epoch"],
                              "train_windows": data.train.n_windows, "val_windows": data.val.n_windows,
                              "test_stays": int(data.test.stay_ids.size), "test_windows": data.test.n_windows},
                   "training": dtr.TRAINING},
        "claims": deterioration_claims(boot, names, first["n_groups"]) + ([win["claim"]] if win else []),
        # trained models: the figures move across machines within this tolerance (dashboards/SCHEMA.md)
        "tolerances": {f"metrics.{k}": TRAINED_TOLERANCE for k in (
            "*.auroc_mean", "*.auprc_mean", "*.auroc_sd", "*.auprc_sd", "*.auroc_seedavg", "*.auroc_seedavg_low",
            "*.auroc_seedavg_high", "*.auprc_seedavg", "*.auprc_seedavg_low", "*.auprc_seedavg_high",
            "paired.*.*", "*.auroc_ci_low_mean", "*.auroc_ci_high_mean")},
    }
    for tab in result["tables"][:3]:  # the AUROC / AUPRC tables
        tab["tolerances"] = {c: TRAINED_TOLERANCE for c in tab["columns"]
                             if c not in ("model", "seed", "seeds", "a − b", "epochs")}
    runner.write_study_result(result, runs_dir)
    return result


def settings_of(args) -> DeteriorationSettings:
    """The command line's study settings (validated here, once)."""
    return DeteriorationSettings(models=tuple(args.models), seeds=args.seeds, window=args.window,
                                 max_epochs=args.max_epochs, n_boot=args.n_boot, mode=args.mode, context=args.context,
                                 label=args.label, device=args.device, train_windows=args.train_windows,
                                 val_windows=args.val_windows, test_stays=args.test_stays,
                                 tabular_windows=args.tabular_windows,
                                 size=dtr.parse_size(args.size) if args.size else None)


@runner.cli_errors
def _main(args) -> int:
    r = runner.run_cli_flow(deterioration_flow, args, warehouse=args.warehouse, runs_dir=args.runs,
                            settings=settings_of(args), progress=not args.no_progress)
    m = r["metrics"]
    print(f"deterioration: test {m['test_hours']} hours, {m['test_stays']} stays, prevalence {m['test_prevalence']:.3f}"
          f" (label {m['label']}, {m['mode']})")
    for k in det.MODELS:
        if isinstance(m.get(k), dict) and "auroc_mean" in m[k]:
            print(f"  {LABELS[k]:<28} AUROC {m[k]['auroc_mean']:.3f} ± {m[k]['auroc_sd']:.3f}  "
                  f"AUPRC {m[k]['auprc_mean']:.3f} ± {m[k]['auprc_sd']:.3f}  ({m[k]['seeds']} seeds)")
    b = m[BASELINE]
    print(f"  {LABELS[BASELINE]:<28} AUROC {b['auroc']:.3f}  AUPRC {b['auprc']:.3f}")
    for p, v in m["paired"].items():
        print(f"  {p:<28} ΔAUROC {v['auroc_diff']:+.3f} [{v['auroc_diff_low']:+.3f}, {v['auroc_diff_high']:+.3f}]")
    if m.get("headline"):
        print(f"  {m['headline']}")
    print("  " + seed_line("deterioration", r["data"]))
    print(f"  runtime {r['runtime_s']:.1f}s{runner.cache_note(r)}")
    jsonout.emit(args, r)
    return 0


def _lightgbm_config() -> dict:
    from evaluation.clinical import tabular_peers as tp

    return {"params": tp.DEFAULT_PARAMS, "max_rounds": tp.MAX_ROUNDS, "early_stopping_rounds": tp.PATIENCE,
            "summary_windows_h": list(tp.WINDOWS), "features": len(tp.feature_names()),
            "class_weight": "(1 - prevalence) / prevalence, as the sequence models' BCE"}


def _cap(key: str) -> str:
    return " / ".join(f"{'all' if c[key] is None else f'{c[key]:,}'} on {d}" for d, c in dtr.CAPS.items())


def add_cli(sub) -> None:
    p = sub.add_parser("deterioration", help="predict a composite event within 6 h: SV attention vs LSTM, GRU, "
                                             "softmax and LightGBM", description=__doc__)
    p.add_argument("--models", nargs="+", choices=det.MODELS, default=list(det.MODELS), metavar="MODEL",
                   help=f"models to train (default all: {' '.join(det.MODELS)}); lightgbm needs the lightgbm extra")
    p.add_argument("--device", choices=dtr.DEVICES, default="cpu",
                   help="train on the CPU (default) or a CUDA GPU; picks the default caps below")
    p.add_argument("--seeds", type=COUNT, default=None,
                   help=f"training seeds per model (default {_cap('seeds')})")
    p.add_argument("--max-epochs", type=COUNT, default=None,
                   help=f"epoch cap; early stopping on val BCE (default {_cap('max_epochs')})")
    p.add_argument("--train-windows", type=COUNT0, default=None,
                   help=f"training windows drawn per epoch (0 = all; default {_cap('train_windows')})")
    p.add_argument("--val-windows", type=COUNT0, default=None,
                   help=f"validation windows, a fixed sample (0 = all; default {_cap('val_windows')})")
    p.add_argument("--test-stays", type=COUNT0, default=None,
                   help=f"test stays, a fixed sample, every hour scored (0 = all; default {_cap('test_stays')})")
    p.add_argument("--tabular-windows", type=COUNT0, default=None,
                   help="LightGBM's training windows, drawn once per seed "
                        f"(0 = all; default {_cap('tabular_windows')})")
    p.add_argument("--window", type=COUNT, default=48, help="scored hours per sliding block (default 48)")
    p.add_argument("--context", type=COUNT0, default=48,
                   help="carried context: preceding hours read before each block (default 48; 0 = disjoint windows)")
    p.add_argument("--mode", choices=det.SEQUENCE_MODES, default="sliding",
                   help="sliding blocks with carried context (default) or whole-stay sequences")
    p.add_argument("--label", choices=det.LABEL_VARIANTS, default="filled",
                   help="event definition: filled values (default, the warehouse's) or observed-only")
    p.add_argument("--size", nargs="+", default=None, metavar="KEY=VALUE",
                   help="model sizes over the study's ("
                        + ", ".join(f"{k}={v}" for k, v in dtr.DEFAULT_SIZE.items())
                        + "), e.g. --size chunk=16 for another SV gate chunk; each task's cache key holds only "
                          "its model's keys, so the peers are served from an earlier run's cache")
    p.add_argument("--n-boot", type=COUNT, default=10_000,
                   help="stay-clustered bootstrap resamples (default %(default)s)")
    runner.add_common_args(p)
    jsonout.add_json_arg(p)
    p.set_defaults(func=_main)
