"""The frozen standardisation of a new streaming warehouse (``forgetful ingest --init``).

:func:`frozen_from_batch` runs the causal batch build (:func:`cohort.build.build_warehouse`) over
the part files present at creation and takes the training split's moments over the hours that
are *closed* at the watermark the first ingest step will reach (:func:`closed_moments`), and the
build's medians. The streaming warehouse records the table and never recomputes it.
"""
from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np

from cohort.build import HOUR_US
from cohort.constants import VITALS
from cohort.errors import InputMissingError
from cohort.incremental import SCAN_TABLE, load_stays, measurement_files, scan_file


def frozen_from_batch(source: str, root: Path, scratch: Path, min_hours: float, seed: int, exclude_subjects) -> dict:
    """Causal batch build of the files present now (parts concatenated into a scratch layout)
    -> {vital: {"mean", "sd", "median"}} (training split)."""
    import os
    import shutil

    from cohort.build import build_warehouse
    from cohort.sources import Table

    parts = measurement_files(source, root)
    if not parts:
        raise InputMissingError(f"no measurement files under {root} to initialise the frozen standardisation from")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        con = duckdb.connect(":memory:")
        try:
            readers = []
            for p in parts:
                t = Table("part", p)
                t.check(con, [])
                readers.append(f"SELECT * FROM {t.reader}")
            if source == "mimic":
                (scratch / "icu").mkdir()
                (scratch / "hosp").mkdir()
                dest = scratch / "icu" / "chartevents.parquet"
                for rel in ("icu/icustays", "icu/d_items", "hosp/patients", "hosp/admissions"):
                    for ext in (".csv.gz", ".csv", ".parquet"):
                        if (root / f"{rel}{ext}").is_file():
                            os.symlink((root / f"{rel}{ext}").resolve(), scratch / f"{rel}{ext}")
                            break
            else:
                dest = scratch / "clif_vitals.parquet"
                for rel in ("clif_adt", "clif_hospitalization", "clif_patient"):
                    if (root / f"{rel}.parquet").is_file():
                        os.symlink((root / f"{rel}.parquet").resolve(), scratch / f"{rel}.parquet")
            con.execute(f"COPY ({' UNION ALL BY NAME '.join(readers)}) TO '{dest}' (FORMAT parquet)")
        finally:
            con.close()
        wh = scratch / "init.duckdb"
        build_warehouse(source, scratch, wh, min_hours=min_hours, seed=seed, progress=False, fill="causal",
                        exclude_subjects=exclude_subjects)
        w_us = watermark_of(source, root, parts, min_hours, exclude_subjects)
        c2 = duckdb.connect(str(wh), read_only=True)
        try:
            rows = c2.execute("SELECT vital, mean, sd, median FROM standardisation").fetchall()
            closed = closed_moments(c2, w_us)
        finally:
            c2.close()
        return {v: {"mean": float(closed.get(v, (m, s))[0]), "sd": float(closed.get(v, (m, s))[1]),
                    "median": float(md)} for v, m, s, md in rows}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def watermark_of(source: str, root: Path, parts, min_hours: float, exclude_subjects) -> int | None:
    """The watermark W the first ingest step will reach: max usable charttime of ``parts``."""
    con = duckdb.connect(":memory:")
    try:
        load_stays(con, source, root, min_hours, exclude_subjects)
        w_us = None
        for p in parts:
            mx = scan_file(con, source, root, p)[2]
            con.execute(f"DROP TABLE {SCAN_TABLE}")
            if mx is not None:
                w_us = int(mx) if w_us is None else max(w_us, int(mx))
        return w_us
    finally:
        con.close()


def closed_moments(con, w_us: int | None) -> dict:
    """Mean and sample sd (sd 0 -> 1) of the batch build's filled hourly values over the hours
    that are *closed* at watermark ``w_us`` (training split; every split if it has none).

    The batch build of a partial source fills forward to each stay's outtime, i.e. over hours whose
    rows have not arrived yet (a long stay seen for its first 500 of 10,000 hours would be
    standardised on 9,500 copies of its last value: the sd shrinks several-fold and the stream's
    z-keys are inflated by as much). The streamed warehouse only ever holds closed hours, so its
    frozen moments are taken over those. With a complete source (W >= every outtime) this equals
    the batch build's own moments. Empty dict when no hour is closed (the build's stats are kept)."""
    if w_us is None:
        return {}
    closed = (f"CASE WHEN {int(w_us)} >= epoch_us(c.outtime) THEN c.n_hours ELSE "
              f"least(greatest(({int(w_us)} - epoch_us(c.intime)) // {HOUR_US}, 0), greatest(c.n_hours - 1, 0)) END")
    for where in ("c.split = 'train' AND ", ""):
        sel = ", ".join(f"count({v}), avg({v}), stddev_samp({v})" for v in VITALS)
        row = con.execute(f"SELECT {sel} FROM vitals_hourly v JOIN cohort_stays c USING (stay_id) "
                          f"WHERE {where}v.hour < {closed}").fetchone()
        if int(row[0]) > 0:
            out = {}
            for j, v in enumerate(VITALS):
                n, mu, sd = int(row[3 * j]), row[3 * j + 1], row[3 * j + 2]
                sd = 1.0 if n < 2 or sd is None or not np.isfinite(sd) or sd <= 0 else float(sd)
                out[v] = (float(mu), sd)
            return out
    return {}


__all__ = ["frozen_from_batch", "watermark_of", "closed_moments"]
