"""Output side of :mod:`cohort.synthetic`: chunk hand-over between worker processes and the
writer, the chartevents writers (Parquet row groups, or concatenated gzip members of CSV), and
the small MIMIC-IV tables (icustays, patients, admissions, d_items) of the generated stays.

A worker encodes its chunk into a spool file (Arrow IPC for Parquet output; a finished gzip
member of CSV rows for ``csv.gz``); the writer appends the spools in chunk order. CSV encoding
and gzip therefore run in the workers, and a multi-member ``.csv.gz`` is one valid gzip file
(RFC 1952) that DuckDB, gzip and pandas read as a whole. Parquet encoding runs in the writer,
one row group per chunk (split at 1 Mi rows), snappy-compressed.
"""
from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

HOUR_US = 3_600_000_000
GZIP_LEVEL = 1  # fastest deflate: the format is what matters, not the last 20 % of size


def _csv_table(t: pa.Table) -> pa.Table:
    """Timestamps as ``YYYY-MM-DD HH:MM:SS`` (MIMIC's CSV form), other columns as they are."""
    cols = [c.cast(pa.timestamp("s")) if pa.types.is_timestamp(c.type) else c for c in t.columns]
    return pa.Table.from_arrays(cols, names=t.column_names)


def csv_member(t: pa.Table, header: bool) -> bytes:
    """One gzip member holding ``t`` as CSV (with the header line when ``header``)."""
    buf = pa.BufferOutputStream()
    pacsv.write_csv(_csv_table(t), buf, pacsv.WriteOptions(include_header=header, quoting_style="needed"))
    return gzip.compress(buf.getvalue().to_pybytes(), compresslevel=GZIP_LEVEL, mtime=0)


def spool_chunk(t: pa.Table, path: Path, fmt: str) -> Path:
    """Worker side: write chunk table ``t`` to spool file ``path`` (see module docstring)."""
    if fmt == "parquet":
        with ipc.new_file(str(path), t.schema) as w:
            w.write_table(t)
    else:
        Path(path).write_bytes(csv_member(t, header=False))
    return Path(path)


class ChartWriter:
    """Writer side: appends chunks, in order, to ``<path_no_ext>.parquet`` or ``.csv.gz`` under a
    temporary name; :meth:`commit` renames it into place, :meth:`abort` removes it."""

    def __init__(self, path_no_ext: Path, schema: pa.Schema, fmt: str):
        if fmt not in ("parquet", "csv.gz"):
            raise ValueError(f"fmt must be 'csv.gz' or 'parquet', got {fmt!r}")
        self.fmt, self.schema = fmt, schema
        path_no_ext.parent.mkdir(parents=True, exist_ok=True)
        self.path = path_no_ext.with_name(f"{path_no_ext.name}.{fmt}")
        self.tmp = self.path.with_name(f".{self.path.name}.partial")
        if fmt == "parquet":
            # snappy (Arrow's default; ~20 % less writer CPU than zstd, ~25 % larger), dictionary
            # pages for the repetitive columns only, statistics where a scan can prune on them
            self.w = pq.ParquetWriter(
                self.tmp, schema, compression="snappy",
                use_dictionary=[f.name for f in schema if not (pa.types.is_timestamp(f.type)
                                                               or pa.types.is_floating(f.type))],
                write_statistics=[n for n in ("subject_id", "hadm_id", "stay_id", "charttime", "itemid", "intime")
                                  if n in schema.names] or False)
        else:
            self.f = open(self.tmp, "wb")
            self.f.write(csv_member(schema.empty_table(), header=True))

    def write_table(self, t: pa.Table) -> None:
        """Append an in-memory chunk (the single-process path)."""
        if self.fmt == "parquet":
            self.w.write_table(t)
        else:
            self.f.write(csv_member(t, header=False))

    def write_spool(self, spool: Path) -> None:
        """Append a worker's spool file (then delete it)."""
        if self.fmt == "parquet":
            with pa.memory_map(str(spool)) as src:
                self.w.write_table(ipc.open_file(src).read_all())
        else:
            with open(spool, "rb") as src:
                shutil.copyfileobj(src, self.f, 1 << 22)
        os.unlink(spool)

    def _close(self) -> None:
        if self.fmt == "parquet":
            self.w.close()
        else:
            self.f.close()

    def commit(self) -> Path:
        self._close()
        os.replace(self.tmp, self.path)
        return self.path

    def abort(self) -> None:
        try:
            self._close()
        finally:
            self.tmp.unlink(missing_ok=True)


def write_table(path_no_ext: Path, t: pa.Table, fmt: str) -> Path:
    """A whole small table to ``<path_no_ext>.<fmt>``."""
    w = ChartWriter(path_no_ext, t.schema, fmt)
    try:
        w.write_table(t)
    except BaseException:
        w.abort()
        raise
    return w.commit()


def small_tables(stays: dict, d_items: list[tuple]) -> dict[str, pa.Table]:
    """icustays, patients, admissions of ``stays`` (arrays ``k``, ``stay_id``, ``hadm_id``,
    ``subject_id``, ``intime``, ``outtime`` in µs) and d_items of ``d_items`` rows."""
    ts = lambda a: pa.array(a, pa.timestamp("us"))  # noqa: E731
    los_d = (stays["outtime"] - stays["intime"]) / (86400 * 1e6)
    units = np.array(["Medical Intensive Care Unit (MICU)", "Surgical Intensive Care Unit (SICU)",
                      "Cardiac Vascular Intensive Care Unit (CVICU)", "Trauma SICU (TSICU)"])
    cu = units[stays["stay_id"] % len(units)]
    icustays = pa.table({
        "subject_id": stays["subject_id"], "hadm_id": stays["hadm_id"], "stay_id": stays["stay_id"],
        "first_careunit": cu, "last_careunit": cu, "intime": ts(stays["intime"]), "outtime": ts(stays["outtime"]),
        "los": np.round(los_d, 6),
    })
    subj = np.unique(stays["subject_id"])
    patients = pa.table({
        "subject_id": subj, "gender": np.where(subj % 2 == 0, "F", "M"),
        "anchor_age": 18 + (subj * 7919) % 72, "anchor_year": 2110 + (subj % 90),
        "anchor_year_group": np.full(subj.size, "2014 - 2016"), "dod": pa.nulls(subj.size, pa.date32()),
    })
    n = stays["k"].size
    admissions = pa.table({
        "subject_id": stays["subject_id"], "hadm_id": stays["hadm_id"],
        "admittime": ts(stays["intime"] - 6 * HOUR_US), "dischtime": ts(stays["outtime"] + 30 * HOUR_US),
        "deathtime": pa.nulls(n, pa.timestamp("us")), "admission_type": np.full(n, "EW EMER."),
        "hospital_expire_flag": np.zeros(n, dtype=np.int64),
    })
    names = ["itemid", "label", "abbreviation", "linksto", "category", "unitname", "param_type",
             "lownormalvalue", "highnormalvalue"]
    d_items_t = pa.table({nm: [r[j] for r in d_items] for j, nm in enumerate(names)},
                         schema=pa.schema([("itemid", pa.int64())] + [(nm, pa.string()) for nm in names[1:7]]
                                          + [("lownormalvalue", pa.float64()), ("highnormalvalue", pa.float64())]))
    return {"icu/icustays": icustays, "hosp/patients": patients, "hosp/admissions": admissions,
            "icu/d_items": d_items_t}
