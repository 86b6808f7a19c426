"""Output side of :mod:`cohort.synthetic`: the streaming chartevents writer and the small
MIMIC-IV tables (icustays, patients, admissions, d_items) of the generated stays."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

HOUR_US = 3_600_000_000


class _Writer:
    """Streams tables to ``<path>.csv.gz`` or ``<path>.parquet`` chunk by chunk."""

    def __init__(self, path_no_ext: Path, schema: pa.Schema, fmt: str):
        self.fmt = fmt
        self.schema = schema
        path_no_ext.parent.mkdir(parents=True, exist_ok=True)
        if fmt == "parquet":
            self.path = path_no_ext.with_name(path_no_ext.name + ".parquet")
            self.w = pq.ParquetWriter(self.path, schema, compression="zstd")
        else:
            self.path = path_no_ext.with_name(path_no_ext.name + ".csv.gz")
            self.stream = pa.CompressedOutputStream(str(self.path), "gzip")
            self.csv_schema = pa.schema([pa.field(f.name, pa.string() if pa.types.is_timestamp(f.type) else f.type)
                                         for f in schema])
            self.w = pacsv.CSVWriter(self.stream, self.csv_schema,
                                     write_options=pacsv.WriteOptions(quoting_style="needed"))

    def write(self, t: pa.Table) -> None:
        if self.fmt == "parquet":
            self.w.write_table(t)
            return
        cols = []
        for f in t.schema:
            c = t[f.name]
            if pa.types.is_timestamp(f.type):
                c = pc.strftime(c.cast(pa.timestamp("s")), format="%Y-%m-%d %H:%M:%S")
            cols.append(c)
        self.w.write_table(pa.Table.from_arrays(cols, schema=self.csv_schema))

    def close(self) -> None:
        self.w.close()
        if self.fmt != "parquet":
            self.stream.close()


def _small_tables(stays: dict, vital_items: dict, other_items: dict) -> dict[str, pa.Table]:
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
    subj, first = np.unique(stays["subject_id"], return_index=True)
    patients = pa.table({
        "subject_id": subj, "gender": np.where(subj % 2 == 0, "F", "M"),
        "anchor_age": 18 + (subj * 7919) % 72, "anchor_year": 2110 + (subj % 90),
        "anchor_year_group": np.full(subj.size, "2014 - 2016"), "dod": pa.nulls(subj.size, pa.date32()),
    })
    admissions = pa.table({
        "subject_id": stays["subject_id"], "hadm_id": stays["hadm_id"],
        "admittime": ts(stays["intime"] - 6 * HOUR_US), "dischtime": ts(stays["outtime"] + 30 * HOUR_US),
        "deathtime": pa.nulls(stays["k"].size, pa.timestamp("us")),
        "admission_type": np.full(stays["k"].size, "EW EMER."),
        "hospital_expire_flag": np.zeros(stays["k"].size, dtype=np.int64),
    })
    items = [(i, lab, ab, "chartevents", cat, u, "Numeric", None, None) for i, (lab, ab, u, cat) in vital_items.items()]
    items += [(i, v[0], v[1], "chartevents", v[3], v[2], "Text" if v[6] else "Numeric", None, None)
              for i, v in other_items.items()]
    names = ["itemid", "label", "abbreviation", "linksto", "category", "unitname", "param_type",
             "lownormalvalue", "highnormalvalue"]
    d_items = pa.table({nm: [r[j] for r in items] for j, nm in enumerate(names)},
                       schema=pa.schema([("itemid", pa.int64())] + [(nm, pa.string()) for nm in names[1:7]]
                                        + [("lownormalvalue", pa.float64()), ("highnormalvalue", pa.float64())]))
    return {"icu/icustays": icustays, "hosp/patients": patients, "hosp/admissions": admissions, "icu/d_items": d_items}
