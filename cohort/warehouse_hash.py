"""The content hash of a warehouse: sha256 over the ordered contents of its output tables.

:func:`content_hash` is what ``build_info`` records and what a rebuild, a forget and an ingest
compare; :class:`TableHasher` is its per-column hasher, which the build feeds the rows it writes
(in hash order) so ``vitals_hourly`` need not be read back.
"""
from __future__ import annotations

import hashlib
from typing import Any

import duckdb
import numpy as np


class TableHasher:
    """One sha256 per column of a table, fed Arrow record batches in the table's hash order."""

    def __init__(self, columns: list[str]):
        self.columns = list(columns)
        self.hashers = {c: hashlib.sha256() for c in self.columns}
        self.rows = 0

    def update(self, batch) -> None:
        self.rows += batch.num_rows
        for name, arr in zip(batch.schema.names, batch.columns):
            h = self.hashers.get(name)
            if h is None:
                continue
            if arr.type == "string" or str(arr.type) in ("string", "large_string"):
                h.update("\0".join("" if x is None else x for x in arr.to_pylist()).encode())
                h.update(b"\1")
            else:
                npv = arr.to_numpy(zero_copy_only=False)
                if npv.dtype == bool:
                    npv = npv.astype(np.uint8)
                if npv.dtype.kind == "f":
                    npv = np.round(np.nan_to_num(npv.astype(np.float64), nan=-1e300), 6) + 0.0
                h.update(np.ascontiguousarray(npv).tobytes())

    def combine(self, outer, table: str) -> None:
        outer.update(table.encode())
        for c in self.columns:
            outer.update(c.encode() + self.hashers[c].digest())


HASH_ORDER = {"cohort_stays": "stay_id", "vitals_hourly": "stay_id, hour", "standardisation": "vital"}


def scalar(con: duckdb.DuckDBPyConnection, sql: str) -> Any:
    """The single value of a one-row, one-column query (the result is fully fetched)."""
    rows = con.execute(sql).fetchall()
    return rows[0][0] if rows else None


def content_hash(con: duckdb.DuckDBPyConnection, schema: str = "", precomputed: dict | None = None) -> str:
    """sha256 over the ordered contents of the output tables, one hasher per column.

    Timestamps hash as int64 microseconds, booleans as uint8, strings as UTF-8 with a NUL
    separator, floats rounded to 6 decimals (parallel aggregation may change the last bits of
    a mean); the ``_z`` columns are left out (they are a function of the raw column and the
    hashed ``standardisation``). The final digest combines the per-column digests in order.
    ``precomputed`` (table → :class:`TableHasher`) is the build's own hash of a table it
    has just written in hash order (``vitals_hourly``), so that table is not read back.
    """
    outer = hashlib.sha256()
    for table, order in HASH_ORDER.items():
        cols = [r[0] for r in con.execute(f"DESCRIBE {schema}{table}").fetchall() if not r[0].endswith("_z")]
        th = (precomputed or {}).get(table)
        if th is None or th.columns != cols or th.rows != scalar(con, f"SELECT count(*) FROM {schema}{table}"):
            th = TableHasher(cols)
            sel = ", ".join(
                f"epoch_us({c}) AS {c}" if c in ("intime", "outtime") else c for c in cols
            )
            for batch in con.sql(f"SELECT {sel} FROM {schema}{table} ORDER BY {order}").to_arrow_reader(1_000_000):
                th.update(batch)
        th.combine(outer, table)
    return outer.hexdigest()

