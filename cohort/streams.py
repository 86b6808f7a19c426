"""Readers of the warehouse: one stay's hourly matrix, or every stay in turn.

The z-scored vitals in hour order are the support-vector gate's keys; raw (filled) values,
observed flags and event labels come alongside.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np

from cohort.constants import EVENT_COLUMNS, OBSERVED_COLUMNS, VITALS, Z_COLUMNS
from cohort.errors import BadParameterError, InputMissingError, UnknownStayError

_ALL_COLUMNS = set(VITALS) | set(OBSERVED_COLUMNS) | set(Z_COLUMNS) | set(EVENT_COLUMNS)


@contextlib.contextmanager
def warehouse_connection(con_or_path):
    """Yield a connection: the caller's (left open) or a read-only one on a path (closed)."""
    if isinstance(con_or_path, duckdb.DuckDBPyConnection):
        yield con_or_path
        return
    p = Path(con_or_path)
    if not p.is_file():
        raise InputMissingError(f"warehouse {p} does not exist; build it with `python -m cohort.build`")
    con = duckdb.connect(str(p), read_only=True)
    try:
        yield con
    finally:
        con.close()


def check_columns(columns: Sequence[str]) -> list[str]:
    cols = list(columns)
    bad = [c for c in cols if c not in _ALL_COLUMNS]
    if bad or not cols:
        raise BadParameterError(f"unknown vitals_hourly column(s) {bad}; choose from {sorted(_ALL_COLUMNS)}")
    return cols


def load_stay_matrix(con_or_path, stay_id: int, columns: Sequence[str] = Z_COLUMNS) -> tuple[np.ndarray, np.ndarray]:
    """Hourly matrix of one stay.

    Parameters
    ----------
    con_or_path : DuckDB connection or warehouse path
    stay_id : int
    columns : names from vitals_hourly (default: the six ``_z`` columns)

    Returns
    -------
    hours : ndarray of int64, shape (n_hours,), ascending 0..n_hours-1
    X : ndarray of float64, shape (n_hours, len(columns)) (booleans as 0.0/1.0)
    """
    cols = check_columns(columns)
    sel = ", ".join(f"CAST({c} AS DOUBLE)" for c in cols)
    with warehouse_connection(con_or_path) as con:
        rows = con.execute(
            f"SELECT hour, {sel} FROM vitals_hourly WHERE stay_id = ? ORDER BY hour", [int(stay_id)]
        ).fetchnumpy()
    hours = np.asarray(rows["hour"], dtype=np.int64)
    if hours.size == 0:
        raise UnknownStayError(f"stay {stay_id} is not in the warehouse")
    keys = [k for k in rows if k != "hour"]
    X = np.column_stack([np.asarray(rows[k], dtype=np.float64) for k in keys])
    return hours, X


@dataclass
class StayStream:
    """One stay's hourly stream.

    hours : (n_hours,) int64; z : (n_hours, 6) float64 standardised vitals (VITALS order);
    raw : (n_hours, 6) float64 filled raw values; observed : (n_hours, 6) bool;
    event_composite, event_spo2 : (n_hours,) bool.
    """

    stay_id: int
    subject_id: int
    split: str
    hours: np.ndarray
    z: np.ndarray
    raw: np.ndarray
    observed: np.ndarray
    event_composite: np.ndarray
    event_spo2: np.ndarray

    def keys(self, drop: Sequence[str] = ()) -> np.ndarray:
        """z-scored vitals without the ``drop`` vitals (e.g. ``("spo2",)``), shape (n_hours, 6-len(drop))."""
        idx = [i for i, v in enumerate(VITALS) if v not in set(drop)]
        return self.z[:, idx]


def list_stays(con_or_path, split: str | None = None) -> list[int]:
    """Stay ids of the warehouse (optionally of one split), ascending."""
    with warehouse_connection(con_or_path) as con:
        if split is None:
            return [r[0] for r in con.execute("SELECT stay_id FROM cohort_stays ORDER BY stay_id").fetchall()]
        return [r[0] for r in con.execute(
            "SELECT stay_id FROM cohort_stays WHERE split = ? ORDER BY stay_id", [split]).fetchall()]


def iter_stays(con_or_path, split: str | None = None, stay_ids: Sequence[int] | None = None,
               batch_stays: int = 500) -> Iterator[StayStream]:
    """Yield :class:`StayStream` for every stay (ascending stay_id), optionally one split or a
    given list of stays. Reads ``batch_stays`` stays per query."""
    cols = list(VITALS) + list(Z_COLUMNS) + list(OBSERVED_COLUMNS) + list(EVENT_COLUMNS)
    with warehouse_connection(con_or_path) as con:
        where, params = [], []
        if split is not None:
            where.append("split = ?")
            params.append(split)
        meta = con.execute(
            "SELECT stay_id, subject_id, split FROM cohort_stays" + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY stay_id", params).fetchall()
        if stay_ids is not None:
            wanted = {int(s) for s in stay_ids}
            meta = [m for m in meta if m[0] in wanted]
        for i in range(0, len(meta), batch_stays):
            chunk = meta[i:i + batch_stays]
            ids = [m[0] for m in chunk]
            d = con.execute(
                f"SELECT stay_id, hour, {', '.join(cols)} FROM vitals_hourly WHERE stay_id IN "
                f"(SELECT unnest(?::BIGINT[])) ORDER BY stay_id, hour", [ids]).fetchnumpy()
            sid = np.asarray(d["stay_id"], dtype=np.int64)
            bounds = np.searchsorted(sid, ids + [np.iinfo(np.int64).max], side="left")
            for j, (stay, subject, spl) in enumerate(chunk):
                a, b = bounds[j], bounds[j + 1]
                sl = slice(a, b)
                yield StayStream(
                    stay_id=int(stay), subject_id=int(subject), split=spl,
                    hours=np.asarray(d["hour"][sl], dtype=np.int64),
                    z=np.column_stack([np.asarray(d[c][sl], dtype=np.float64) for c in Z_COLUMNS]),
                    raw=np.column_stack([np.asarray(d[c][sl], dtype=np.float64) for c in VITALS]),
                    observed=np.column_stack([np.asarray(d[c][sl], dtype=bool) for c in OBSERVED_COLUMNS]),
                    event_composite=np.asarray(d["event_composite"][sl], dtype=bool),
                    event_spo2=np.asarray(d["event_spo2"][sl], dtype=bool),
                )
