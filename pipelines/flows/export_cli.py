"""``forgetful export --out DIR``: the warehouse as Parquet (Polars frames) for your own analysis.

Writes ``stays.parquet`` (cohort_stays) and ``hourly.parquet`` (vitals_hourly with each stay's
split) into DIR, readable by the owner only (mode 0600), never overwriting. This is record-level
data from your own local warehouse: keep it where the source data may be kept. The writer lock is
taken first, so pending erasures of forgotten patients are completed before anything is read, and
the folder is registered with the warehouse: a later ``forgetful forget`` erases the patient from
these files too (:mod:`pipelines.exports`).
In Python: ``cohort.load_hourly(warehouse)`` / ``cohort.load_stays(warehouse)`` return the
same frames as ``polars.DataFrame``. No Prefect server is started; the printed summary holds
counts only.
"""
from __future__ import annotations

import json
import sys

from pipelines import jsonout, runner


@runner.cli_errors
def _main(args) -> int:
    from cohort.frames import export_parquet

    with runner.warehouse_session(args) as w:
        from pathlib import Path

        from cohort.errors import BadParameterError
        from pipelines.exports import FILES

        taken = [f for f in FILES if (Path(args.out) / f).exists()]
        if taken:  # checked before registering: a forget must never touch files this did not write
            raise BadParameterError(f"{args.out} already holds {', '.join(taken)}; choose an empty folder")
        # registered before writing, so a forget reaches the folder even if this command dies
        # half-way (pipelines.exports); only the folder path is stored
        w.register_export(args.out)
        con = w.connect(read_only=False)
        try:
            from pipelines.exports import remove_partial
            from pipelines.safe_io import storage_errors

            with storage_errors("export: writing the Parquet files", lambda: remove_partial(args.out)):
                out = export_parquet(con, args.out, split=args.split, columns=args.columns)
        finally:
            con.close()
    print(f"exported {out['stays']:,} stays, {out['rows']:,} stay-hours (record-level, owner-only files) "
          f"to {args.out}", file=sys.stderr)
    print(json.dumps(out))
    jsonout.emit(args, out)
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("export", help="export the warehouse as Parquet (stays, hourly) for your own analysis",
                       description=__doc__)
    p.add_argument("--out", required=True, metavar="DIR", help="folder for stays.parquet and hourly.parquet")
    p.add_argument("--warehouse", default="runs/warehouse.duckdb", help="DuckDB warehouse (default: %(default)s)")
    p.add_argument("--split", choices=["train", "val", "test"], default=None,
                   help="only the stays of this split (default: every stay)")
    p.add_argument("--columns", nargs="+", default=None, metavar="COLUMN",
                   help="vitals_hourly columns to export (default: filled vitals, z-scores, observed flags, events)")
    runner.add_lock_args(p)
    jsonout.add_json_arg(p)
    p.set_defaults(func=_main)
