"""The warehouse as a MEDS v0.4 dataset (``forgetful export --format meds --out DIR``).

Writes ``data/<split>/<k>.parquet`` (one event per row: ``subject_id`` int64, ``time``
timestamp[us], ``code``, ``numeric_value`` float32, ``hadm_id``, ``icustay_id``; splits ``train``,
``tuning``, ``held_out``; at most ``shard_subjects`` subjects per shard, events sorted by time) and
``metadata/`` (``codes.parquet``, ``subject_splits.parquet``, ``dataset.json``), owner-only and never
overwriting. Per stay: ``ICU_ADMISSION//UNK`` / ``ICU_DISCHARGE//UNK`` at its bounds and one
``HOURLY_MEAN//<VITAL>//<unit>`` event per *observed* vital and hour (never a filled value), stamped
at the end of its hour so a model predicting at time T never sees a value charted after T. The
shards are record-level data, like the Parquet export:
``forgetful export`` registers the folder so ``forgetful forget`` erases a patient from it too
(:mod:`pipelines.store.exports`). docs/MEDS.md has every file and code.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from cohort.constants import VITALS
from cohort.conventions import ITEM_LABELS, SEED, get_convention
from cohort.errors import BadParameterError, InputMissingError
from cohort.meds import HOURLY_CODES, ICU_ADMISSION, ICU_DISCHARGE, MEDS_SPLIT, MEDS_VERSION, chartevents_code

ADMISSION_CODE, DISCHARGE_CODE = f"{ICU_ADMISSION}//UNK", f"{ICU_DISCHARGE}//UNK"
#: every file and folder name the export writes at the top of its folder
TOP = ("data", "metadata")
_NAMES = {"hr": "Heart rate", "sbp": "Systolic blood pressure", "dbp": "Diastolic blood pressure",
          "rr": "Respiratory rate", "spo2": "Peripheral oxygen saturation (SpO2)", "temp_c": "Temperature"}


def data_schema():
    """The pyarrow schema of the data shards (``meds.DataSchema`` plus the two raw-id columns)."""
    import pyarrow as pa

    return pa.schema([pa.field("subject_id", pa.int64(), nullable=False), ("time", pa.timestamp("us")),
                      pa.field("code", pa.string(), nullable=False), ("numeric_value", pa.float32()),
                      ("hadm_id", pa.int64()), ("icustay_id", pa.int64())])


def codes_table(convention: str = SEED):
    """``metadata/codes.parquet``: code, description, parent_codes (``meds.CodeMetadataSchema``)."""
    import pyarrow as pa

    conv = get_convention(convention)
    rows: list[tuple[str, str, list[str] | None]] = [
        (ADMISSION_CODE, "ICU admission: the stay's intime (MIMIC-IV icustays.intime); care unit not kept", None),
        (DISCHARGE_CODE, "ICU discharge: the stay's outtime (MIMIC-IV icustays.outtime); care unit not kept", None)]
    for v in VITALS:
        items = [(i, unit) for i, (vv, _, unit) in conv.itemids.items() if vv == v]
        named = "; ".join(f"{i} {ITEM_LABELS[i]}" for i, _ in items)
        unit = HOURLY_CODES[v].rsplit("//", 1)[1]
        rows.append((HOURLY_CODES[v],
                     f"{_NAMES[v]} ({unit}), hourly mean of the observed plausible values of one ICU stay-hour; "
                     f"MIMIC-IV chartevents itemids {named}"
                     + ("; °F converted to °C" if v == "temp_c" else "")
                     + ("; arterial and non-invasive hourly means averaged" if v in ("sbp", "dbp") else "")
                     + "; time = the end of the hour window",
                     [chartevents_code(i, u) for i, u in items]))
    schema = pa.schema([pa.field("code", pa.string(), nullable=False), ("description", pa.string()),
                        ("parent_codes", pa.list_(pa.string()))])
    return pa.Table.from_pylist([dict(zip(schema.names, r)) for r in rows], schema=schema)


def _write_private(path: Path, write) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        write(fh)


def _events_sql() -> str:
    """Events of the subjects in the registered table ``_meds_subjects`` (ordered)."""
    hour_us = 3_600_000_000
    parts = [f"SELECT subject_id, intime AS time, '{ADMISSION_CODE}' AS code, CAST(NULL AS FLOAT) AS numeric_value, "
             "hadm_id, stay_id AS icustay_id, 0 AS ord FROM s",
             f"SELECT subject_id, outtime, '{DISCHARGE_CODE}', CAST(NULL AS FLOAT), hadm_id, stay_id, 9 FROM s"]
    for j, v in enumerate(VITALS):
        parts.append(f"SELECT subject_id, time, '{HOURLY_CODES[v].replace(chr(39), chr(39) * 2)}', CAST({v} AS FLOAT), "
                     f"hadm_id, stay_id, {j + 1} FROM hv WHERE {v}_observed")
    observed = " OR ".join(f"h.{v}_observed" for v in VITALS)
    sql = (
        "WITH s AS (SELECT c.stay_id, c.subject_id, c.hadm_id, c.intime, c.outtime FROM cohort_stays c "
        "JOIN _meds_subjects USING (subject_id)), "
        "hv AS (SELECT s.subject_id, s.stay_id, s.hadm_id, "
        f"least(s.intime + to_microseconds((h.hour + 1) * CAST({hour_us} AS BIGINT) - 1), s.outtime) AS time, "
        + ", ".join(f"h.{v}, h.{v}_observed" for v in VITALS)
        + f" FROM vitals_hourly h JOIN s USING (stay_id) WHERE {observed}) "
        "SELECT subject_id, time, code, numeric_value, hadm_id, icustay_id FROM ("
        + " UNION ALL ".join(parts) + ") ORDER BY subject_id, time, ord, icustay_id")
    return sql


def export_meds(con_or_path: Any, out_dir: str | os.PathLike, split: str | None = None,
                shard_subjects: int = 10_000, dataset_name: str = "forgetful cohort",
                etl_version: str | None = None) -> dict[str, Any]:
    """Write the warehouse as a MEDS v0.4 dataset into ``out_dir`` (docs/MEDS.md).

    Parameters
    ----------
    con_or_path : DuckDB connection or warehouse path
    out_dir : folder; must not hold ``data`` or ``metadata`` yet (created if absent)
    split : only the subjects of this split (``train``/``val``/``test``; None: all)
    shard_subjects : at most this many subjects per data shard
    dataset_name, etl_version : written to ``metadata/dataset.json``

    Returns counts and the folder only: ``{"format", "subjects", "stays", "rows", "observed_values",
    "shards", "split", "root"}``. Raises :class:`BadParameterError` (a taken folder, a bad
    parameter) before anything is written.
    """
    import duckdb
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if split is not None and split not in MEDS_SPLIT:
        raise BadParameterError(f"split must be one of {list(MEDS_SPLIT)} or None, got {split!r}")
    if int(shard_subjects) < 1:
        raise BadParameterError(f"shard_subjects must be ≥ 1, got {shard_subjects}")
    out = Path(out_dir)
    taken = [n for n in TOP if os.path.lexists(out / n)]
    if taken:
        raise BadParameterError(f"{out} already holds {', '.join(taken)}; choose an empty folder")
    own = isinstance(con_or_path, (str, os.PathLike))
    if own and not Path(con_or_path).is_file():
        raise InputMissingError(f"warehouse {con_or_path} does not exist; build it with `forgetful build-cohort`")
    con = duckdb.connect(str(con_or_path), read_only=True) if own else con_or_path
    try:
        info = dict(con.execute("SELECT key, value FROM build_info").fetchall())
        convention = json.loads(info.get("params") or "{}").get("convention", SEED)
        subj = con.execute("SELECT subject_id, min(split) FROM cohort_stays" + (" WHERE split = ?" if split else "")
                           + " GROUP BY subject_id ORDER BY subject_id", [split] if split else []).fetchall()
        n_stays = con.execute("SELECT count(*) FROM cohort_stays" + (" WHERE split = ?" if split else ""),
                              [split] if split else []).fetchall()[0][0]
        out.mkdir(parents=True, exist_ok=True)
        (out / "data").mkdir(mode=0o700)
        (out / "metadata").mkdir(mode=0o700)
        schema = data_schema()
        sql = _events_sql()
        n_rows = n_obs = n_shards = 0
        for ours in ("train", "val", "test"):
            ids = [s for s, sp in subj if sp == ours]
            for k in range(0, len(ids), int(shard_subjects)):
                chunk = pa.table({"subject_id": pa.array(ids[k:k + int(shard_subjects)], pa.int64())})
                con.register("_meds_subjects", chunk)
                try:
                    table = con.sql(sql).to_arrow_table().cast(schema)
                finally:
                    con.unregister("_meds_subjects")
                folder = out / "data" / MEDS_SPLIT[ours]
                folder.mkdir(mode=0o700, exist_ok=True)
                _write_private(folder / f"{k // int(shard_subjects)}.parquet",
                               lambda fh, t=table: pq.write_table(t, fh))
                n_rows += table.num_rows
                n_obs += pc.sum(pc.starts_with(table.column("code"), "HOURLY_MEAN//")).as_py() or 0
                n_shards += 1
        meta = out / "metadata"
        _write_private(meta / "codes.parquet", lambda fh: pq.write_table(codes_table(convention), fh))
        splits = pa.table({"subject_id": pa.array([s for s, _ in subj], pa.int64()),
                           "split": pa.array([MEDS_SPLIT[sp] for _, sp in subj], pa.string())})
        _write_private(meta / "subject_splits.parquet", lambda fh: pq.write_table(splits, fh))
        dataset = {"dataset_name": dataset_name, "dataset_version": info.get("content_hash", ""),
                   "etl_name": "forgetful", "etl_version": etl_version or _etl_version(),
                   "meds_version": MEDS_VERSION, "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "raw_source_id_columns": ["hadm_id", "icustay_id"]}
        _write_private(meta / "dataset.json", lambda fh: fh.write(json.dumps(dataset, indent=1).encode()))
    finally:
        if own:
            con.close()
    return {"format": "meds", "subjects": len(subj), "stays": int(n_stays), "rows": n_rows, "observed_values": n_obs,
            "shards": n_shards, "split": split, "root": str(out.resolve())}


def _etl_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("forgetful-attention")
    except PackageNotFoundError:
        return "unknown"


def observed_hourly(con_or_path: Any):
    """Every observed hourly value of a warehouse as a Polars frame ``subject_id, intime, hour,
    vital, value`` (the round-trip key: subject, ICU admission time, hour), for tests and checks."""
    import duckdb
    import polars as pl

    own = isinstance(con_or_path, (str, os.PathLike))
    con = duckdb.connect(str(con_or_path), read_only=True) if own else con_or_path
    try:
        sql = " UNION ALL ".join(
            f"SELECT s.subject_id, s.intime, h.hour, '{v}' AS vital, h.{v} AS value FROM vitals_hourly h "
            f"JOIN cohort_stays s USING (stay_id) WHERE h.{v}_observed" for v in VITALS)
        frame = pl.from_arrow(con.sql(sql + " ORDER BY subject_id, intime, hour, vital").to_arrow_table())
    finally:
        if own:
            con.close()
    assert isinstance(frame, pl.DataFrame)
    return frame


__all__ = ["ADMISSION_CODE", "DISCHARGE_CODE", "codes_table", "data_schema", "export_meds",
           "observed_hourly"]
