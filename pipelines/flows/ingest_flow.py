"""``forgetful ingest``: incremental clinical ingest into a streaming warehouse (a Prefect flow).

``--init`` creates the streaming warehouse and fixes its standardisation (training-split moments
and medians of a causal batch build of the files present, or ``--frozen FILE.json``); every run
then ingests only the new measurement part files (``icu/chartevents*`` for mimic,
``clif_vitals*`` for clif) as one watermark step (committed in stages), processes the deletion
queue first, prints one summary line and writes ``<runs>/ingest/result.json`` (aggregates only;
``--json PATH`` for the command's own result). ``forgetful serve`` schedules
it (interval, concurrency limit 1). See :mod:`pipelines.ingest` for the watermark, late-row and
crash-safety rules.
"""
from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

from prefect import flow, task

from pipelines import jsonout
from pipelines.runtime import runner
from pipelines.settings import COUNT, HOURS, SEED, IngestSettings, utc_microseconds

DEFAULT_INTERVAL_S = 3600
#: per-step aggregates stored in the result (``metrics.stream_series``, columnar, oldest first)
SERIES_FIELDS = ("step", "hours_admitted", "new_tokens", "n_hot", "n_cold", "readmissions", "late_rows",
                 "reopened_hours", "replaced_tokens", "certified_retention")


def _data_kind(root: str) -> str:
    r = Path(root).resolve()
    try:
        from cohort.demo_data import ensure_demo

        if r == Path(ensure_demo(None)).resolve():
            return "demo"
    except Exception:  # noqa: BLE001 - no demo cache: not the demo
        pass
    if (r / "synthetic_manifest.json").is_file() or (r.parent / "synthetic_manifest.json").is_file():
        return "synthetic"
    return "mimic"


# no retries: the task commits increments; a retry after a commit whose result was lost would apply it twice
@task(name="ingest-increments")
def ingest_task(warehouse: str, source: str, root: str, init: bool, final: bool, settings: IngestSettings) -> dict:
    from pipelines.ingest import ingest

    return ingest(warehouse, source, root, init=init, final=final, settings=settings)


def result_of(r: dict, data: str, source: str) -> dict:
    """The study result (aggregates only: counts, fractions, timings)."""
    steps = r["steps"]
    rows = [[s["step"], s["n_usable"], s["late_rows"], s["reopened_hours"], s["new_tokens"], s["replaced_tokens"],
             s["stays_updated"], round(s["seconds"], 3)] for s in steps[-50:]]
    m = {k: r[k] for k in ("n_stays", "n_tokens", "n_hot", "n_cold", "readmissions", "gated_stays",
                           "future_safe_stays", "certified_retention", "event_hours", "event_hour_retention_pooled",
                           "event_hour_retention_mean_stay", "step")}
    m.update(steps_this_run=len(steps), late_rows_this_run=sum(s["late_rows"] for s in steps),
             replaced_tokens_this_run=sum(s["replaced_tokens"] for s in steps),
             deletions_processed=r["deletions"]["processed"],
             deletions_unknown_pending=r["deletions"]["unknown_pending"])
    series = r.get("series") or []
    if series:  # the warehouse's durable per-step series (totals over all stays; counts only)
        m["stream_series"] = {k: [s[k] for s in series] for k in SERIES_FIELDS}
    return {
        "study": "ingest", "title": "Incremental ingest: per-stay streaming memories", "data": data,
        "runtime_s": float(r["runtime_s"]), "seed_figure": {}, "metrics": m,
        "tables": [{"title": "watermark steps of this run",
                    "columns": ["step", "usable rows", "late rows", "re-opened hours", "new tokens",
                                "replaced tokens", "stays updated", "seconds"], "rows": rows}],
        "figures": [],
        "config": {"source": source, "nu": 0.3, "sigma": 3.0, "n0": 48},
        "notes": ("certified_retention = hot-tier share of live tokens (the cold tier is certified inert for the "
                  "full history); event-hour retention = share of event hours (composite) kept hot; "
                  "stream_series = totals over all stays after each watermark step of the warehouse"),
    }


@flow(name="ingest", log_prints=True)
def ingest_flow(source: str = "mimic", root: str = ".", warehouse: str = "runs/stream.duckdb", runs_dir: str = "runs",
                init: bool = False, final: bool = False, settings: IngestSettings = IngestSettings(),
                frozen_file: str | None = None) -> dict:
    """Ingest the new increments; returns the run's aggregates. ``frozen_file``: a JSON file of the
    frozen standardisation (with ``init``; ``settings.frozen`` takes it given as a mapping)."""
    from pipelines.preflight import check_ingest_warehouse
    from pipelines.store.warehouse import Warehouse

    t0 = time.perf_counter()
    check_ingest_warehouse(warehouse, source, root, init)  # also when a deployment runs it (serve)
    if frozen_file:
        settings = replace(settings, frozen=json.loads(Path(frozen_file).read_text()))
    r = ingest_task(warehouse, source, root, init, final, settings)
    with Warehouse.open(warehouse, write=True) as w:
        w.register_runs_dir(runs_dir)
    r["runtime_s"] = time.perf_counter() - t0
    runner.write_study_result(result_of(r, _data_kind(root), source), runs_dir)
    return r


def settings_of(args) -> IngestSettings:
    """The command line's ingest settings (validated here, once; ``--as-of`` as epoch microseconds)."""
    return IngestSettings(min_hours=args.min_hours, seed=args.seed, as_of_us=args.as_of, max_steps=args.max_steps,
                          jobs=args.jobs)


def _main(args) -> int:
    r = runner.run_cli_flow(ingest_flow, args, must_exist=not args.init, source=args.source, root=args.root,
                            warehouse=args.warehouse, runs_dir=args.runs, init=args.init, final=args.final,
                            settings=settings_of(args), frozen_file=args.frozen)
    from pipelines.ingest import summary_line

    out = {"steps": len(r["steps"]), "late_rows": sum(s["late_rows"] for s in r["steps"]),
           "n_stays": r["n_stays"], "n_tokens": r["n_tokens"], "n_hot": r["n_hot"],
           "future_safe_stays": r["future_safe_stays"], "deletions": r["deletions"],
           "stays_touched": sum(s["stays_updated"] for s in r["steps"]),
           "tokens_admitted": sum(s["new_tokens"] for s in r["steps"]),
           "readmissions": sum(s.get("readmissions", 0) for s in r["steps"]),
           "seconds": round(r["runtime_s"], 2)}
    print(summary_line(r))  # the machine-readable result: --json PATH
    jsonout.emit(args, out)
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("ingest", help="incremental ingest of new chartevents/vitals files into a streaming warehouse",
                       description=__doc__)
    p.add_argument("--source", choices=["mimic", "clif"], required=True, help="layout of the source folder")
    p.add_argument("--root", required=True, help="source folder; new part files appear here")
    p.add_argument("--init", action="store_true", help="create the streaming warehouse (frozen standardisation)")
    p.add_argument("--frozen", default=None, metavar="JSON",
                   help="with --init: a supplied frozen standardisation {vital: {mean, sd, median}}")
    p.add_argument("--final", action="store_true", help="the source is complete: close every hour up to outtime")
    p.add_argument("--as-of", type=utc_microseconds, default=None, metavar="ISO",
                   help="raise the watermark to this UTC time")
    p.add_argument("--max-steps", type=COUNT, default=None, help="ingest at most N new files this run")
    p.add_argument("--min-hours", type=HOURS, default=48, help="with --init: minimum length of stay")
    p.add_argument("--seed", type=SEED, default=0, help="with --init: split seed")
    p.add_argument("--jobs", type=COUNT, default=None, metavar="N",
                   help="worker processes for the gate updates (default: the usable CPUs, at most 8; "
                        "results do not depend on it)")
    runner.add_common_args(p)
    jsonout.add_json_arg(p)
    p.set_defaults(func=_main, warehouse="runs/stream.duckdb")
