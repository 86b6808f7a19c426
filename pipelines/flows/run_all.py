"""``forgetful run-all``: the main job — data check → warehouse → every clinical study → HTML report.

1. fetch check: the real MIMIC-IV demo (CLIF parquet) must be in the cache
   (``python -m cohort.demo_data fetch``, or pass ``--fetch``); skipped for other sources;
2. ``build-cohort`` (default: the demo; ``--source synthetic --stays N``, ``--source mimic --root DIR`` or
   ``--source meds --root DIR`` with the default MEDS code map);
3. ``retention``, ``heldout-spo2``, ``patient-deletion``, ``deterioration``, ``audit`` — each a
   Prefect subflow with bounded task concurrency (2 threads, or ``--dask ADDRESS``), results
   cached on the warehouse content hash so a rerun after a crash resumes;
4. ``studies``: the seconds-long synthetic, learned-key and retrieval studies; ``fidelity``: the
   calibrated synthetic cohort against the real demo;
5. the ledger card and the report at ``<runs>/report.html`` (``dashboards.report``).

It ends with a short summary of the headline figures, read from the result files
(:mod:`pipelines.flows.run_summary`); ``--json PATH`` writes each step's wall seconds, CPU
seconds and peak RSS (:mod:`pipelines.runtime.step_meter`). Without torch (the ``models``
extra) or LightGBM (the ``lightgbm`` extra) the steps that need them are skipped with one line
each naming the extra (:func:`skip_without_torch`); the single commands refuse instead, exit 3.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from prefect import flow

from pipelines import jsonout, preflight
from pipelines.errors import LIGHTGBM_EXTRA_HINT, MODELS_EXTRA_HINT
from pipelines.runtime import heap, runner
from pipelines.runtime.step_meter import StepMeter
from pipelines.settings import (
    BUILD_MEMORY_LIMIT,
    COUNT,
    SEED,
    CohortSettings,
    DeteriorationSettings,
    RetentionSettings,
    RunAllSettings,
)

STEPS = ("build-cohort", "retention", "heldout-spo2", "patient-deletion", "deterioration", "audit", "studies",
         "fidelity", "report")


def fidelity_result(stays: int = 800, seed: int = 0) -> dict:
    """The calibrated synthetic cohort against the real demo, as a report card (aggregates only)."""
    import time as _t

    from cohort.errors import DemoDataMissing
    from cohort.fidelity import (
        DISTANCE_RATIO_BOUNDS,
        TRIVIAL_AUROC_MAX,
        check_bounds,
        demo_metrics,
        fidelity_rows,
        synthetic_metrics,
    )
    from cohort.synthetic.model import load_params

    t0 = _t.perf_counter()
    try:
        demo, src = demo_metrics(), "built now"
    except DemoDataMissing:
        demo, src = load_params(None).get("demo_reference"), "stored at calibration"
    syn = synthetic_metrics(stays, seed)
    bad = check_bounds(syn, demo["event_hour_share"])
    rows = [[k.replace("_", " "), d, s] for (k, d), (_, s) in zip(fidelity_rows(demo), fidelity_rows(syn))
            if isinstance(d, (int, float)) and isinstance(s, (int, float))]
    lo, hi = DISTANCE_RATIO_BOUNDS
    return {"study": "synthetic_fidelity", "title": "Synthetic cohort vs the real demo (fidelity)", "data": "synthetic",
            "runtime_s": _t.perf_counter() - t0, "seed_figure": {},
            "metrics": {"distance_ratio": syn["distance_ratio"], "trivial_auroc": syn["trivial_auroc"],
                        "event_hour_share": syn["event_hour_share"], "bounds_met": not bad},
            "tables": [{"title": f"demo ({src}) vs synthetic ({stays} generated stays, seed {seed})",
                        "columns": ["metric", "demo (real)", "synthetic"], "rows": rows[:100]}],
            "figures": [],
            "claims": [{"statement": f"event/other distance ratio in [{lo}, {hi}] and trivial-detector AUROC ≤ "
                                     f"{TRIVIAL_AUROC_MAX} (the synthetic cohort is not trivially separable)",
                        "reference": "the real MIMIC-IV demo's figures", "path": "cohort.fidelity",
                        "value": {"distance_ratio": syn["distance_ratio"], "trivial_auroc": syn["trivial_auroc"]},
                        "holds": not bad}],
            "config": {"stays": stays, "seed": seed, "demo_source": src}}


def skip_without_torch(what: str) -> bool:
    """True (after one line on stderr naming the extra) when torch is not installed.

    The steps that need torch: ``deterioration``, the audit's ``learned`` regime, and the studies on
    torch recall models (``learned-keys``, ``selective-copying``, ``capacity``, ``mqar-control``); the
    report shows their cards as not run. Without LightGBM ``deterioration`` trains its other models.
    """
    if preflight.torch_available():
        return False
    print(f"[run-all] {what} skipped: needs torch, which is not installed ({MODELS_EXTRA_HINT})", file=sys.stderr)
    return True


def run_studies(runs_dir: str, progress: bool) -> list[str]:
    """The seconds-long synthetic, learned-key and retrieval studies (their default protocols), so no
    report card is a placeholder. Retrieval memory needs the ``retrieval`` extra, the studies on torch
    models the ``models`` extra (each skipped without, with one line)."""
    from pipelines.flows.study_learned_keys import learned_keys_flow
    from pipelines.flows.study_synthetic import FLOWS, STUDIES

    done = []
    for cmd, study, _target, trials, _ in STUDIES:
        if cmd in preflight.TORCH_COMMANDS and skip_without_torch(cmd):
            continue
        FLOWS[study](trials, 0, str(Path(runs_dir) / study / "result.json"), progress)
        done.append(study)
    if not skip_without_torch("learned-keys"):
        learned_keys_flow(out=str(Path(runs_dir) / "learned_keys" / "result.json"), progress=progress)
        done.append("learned_keys")
    try:
        from evaluation.studies.retrieval_memory import load_encoder

        load_encoder()
    except Exception as exc:  # the optional extra is missing: say so once
        print(f"[run-all] retrieval-memory skipped ({type(exc).__name__}: {exc})", file=sys.stderr)
    else:
        from pipelines.flows.study_retrieval_memory import retrieval_memory_flow

        retrieval_memory_flow(out=str(Path(runs_dir) / "retrieval_memory" / "result.json"))
        done.append("retrieval_memory")
    return done


@dataclass(frozen=True)
class Run:
    """One run-all: where its data and results live, its settings, and the task runner of each step."""

    source: str
    root: str | None
    warehouse: str
    runs_dir: str
    report: str
    settings: RunAllSettings
    progress: bool
    task_runner: Callable


@flow(name="run-all", log_prints=True)
def run_all_flow(source: str = "demo", root: str | None = None, warehouse: str | None = None, runs_dir: str = "runs",
                 report: str | None = None, settings: RunAllSettings = RunAllSettings(),
                 progress: bool = True) -> dict:
    """Run every step; returns {step: seconds} plus the report path."""
    warehouse = warehouse or str(Path(runs_dir) / "warehouse.duckdb")
    report = report or str(Path(runs_dir) / "report.html")
    if source == "demo":
        from cohort.demo_data import ensure_demo

        root = str(ensure_demo(root, fetch=settings.cohort.fetch))  # raises DemoDataMissing with the fetch command
    steps = [s for s in STEPS if s not in set(settings.skip)]
    run = Run(source, root, warehouse, runs_dir, report, settings, progress,
              lambda: runner.make_task_runner(settings.dask_address, settings.workers))
    from pipelines.store.warehouse import Warehouse

    # opened once: every step's flow takes this handle (Warehouse.open within it reuses it)
    with Warehouse.open(warehouse, write=True, must_exist=False) as w:
        if w.path.is_file():
            w.register_runs_dir(runs_dir)
        meter = _run_steps(steps, run)
    return {"seconds": meter.seconds, "report": report, "warehouse": warehouse, **meter.as_json()}


def _run_steps(steps: list[str], run: Run) -> StepMeter:
    from tqdm.auto import tqdm

    meter = StepMeter()
    bar = tqdm(steps, desc="run-all", disable=not run.progress, file=sys.stderr)
    for step in bar:
        bar.set_postfix_str(step)
        with meter.step(step):
            ran = _run_step(step, run)
        # what the step freed goes back to the kernel before the next step starts (its worker threads'
        # malloc arenas keep freed pages resident otherwise: pipelines.runtime.heap)
        heap.release()
        if not ran:
            meter.drop(step)
    bar.close()
    return meter


def _run_step(step: str, run: Run) -> bool:
    """Run one step; False when it was skipped (deterioration without torch)."""
    from pipelines.flows.audit_flow import DEFAULT_REGIMES, audit_flow
    from pipelines.flows.clinical_cohort import build_cohort_flow
    from pipelines.flows.clinical_deletion import patient_deletion_flow
    from pipelines.flows.clinical_deterioration import deterioration_flow
    from pipelines.flows.clinical_retention import heldout_flow, retention_flow

    s, tr = run.settings, run.task_runner
    at = {"warehouse": run.warehouse, "runs_dir": run.runs_dir, "progress": run.progress}
    if step == "build-cohort":
        build_cohort_flow.with_options(task_runner=tr())(source=run.source, root=run.root, settings=s.cohort, **at)
    elif step == "retention":
        retention_flow.with_options(task_runner=tr())(settings=s.retention, **at)
    elif step == "heldout-spo2":
        heldout_flow.with_options(task_runner=tr())(settings=s.heldout, **at)
    elif step == "patient-deletion":
        patient_deletion_flow.with_options(task_runner=tr())(**at)
    elif step == "deterioration":
        if skip_without_torch("deterioration"):
            return False
        settings = s.deterioration
        if not preflight.extra_available("lightgbm"):
            settings = replace(settings, models=tuple(m for m in (settings.models or preflight.DETERIORATION_MODELS)
                                                      if m != "lightgbm"))
            print(f"[run-all] deterioration's lightgbm peer skipped: needs lightgbm, which is not installed "
                  f"({LIGHTGBM_EXTRA_HINT})", file=sys.stderr)
        deterioration_flow.with_options(task_runner=tr())(settings=settings, **at)
    elif step == "audit":
        regimes = DEFAULT_REGIMES
        if skip_without_torch("audit's 'learned' regime"):
            regimes = tuple(r for r in regimes if r not in preflight.TORCH_REGIMES)
        audit_flow.with_options(task_runner=tr())(trials=s.audit_trials, regimes=regimes, **at)
    elif step == "studies":
        run_studies(run.runs_dir, run.progress)
    elif step == "fidelity":
        runner.write_study_result(fidelity_result(), run.runs_dir)
    elif step == "report":
        from dashboards.report import write_report
        from pipelines.store.forget import write_ledger_result
        from pipelines.store.warehouse import Warehouse

        with Warehouse.open(run.warehouse, write=True) as w:  # the run's own handle
            w.register_runs_dir(run.runs_dir)
            write_ledger_result(w, render=False)  # the report is written next
        out = write_report(run.runs_dir, run.report)
        from pipelines.runtime.runner import in_flow_run

        if in_flow_run():
            from prefect.artifacts import create_link_artifact

            create_link_artifact(Path(out).resolve().as_uri(), link_text="retention report", key="forgetful-report",
                                 description="self-contained HTML report of this run (aggregates only)")
    return True


def argparse_ns_without_warehouse(args):
    """The CLI arguments with the warehouse left to the flow (it may not exist before the build):
    the session only applies ``--ledger``/``--wait``."""
    import argparse

    return argparse.Namespace(**{**vars(args), "warehouse": None})


def settings_of(args) -> RunAllSettings:
    """The command line's settings of every step (validated here, once)."""
    return RunAllSettings(
        cohort=CohortSettings(stays=args.stays, seed=args.seed, memory_limit=args.build_memory_limit, fetch=args.fetch),
        retention=RetentionSettings(n_boot=args.n_boot, stays=args.study_stays),
        deterioration=DeteriorationSettings(seeds=args.det_seeds, max_epochs=args.det_max_epochs),
        audit_trials=args.audit_trials, skip=tuple(args.skip), dask_address=args.dask, workers=args.workers)


def _main(args) -> int:
    from pipelines.flows.run_summary import summary_lines

    t0, started = time.perf_counter(), time.time()
    settings = settings_of(args)
    with runner.warehouse_session(argparse_ns_without_warehouse(args)), runner.results_context(args.runs), \
            runner.dask_hygiene(args.dask):
        r = run_all_flow.with_options(task_runner=runner.make_task_runner(args.dask, args.workers))(
            source=args.source, root=args.root, warehouse=args.warehouse, runs_dir=args.runs, report=args.report,
            settings=settings, progress=not args.no_progress)
    r["total_seconds"] = round(time.perf_counter() - t0, 1)
    print("\n".join(summary_lines(args.runs, report=r["report"], seconds=r["seconds"], total_s=r["total_seconds"],
                                  since=started, peak_rss_mb=r.get("peak_rss_mb"), rss_method=r.get("rss_method"))))
    jsonout.emit(args, r)
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("run-all", help="the main job: demo check, warehouse, every clinical study, report",
                       description=__doc__)
    p.add_argument("--source", choices=["demo", "mimic", "clif", "meds", "synthetic"], default="demo",
                   help="data source (default: %(default)s, the real MIMIC-IV demo)")
    p.add_argument("--root", default=None,
                   help="source folder (mimic/clif/meds; demo: the cache folder, optional)")
    p.add_argument("--stays", type=COUNT, default=1500, help="synthetic: generated stays (default 1500)")
    p.add_argument("--seed", type=SEED, default=0, help="seed of the synthetic cohort and the studies (default 0)")
    p.add_argument("--warehouse", default=None, help="DuckDB warehouse (default: <runs>/warehouse.duckdb)")
    p.add_argument("--report", default=None, help="HTML report (default: <runs>/report.html)")
    p.add_argument("--audit-trials", type=COUNT, default=50, help="audit trials per regime (default 50; seed: 300)")
    p.add_argument("--det-seeds", type=COUNT, default=3, help="deterioration: training seeds per model (default 3)")
    p.add_argument("--det-max-epochs", type=COUNT, default=12,
                   help="deterioration: maximum training epochs (default 12)")
    p.add_argument("--n-boot", type=COUNT, default=10_000,
                   help="retention: stay-bootstrap resamples for the CIs (default 10000)")
    p.add_argument("--study-stays", type=COUNT, default=None, metavar="N",
                   help="retention, heldout-spo2: a deterministic sample of N eligible stays (default: every stay)")
    p.add_argument("--build-memory-limit", default=BUILD_MEMORY_LIMIT, metavar="SIZE",
                   help="DuckDB memory limit of the build step, which spills to disk past it (default %(default)s; "
                        "build-cohort alone defaults to 4GB)")
    p.add_argument("--fetch", action="store_true", help="fetch the demo data first if it is not cached")
    p.add_argument("--skip", nargs="*", default=[], choices=list(STEPS), metavar="STEP",
                   help=f"steps to skip, of: {', '.join(STEPS)}")
    runner.add_common_args(p, warehouse=False)
    jsonout.add_json_arg(p)
    p.set_defaults(func=_main)
