"""``forgetful serve``: register the flows as Prefect deployments on a cron schedule and serve them.

``run-all`` is scheduled with ``--cron`` (default nightly at 03:00) over ``--source`` (with
``--root DIR`` for a MIMIC-IV or CLIF folder); the cron string and the root are checked before
anything starts (:mod:`pipelines.preflight`). The individual study flows
are registered unscheduled so they can be triggered from the Prefect UI/API. Every deployment
has concurrency limit 1, so runs never overlap on one warehouse. ``--dry-run``
builds and prints the deployments without serving (nothing is started). Serving blocks until
interrupted; stop it before stopping its Prefect server.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from pipelines import jsonout
from pipelines.runtime import runner
from pipelines.settings import INTERVAL

DEFAULT_CRON = "0 3 * * *"


@dataclass(frozen=True)
class IngestSchedule:
    """The incremental ingest of ``serve``: its growing source root and layout, its interval
    (seconds) and its streaming warehouse (default ``<runs>/stream.duckdb``)."""

    root: str
    source: str = "mimic"
    interval_s: float = 3600
    warehouse: str | None = None


def build_deployments(cron: str = DEFAULT_CRON, runs_dir: str = "runs", warehouse: str | None = None,
                      source: str = "demo", root: str | None = None, ingest: IngestSchedule | None = None) -> list:
    """``RunnerDeployment`` objects (built, not served): run-all on ``cron`` (over ``source`` and,
    for mimic/clif, ``root``), the studies on demand, and — with ``ingest`` — the incremental
    ingest every ``ingest.interval_s`` seconds. Every deployment has concurrency limit 1: a
    scheduled run never overlaps the previous one on the same warehouse (late runs wait in the
    Prefect queue instead of queuing on the writer lock)."""
    from pipelines.flows.audit_flow import audit_flow
    from pipelines.flows.clinical_deletion import patient_deletion_flow
    from pipelines.flows.clinical_deterioration import deterioration_flow
    from pipelines.flows.clinical_retention import heldout_flow, retention_flow
    from pipelines.flows.run_all import run_all_flow

    wh = warehouse or f"{runs_dir}/warehouse.duckdb"
    deps = [run_all_flow.to_deployment(name="forgetful-run-all", cron=cron, concurrency_limit=1,
                                       parameters={"source": source, "runs_dir": runs_dir, "warehouse": wh,
                                                   **({"root": str(Path(root).resolve())} if root else {})},
                                       tags=["forgetful"])]
    for f, name in ((retention_flow, "retention"), (heldout_flow, "heldout-spo2"),
                    (patient_deletion_flow, "patient-deletion"), (deterioration_flow, "deterioration"),
                    (audit_flow, "audit")):
        deps.append(f.to_deployment(name=f"forgetful-{name}", parameters={"warehouse": wh, "runs_dir": runs_dir},
                                    concurrency_limit=1, tags=["forgetful"]))
    if ingest is not None:
        from pipelines.flows.ingest_flow import ingest_flow

        deps.append(ingest_flow.to_deployment(
            name="forgetful-ingest", interval=float(ingest.interval_s), concurrency_limit=1,
            parameters={"source": ingest.source, "root": ingest.root, "runs_dir": runs_dir,
                        "warehouse": ingest.warehouse or f"{runs_dir}/stream.duckdb"},
            tags=["forgetful"]))
    return deps


def describe(deps: list) -> list[dict]:
    out = []
    for d in deps:
        crons = [getattr(s.schedule, "cron", None) for s in (d.schedules or [])]
        item = {"name": d.name, "flow": d.flow_name, "cron": [c for c in crons if c], "parameters": d.parameters}
        ivs = [getattr(s.schedule, "interval", None) for s in (d.schedules or [])]
        if any(ivs):
            item["interval_s"] = [iv.total_seconds() for iv in ivs if iv]
        lim = getattr(d, "concurrency_limit", None)
        item["concurrency_limit"] = getattr(lim, "limit", lim)
        out.append(item)
    return out


@runner.cli_errors
def _main(args) -> int:
    try:
        ingest = (IngestSchedule(args.ingest_root, args.ingest_source, args.ingest_interval, args.ingest_warehouse)
                  if args.ingest_root else None)
        deps = build_deployments(args.cron, args.runs, args.warehouse, args.source, args.root, ingest)
    except ValueError as exc:  # Prefect's schedule validation (pydantic): one line, a usage error
        from pipelines.preflight import one_line

        print(f"forgetful serve: error: {one_line(exc).split(' For further information')[0]}", file=sys.stderr)
        return runner.EXIT_USAGE
    print(json.dumps(describe(deps), indent=1))
    jsonout.emit(args, describe(deps))
    if args.dry_run:
        return 0
    from prefect import serve

    with runner.results_context(args.runs):
        serve(*deps)
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("serve", help="serve the flows as Prefect deployments (run-all on a cron schedule)",
                       description=__doc__)
    p.add_argument("--cron", default=DEFAULT_CRON, help="cron schedule of run-all (default: %(default)r)")
    p.add_argument("--runs", default="runs", help="runs directory of the served flows (default: %(default)s)")
    p.add_argument("--warehouse", default=None, help="DuckDB warehouse (default: <runs>/warehouse.duckdb)")
    p.add_argument("--source", default="demo", choices=["demo", "mimic", "clif", "synthetic"],
                   help="data source of the scheduled run-all (default: %(default)s)")
    p.add_argument("--root", default=None, metavar="DIR",
                   help="source folder of the scheduled run-all (needed for --source mimic/clif)")
    p.add_argument("--dry-run", action="store_true", help="build and print the deployments, do not serve")
    p.add_argument("--ingest-root", default=None, metavar="DIR",
                   help="also schedule `forgetful ingest` on this growing source root (concurrency limit 1)")
    p.add_argument("--ingest-source", default="mimic", choices=["mimic", "clif"],
                   help="layout of the ingest root (default: %(default)s)")
    p.add_argument("--ingest-interval", type=INTERVAL, default=3600, metavar="SECONDS",
                   help="ingest schedule interval (default: %(default)s s)")
    p.add_argument("--ingest-warehouse", default=None, help="streaming warehouse (default: <runs>/stream.duckdb)")
    jsonout.add_json_arg(p)
    p.set_defaults(func=_main)
