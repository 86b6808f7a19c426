"""``forgetful forget --subject-id ID`` (or ``--stay-id ID``): right to be forgotten, durably.

Registers the patient in the forget registry (a keyed hash, never the id) with one receipt in
the tamper-evident ledger, then erases them physically: every stored gate by the maintained
decremental path (verified against a same-C refit) or, for a context that held only them, by
removing it; the warehouse is rewritten into a fresh file without their rows and atomically
swapped in; the task cache is removed; results of the warehouse's runs directories are marked
stale. Every later build excludes the patient at scan time. A forget that died after its receipt
was committed is completed by the next command (or by rerunning this one).
Exit codes: 0 done, 2 usage, 3 unknown or already forgotten patient (nothing changed).
No Prefect server is started; the printed summary holds counts and tolerances only.
"""
from __future__ import annotations

import json
import sys

from pipelines import jsonout
from pipelines.runtime import runner
from pipelines.settings import ID


@runner.cli_errors
def _main(args) -> int:
    from pipelines.store.forget import forget_subject

    r = forget_subject(args.warehouse, subject_id=args.subject_id, stay_id=args.stay_id, verify=not args.no_verify,
                       ledger_dir=args.ledger, wait=args.wait, allow_absent=args.allow_absent)
    print(r.summary_line(), file=sys.stderr)
    d = r.to_dict()
    ctx = d.pop("contexts")
    d["contexts"] = {"decremented": sum(c["action"] == "decrement" for c in ctx),
                     "removed": sum(c["action"] == "removed" for c in ctx),
                     "uncertified": sum(not c.get("certified") for c in ctx),
                     "max_abs_score_dev": max((c.get("max_abs_score_dev", 0.0) for c in ctx), default=None),
                     "kkt_residual_max": max((c.get("kkt_residual", 0.0) for c in ctx), default=None)}
    print(json.dumps(d, indent=1))
    jsonout.emit(args, d)
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("forget", help="forget one patient everywhere, durably, with one tamper-evident receipt",
                       description=__doc__)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--subject-id", type=ID, default=None, help="the patient's subject_id")
    g.add_argument("--stay-id", type=ID, default=None, help="forget the patient who owns this stay")
    p.add_argument("--warehouse", default="runs/warehouse.duckdb", help="DuckDB warehouse (default: %(default)s)")
    p.add_argument("--no-verify", action="store_true", help="skip the same-C refit verification")
    p.add_argument("--allow-absent", action="store_true",
                   help="register a subject the warehouse does not hold, so no future build admits them")
    runner.add_lock_args(p)
    jsonout.add_json_arg(p)
    p.set_defaults(func=_main)
