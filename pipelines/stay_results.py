"""Per-stay study results in the warehouse, so a forget erases them like every other row.

Table ``stay_results(study, stay_id, subject_id, name, value)``: one row per stay and per-stay
value (retention of each policy, ``n``, ``k``, event hours, the solve's certificate fields …; long
format, so a study may add a value without a schema change). It carries ``subject_id`` and
``stay_id``, so :func:`pipelines.erasure.rewrite` drops a forgotten patient's rows and
:func:`pipelines.warehouse.subjects_present` sees them. Record-level: it never leaves the
warehouse (result files hold aggregates only). Writers run inside the caller's transaction.
"""
from __future__ import annotations

from collections.abc import Mapping

import duckdb
import numpy as np
import pyarrow as pa

from .errors import StudyInputError

TABLE = "stay_results"
DDL = (f"CREATE TABLE IF NOT EXISTS {TABLE} (study VARCHAR NOT NULL, stay_id BIGINT NOT NULL, "
       "subject_id BIGINT NOT NULL, name VARCHAR NOT NULL, value DOUBLE)")
#: the columns that identify a stay (not stored as values)
ID_COLUMNS = ("stay_id", "subject_id")


def replace(con: duckdb.DuckDBPyConnection, study: str, columns: Mapping[str, np.ndarray]) -> int:
    """Replace every row of ``study`` by ``columns`` (``stay_id``, ``subject_id`` and numeric
    per-stay columns of one length; NaN stored as NULL). Returns the number of stays written."""
    if any(c not in columns for c in ID_COLUMNS):
        raise StudyInputError(f"per-stay columns need {ID_COLUMNS}")
    stay = np.asarray(columns["stay_id"], dtype=np.int64)
    subj = np.asarray(columns["subject_id"], dtype=np.int64)
    names = [c for c in columns if c not in ID_COLUMNS]
    m = stay.size
    for c in names:
        if np.asarray(columns[c]).shape != (m,):
            raise StudyInputError(f"per-stay column {c!r} has shape {np.shape(columns[c])}, expected ({m},)")
    con.execute(DDL)
    con.execute(f"DELETE FROM {TABLE} WHERE study = ?", [study])
    if m == 0 or not names:
        return int(m)
    vals = np.concatenate([np.asarray(columns[c], dtype=np.float64) for c in names])
    tbl = pa.table({"study": pa.array([study] * (m * len(names))),
                    "stay_id": pa.array(np.tile(stay, len(names))),
                    "subject_id": pa.array(np.tile(subj, len(names))),
                    "name": pa.array(np.repeat(np.asarray(names, dtype=object), m)),
                    "value": pa.array(vals, mask=np.isnan(vals))})
    con.register("_stay_results_df", tbl)
    con.execute(f"INSERT INTO {TABLE} SELECT * FROM _stay_results_df")
    con.unregister("_stay_results_df")
    return int(m)


def read(con: duckdb.DuckDBPyConnection, study: str) -> dict[str, np.ndarray]:
    """The per-stay columns of ``study`` (ascending stay id; NULL read back as NaN; ``{}`` when
    the study has no rows)."""
    tables = {r[0] for r in con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()").fetchall()}
    if TABLE not in tables:
        return {}
    d = con.execute(f"SELECT stay_id, subject_id, name, value FROM {TABLE} WHERE study = ? ORDER BY name, stay_id",
                    [study]).fetchnumpy()
    if len(d["stay_id"]) == 0:
        return {}
    name = np.asarray(d["name"], dtype=object)
    stay = np.asarray(d["stay_id"], dtype=np.int64)
    val = np.ma.filled(np.ma.asarray(d["value"]).astype(np.float64), np.nan)
    names = sorted(set(name.tolist()))
    first = name == names[0]
    out: dict[str, np.ndarray] = {"stay_id": stay[first], "subject_id": np.asarray(d["subject_id"],
                                                                                    dtype=np.int64)[first]}
    for c in names:
        sel = name == c
        if not np.array_equal(stay[sel], out["stay_id"]):
            raise StudyInputError(f"stay_results of {study!r}: value {c!r} does not cover the same stays")
        out[c] = val[sel]
    return out
