"""Hourly vital-sign streams of a MEDS dataset, one per prediction time, built from the events up to
that time only: the input of the MEDS-DEV model entries (``forgetful meds-dev``, docs/MEDS.md).

A MEDS-DEV task is a set of label rows ``(subject_id, prediction_time, boolean_value)`` (ACES
writes them); a model may read a subject's events at or before each row's prediction time, never
after. For a row with prediction time T and lookback L hours, hour bin k (k = 0 … L−1, the row's
hour L−1−k) holds the events with ``T − (k+1)·1 h < time <= T − k·1 h``: the most recent hour is
the last. An event later than T, or one without a time, is never read; which bins exist depends
on T alone, so deleting every later event changes nothing (``tests/test_meds_dev.py``).

What a bin holds, per vital: the mean of the values of the codes the code map reads
(:class:`cohort.meds.CodeMap`: this project's ``HOURLY_MEAN//…`` codes, MIMIC_IV_MEDS'
``LAB//<itemid>//<unit>``, or ``--meds-codes``), after the build's unit conversion and
plausibility rule (:mod:`cohort.conventions`); blood pressure as the mean of the arterial and the
non-invasive means, as the warehouse does. A bin with no such value is NaN (unobserved). Any
subject's events count, whatever its stays: the stay column is not needed.

The split of a subject is ``metadata/subject_splits.parquet``'s (MEDS names ``train``, ``tuning``,
``held_out``), or, without that file, the folder of its shards (``data/<split>/…``). Label rows are
read from every ``*.parquet`` under the labels folder, in path order, and kept in their order.
Arrays are (rows, L, 6) float64: memory grows with rows × L.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from cohort.constants import VITALS
from cohort.conventions import SEED, get_convention
from cohort.errors import BadParameterError, ColumnTypeError, InputMissingError, MissingColumnsError, redact
from cohort.meds import CodeMap, check_meds_root, load_code_map

HOUR_US = 3_600_000_000
#: the default lookback (hours of the stream ending at each prediction time)
LOOKBACK = 48
#: MEDS's split names
SPLITS = ("train", "tuning", "held_out")
LABEL_COLUMNS = ("subject_id", "prediction_time", "boolean_value")
#: label rows per DuckDB query (bounds the join's working set)
CHUNK_ROWS = 50_000


def _sql_str(s) -> str:
    return "'" + str(s).replace("'", "''") + "'"


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise BadParameterError(f"split must be one of {', '.join(SPLITS)} (MEDS names), got {split!r}")


def split_subjects(root: str | Path, split: str) -> np.ndarray:
    """Subject ids (int64, sorted) of ``split``: ``metadata/subject_splits.parquet``, else the
    subjects of the shards under ``data/<split>/``."""
    import duckdb

    _check_split(split)
    root = Path(root)
    meta = root / "metadata" / "subject_splits.parquet"
    con = duckdb.connect()
    try:
        if meta.is_file():
            q = (f"SELECT DISTINCT CAST(subject_id AS BIGINT) AS s FROM read_parquet({_sql_str(meta)}) "
                 f"WHERE split = {_sql_str(split)} ORDER BY s")
        else:
            shards = [f for f in check_meds_root(root, require_stay=False)[0]
                      if f.relative_to(root / "data").parts[0] == split]
            if not shards:
                return np.empty(0, np.int64)
            files = ", ".join(_sql_str(f) for f in shards)
            q = f"SELECT DISTINCT CAST(subject_id AS BIGINT) AS s FROM read_parquet([{files}]) ORDER BY s"
        try:
            return np.asarray(con.execute(q).fetchnumpy()["s"], dtype=np.int64)
        except duckdb.Error as exc:
            raise InputMissingError(f"{meta}: the subject splits cannot be read ({type(exc).__name__}: "
                                    f"{redact(str(exc).splitlines()[0][:200])})") from None
    finally:
        con.close()


def read_labels(labels_dir: str | Path, subjects: np.ndarray | None = None):
    """Label rows of every ``*.parquet`` under ``labels_dir`` (path order, rows in order) as a Polars
    frame ``subject_id`` int64, ``prediction_time`` datetime[us], ``boolean_value`` bool; only the
    rows of ``subjects`` when given. Raises InputMissingError (no label file), MissingColumnsError
    or ColumnTypeError."""
    import polars as pl
    import pyarrow.parquet as pq

    d = Path(labels_dir)
    files = sorted(f for f in d.rglob("*.parquet") if f.is_file()) if d.is_dir() else []
    if not files:
        raise InputMissingError(f"labels folder {d}: no *.parquet label files (the ACES output of the task)")
    frames = []
    for f in files:
        names = pq.read_schema(f).names
        missing = [c for c in LABEL_COLUMNS if c not in names]
        if missing:
            raise MissingColumnsError(str(f), missing, names)
        frames.append(pl.read_parquet(f, columns=list(LABEL_COLUMNS)))
    lab = pl.concat(frames, how="vertical_relaxed")
    try:
        lab = lab.with_columns(pl.col("subject_id").cast(pl.Int64, strict=True),
                               pl.col("prediction_time").cast(pl.Datetime("us"), strict=True),
                               pl.col("boolean_value").cast(pl.Boolean, strict=True))
    except pl.exceptions.PolarsError as exc:
        raise ColumnTypeError(f"labels in {d}: subject_id must be an integer, prediction_time a timestamp and "
                              f"boolean_value a boolean ({type(exc).__name__})") from None
    if lab["subject_id"].null_count() or lab["prediction_time"].null_count():
        raise ColumnTypeError(f"labels in {d}: a row without subject_id or prediction_time")
    if subjects is not None:
        lab = lab.filter(pl.col("subject_id").is_in(np.asarray(subjects, dtype=np.int64).tolist()))
    return lab


def hourly_streams(root: str | Path, labels, lookback: int = LOOKBACK, codes: str | Path | dict | CodeMap | None = None,
                   convention: str = SEED, chunk_rows: int = CHUNK_ROWS) -> np.ndarray:
    """The stream of every label row (module docstring): (rows, ``lookback``, 6) float64 hourly means
    in :data:`~cohort.constants.VITALS` order, NaN where nothing was charted; row i ends at row i's
    prediction time. ``labels``: a frame with ``subject_id`` and ``prediction_time`` (:func:`read_labels`)."""
    import duckdb
    import pyarrow as pa

    if int(lookback) < 1:
        raise BadParameterError(f"lookback must be at least 1 hour, got {lookback}")
    L = int(lookback)
    conv = get_convention(convention)
    cmap = load_code_map(codes, conv)
    shards, _ = check_meds_root(root, cmap, require_stay=False)
    out = np.full((labels.height, L, len(VITALS)), np.nan)
    if labels.height == 0:
        return out
    match, vital, src, unit_f = cmap.case_sql("code")
    reader = f"read_parquet([{', '.join(_sql_str(f) for f in shards)}], union_by_name = true)"
    sql = f"""
        WITH lab AS (SELECT r, subject_id, epoch_us(prediction_time) AS pt FROM _meds_labels),
        ev AS (SELECT CAST(subject_id AS BIGINT) AS subject_id, epoch_us(time) AS ts,
                      CAST(numeric_value AS DOUBLE) AS value, {match} AS k
               FROM {reader}
               WHERE time IS NOT NULL AND numeric_value IS NOT NULL
                 AND CAST(subject_id AS BIGINT) IN (SELECT subject_id FROM lab)),
        m AS (SELECT lab.r, (lab.pt - ev.ts) // {HOUR_US} AS b, {vital} AS vital, {src} AS src, ev.value,
                     {unit_f} AS unit_f
              FROM ev JOIN lab ON ev.subject_id = lab.subject_id
              WHERE ev.k IS NOT NULL AND ev.ts <= lab.pt AND ev.ts > lab.pt - {L * HOUR_US}),
        c AS (SELECT r, b, vital, src, {conv.value_sql()} AS value, unit_f FROM m),
        per_src AS (SELECT r, b, vital, src, avg(value) AS v FROM c
                    WHERE {conv.plausible_case_sql('value', 'vital')} GROUP BY r, b, vital, src)
        SELECT r, b, vital, avg(v) AS v FROM per_src GROUP BY r, b, vital
    """
    order = np.argsort(labels["subject_id"].to_numpy(), kind="stable")  # a chunk holds few subjects
    con = duckdb.connect()
    try:
        for i in range(0, order.size, int(chunk_rows)):
            rows = order[i:i + int(chunk_rows)]
            part = labels[rows.tolist()].select("subject_id", "prediction_time").to_arrow()
            con.register("_meds_labels", part.append_column("r", pa.array(rows, pa.int64())))
            try:
                d = con.execute(sql).fetchnumpy()
            finally:
                con.unregister("_meds_labels")
            r, b = np.asarray(d["r"], np.int64), np.asarray(d["b"], np.int64)
            out[r, L - 1 - b, np.asarray(d["vital"], np.int64)] = np.asarray(d["v"], np.float64)
    finally:
        con.close()
    return out


__all__ = ["HOUR_US", "LOOKBACK", "SPLITS", "hourly_streams", "read_labels", "split_subjects"]
