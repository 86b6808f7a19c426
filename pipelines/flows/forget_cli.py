"""``forgetful forget --subject-id ID`` (or ``--stay-id ID``): right to be forgotten.

Removes the patient's tokens from every stored gate state by the maintained decremental path
(verified against a same-C refit), deletes the patient's rows from every derived warehouse table,
and records all of it in ONE hash-chained receipt — in one DuckDB transaction (all or nothing).
The task-result cache under ``<runs>/.prefect-results`` (which may hold the patient's keys) is
deleted afterwards. Unknown or already-forgotten patients: exit 2, nothing changed.
The printed summary holds counts and tolerances only.
"""
from __future__ import annotations

import json

from pipelines import runner
from pipelines.forget import forget_subject


@runner.cli_errors
def _main(args) -> int:
    r = forget_subject(args.warehouse, subject_id=args.subject_id, stay_id=args.stay_id, verify=not args.no_verify,
                       cache_dirs=() if args.keep_cache else (runner.results_dir(args.runs),))
    d = r.to_dict()
    ctx = d.pop("contexts")
    d["contexts"] = {"decremented": sum(c["action"] == "decrement" for c in ctx),
                     "dropped": sum(c["action"] == "dropped" for c in ctx),
                     "max_abs_score_dev": max((c.get("max_abs_score_dev", 0.0) for c in ctx), default=None),
                     "kkt_residual_max": max((c.get("kkt_residual", 0.0) for c in ctx), default=None)}
    print(json.dumps(d, indent=1))
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("forget", help="forget one patient everywhere, with one hash-chained receipt",
                       description=__doc__)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--subject-id", type=int, default=None)
    g.add_argument("--stay-id", type=int, default=None, help="forget the patient who owns this stay")
    p.add_argument("--warehouse", default="runs/warehouse.duckdb")
    p.add_argument("--runs", default="runs", help="runs directory whose task cache is cleared (default: runs)")
    p.add_argument("--keep-cache", action="store_true", help="do not delete <runs>/.prefect-results")
    p.add_argument("--no-verify", action="store_true", help="skip the same-C refit verification")
    p.set_defaults(func=_main)
