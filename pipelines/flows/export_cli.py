"""``forgetful export --out DIR``: the warehouse as Parquet (Polars frames) or as a MEDS dataset,
for your own analysis.

``--format parquet`` (default) writes ``stays.parquet`` (cohort_stays) and ``hourly.parquet``
(vitals_hourly with each stay's split); ``--format meds`` writes a MEDS v0.4 dataset
(``data/<split>/<k>.parquet`` with the observed hourly vital-sign means and the ICU admission and
discharge events, ``metadata/dataset.json``, ``codes.parquet``, ``subject_splits.parquet``;
:mod:`cohort.meds_export`). Every file is readable by the owner only (mode 0600) and nothing is
overwritten. This is record-level data from your own local warehouse: keep it where the source
data may be kept. The writer lock is taken first, so pending erasures of forgotten patients are
completed before anything is read, and the folder is registered with the warehouse: a later
``forgetful forget`` erases the patient from these files too (:mod:`pipelines.store.exports`).
In Python: ``cohort.load_hourly(warehouse)`` / ``cohort.load_stays(warehouse)`` return the
same frames as ``polars.DataFrame``; ``cohort.meds_export.export_meds`` writes the MEDS dataset.
No Prefect server is started; the printed summary holds counts only.
"""
from __future__ import annotations

import json
import sys

from pipelines import jsonout
from pipelines.runtime import runner


@runner.cli_errors
def _main(args) -> int:
    from pathlib import Path

    from cohort.errors import BadParameterError
    from pipelines.store.exports import FILES, MEDS_TOP

    meds = args.format == "meds"
    if meds and args.columns:
        raise BadParameterError("--columns applies to --format parquet only (a MEDS export holds the observed vitals)")
    with runner.warehouse_session(args) as w:
        names = MEDS_TOP if meds else FILES
        taken = [f for f in names if (Path(args.out) / f).exists() or (Path(args.out) / f).is_symlink()]
        if taken:  # checked before registering: a forget must never touch files this did not write
            raise BadParameterError(f"{args.out} already holds {', '.join(taken)}; choose an empty folder")
        # registered before writing, so a forget reaches the folder even if this command dies
        # half-way (pipelines.store.exports); only the folder path is stored
        w.register_export(args.out, fmt=args.format)
        from pipelines.store import warehouse as wh

        kind = wh.data_kind(w.path)  # demo / synthetic / mimic / clif: the MEDS dataset's name says it
        con = w.connect(read_only=False)
        try:
            from pipelines.store.exports import remove_partial
            from pipelines.store.safe_io import storage_errors

            with storage_errors(f"export: writing the {'MEDS' if meds else 'Parquet'} files",
                                lambda: remove_partial(args.out, args.format)):
                if meds:
                    from cohort.meds_export import export_meds

                    out = export_meds(con, args.out, split=args.split, shard_subjects=args.shard_subjects,
                                      dataset_name=f"forgetful {kind} cohort")
                else:
                    from cohort.frames import export_parquet

                    out = export_parquet(con, args.out, split=args.split, columns=args.columns)
        finally:
            con.close()
    what = (f"{out['subjects']:,} subjects, {out['stays']:,} stays, {out['rows']:,} MEDS events"
            if meds else f"{out['stays']:,} stays, {out['rows']:,} stay-hours")
    print(f"exported {what} (record-level, owner-only files) to {args.out}", file=sys.stderr)
    print(json.dumps(out))
    jsonout.emit(args, out)
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("export", help="export the warehouse as Parquet or MEDS for your own analysis",
                       description=__doc__)
    p.add_argument("--out", required=True, metavar="DIR",
                   help="folder for stays.parquet and hourly.parquet (MEDS: data/ and metadata/)")
    p.add_argument("--format", choices=["parquet", "meds"], default="parquet",
                   help="parquet (default: stays and hourly tables) or meds (a MEDS v0.4 dataset)")
    p.add_argument("--warehouse", default="runs/warehouse.duckdb", help="DuckDB warehouse (default: %(default)s)")
    p.add_argument("--split", choices=["train", "val", "test"], default=None,
                   help="only the stays of this split (default: every stay)")
    p.add_argument("--columns", nargs="+", default=None, metavar="COLUMN",
                   help="parquet: vitals_hourly columns to export (default: filled vitals, z-scores, observed flags, "
                        "events)")
    p.add_argument("--shard-subjects", type=int, default=10_000, metavar="N",
                   help="meds: at most N subjects per data shard (default %(default)s)")
    runner.add_lock_args(p)
    jsonout.add_json_arg(p)
    p.set_defaults(func=_main)
