"""``forgetful export --out DIR``: the warehouse as Parquet (Polars frames) or as a MEDS dataset,
for your own analysis.

``--format parquet`` (default) writes ``stays.parquet`` (cohort_stays) and ``hourly.parquet``
(vitals_hourly with each stay's split); ``--format meds`` writes a MEDS v0.4 dataset
(``data/<split>/<k>.parquet`` with the observed hourly vital-sign means and the ICU admission and
discharge events, ``metadata/dataset.json``, ``codes.parquet``, ``subject_splits.parquet``;
:mod:`cohort.meds_export`). Every file is readable by the owner only (mode 0600) and nothing is
overwritten. This is record-level data from your own local warehouse: keep it where the source
data may be kept. The writer lock is taken first, so pending erasures of forgotten patients are
completed before anything is read. The files are written into a staging folder inside DIR, moved
into place, and only then registered with the warehouse together with their content identity
(sha256): a later ``forgetful forget`` erases the patient from exactly these files
(:mod:`pipelines.store.exports`), never from anything else in DIR. A failed export registers
nothing and leaves DIR as it was.
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
    from pipelines.store import export_registry
    from pipelines.store.exports import FILES, MEDS_TOP
    from pipelines.store.safe_io import storage_errors

    meds = args.format == "meds"
    if meds and args.columns:
        raise BadParameterError("--columns applies to --format parquet only (a MEDS export holds the observed vitals)")
    with runner.warehouse_session(args) as w:
        names = MEDS_TOP if meds else FILES
        taken = [f for f in names if (Path(args.out) / f).exists() or (Path(args.out) / f).is_symlink()]
        if taken:  # a forget must never touch files this did not write
            raise BadParameterError(f"{args.out} already holds {', '.join(taken)}; choose an empty folder")
        from pipelines.store import warehouse as wh

        kind = wh.data_kind(w.path)  # demo / synthetic / mimic / clif: the MEDS dataset's name says it
        # written into a staging folder, moved into place, and only then registered with the
        # warehouse with each file's content identity (pipelines.store.export_registry)
        stage = export_registry.begin(w, args.out, args.format)
        try:
            with storage_errors(f"export: writing the {'MEDS' if meds else 'Parquet'} files",
                                lambda: export_registry.abandon(w, args.out, stage)):
                con = w.connect(read_only=False)
                try:
                    if meds:
                        from cohort.meds_export import export_meds

                        out = export_meds(con, stage, split=args.split, shard_subjects=args.shard_subjects,
                                          dataset_name=f"forgetful {kind} cohort")
                    else:
                        from cohort.frames import export_parquet

                        out = export_parquet(con, stage, split=args.split, columns=args.columns)
                finally:
                    con.close()
                export_registry.finish(w, args.out, args.format, stage)
        except BaseException:
            export_registry.abandon(w, args.out, stage)  # idempotent: nothing registered, nothing left
            raise
    folder = Path(args.out).resolve()
    if meds:
        out["root"] = str(folder)
    else:
        out["files"] = {k: str(folder / Path(v).name) for k, v in out["files"].items()}
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
