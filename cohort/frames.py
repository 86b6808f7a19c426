"""Polars frames of the user's own warehouse, and a Parquet export.

The warehouse is the user's local data (their MIMIC-IV/CLIF root, the demo or synthetic data),
so these readers return record-level frames — for the user's own analysis, never for a report.
Nothing here logs or prints a value; :func:`export_parquet` writes files readable by the owner
only (mode 0600) and refuses to overwrite.

* :func:`load_stays` — ``cohort_stays`` (one row per stay: ids, times, hours, split)
* :func:`load_hourly` — ``vitals_hourly`` joined with each stay's split (one row per stay-hour)
* :func:`export_parquet` — both frames as Parquet (``forgetful export --out DIR``)

``forgetful export`` opens the warehouse with its writer lock first, so pending erasures of
forgotten patients are completed before anything is read.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cohort.constants import EVENT_COLUMNS, OBSERVED_COLUMNS, VITALS, Z_COLUMNS
from cohort.errors import BadParameterError, InputMissingError
from cohort.streams import check_columns, warehouse_connection

if TYPE_CHECKING:
    import polars as pl

__all__ = ["HOURLY_DEFAULT", "SPLITS", "export_parquet", "load_hourly", "load_stays"]

SPLITS = ("train", "val", "test")
#: default columns of :func:`load_hourly`: filled vitals, z-scores, observed flags, events
HOURLY_DEFAULT: tuple[str, ...] = (*VITALS, *Z_COLUMNS, *OBSERVED_COLUMNS, *EVENT_COLUMNS)


def _check_split(split: str | None) -> None:
    if split is not None and split not in SPLITS:
        raise BadParameterError(f"split must be one of {list(SPLITS)} or None, got {split!r}")


def _frame(con: Any, sql: str, params: list[Any]) -> pl.DataFrame:
    import polars as pl

    # .pl(), not from_arrow(.arrow()): DuckDB >= 1.4 returns a RecordBatchReader there, which polars
    # cannot read when the selection is empty (an empty split); .pl() keeps the columns' types
    frame = con.sql(sql, params=params or None).pl()
    assert isinstance(frame, pl.DataFrame)
    return frame


def load_stays(con_or_path: Any, split: str | None = None) -> pl.DataFrame:
    """``cohort_stays`` as a :class:`polars.DataFrame`, ascending by ``stay_id``.

    Columns: ``stay_id, subject_id, hadm_id, intime, outtime, n_hours, split``.
    """
    _check_split(split)
    with warehouse_connection(con_or_path) as con:
        return _frame(con, "SELECT stay_id, subject_id, hadm_id, intime, outtime, n_hours, split FROM cohort_stays"
                      + (" WHERE split = ?" if split else "") + " ORDER BY stay_id", [split] if split else [])


def load_hourly(con_or_path: Any, columns: Sequence[str] | None = None, split: str | None = None,
                stay_ids: Sequence[int] | None = None) -> pl.DataFrame:
    """The hourly warehouse as a :class:`polars.DataFrame`: ``stay_id, hour, split`` and
    ``columns`` (default :data:`HOURLY_DEFAULT`), ascending by (stay_id, hour).

    Parameters
    ----------
    con_or_path : DuckDB connection or warehouse path
    columns : vitals_hourly columns (``hr``…, ``hr_z``…, ``hr_observed``…, ``event_*``)
    split : ``train`` / ``val`` / ``test`` or None (every stay)
    stay_ids : only these stays (None: all)
    """
    _check_split(split)
    cols = check_columns(HOURLY_DEFAULT if columns is None else columns)
    where: list[str] = []
    params: list[Any] = []
    if split:
        where.append("s.split = ?")
        params.append(split)
    if stay_ids is not None:
        ids = [int(i) for i in stay_ids]
        if not ids:
            raise BadParameterError("stay_ids is empty")
        where.append(f"h.stay_id IN ({', '.join('?' * len(ids))})")
        params.extend(ids)
    sql = (f"SELECT h.stay_id, h.hour, s.split, {', '.join('h.' + c for c in cols)} FROM vitals_hourly h "
           "JOIN cohort_stays s USING (stay_id)" + (" WHERE " + " AND ".join(where) if where else "")
           + " ORDER BY h.stay_id, h.hour")
    with warehouse_connection(con_or_path) as con:
        return _frame(con, sql, params)


def _write_private(frame: pl.DataFrame, path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # owner-only; never overwrite
    with os.fdopen(fd, "wb") as fh:
        frame.write_parquet(fh)


def export_parquet(con_or_path: Any, out_dir: str | os.PathLike, split: str | None = None,
                   columns: Sequence[str] | None = None) -> dict[str, Any]:
    """Write ``stays.parquet`` and ``hourly.parquet`` (owner-only files) into ``out_dir``.

    Returns counts and paths only: ``{"stays", "rows", "files": {name: path}}``.
    Raises :class:`~cohort.errors.BadParameterError` if either file already exists.
    """
    out = Path(out_dir)
    targets = {"stays": out / "stays.parquet", "hourly": out / "hourly.parquet"}
    exists = [p.name for p in targets.values() if p.exists()]
    if exists:
        raise BadParameterError(f"{out} already holds {', '.join(exists)}; choose an empty folder")
    if isinstance(con_or_path, (str, os.PathLike)) and not Path(con_or_path).is_file():
        raise InputMissingError(f"warehouse {con_or_path} does not exist; build it with `forgetful build-cohort`")
    stays = load_stays(con_or_path, split)
    hourly = load_hourly(con_or_path, columns, split)
    out.mkdir(parents=True, exist_ok=True)
    _write_private(stays, targets["stays"])
    _write_private(hourly, targets["hourly"])
    return {"stays": stays.height, "rows": hourly.height, "split": split,
            "files": {k: str(v.resolve()) for k, v in targets.items()}}
