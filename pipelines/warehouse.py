"""Warehouse facts the flows need: existence, content hash, data kind, stays with subjects.

Tasks receive the warehouse *path* and its *content hash* (never DataFrames); the hash keys
their cached results.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

import duckdb

from .errors import WarehouseMissingError

META = "forgetful_meta"


def require(warehouse: str | os.PathLike) -> Path:
    p = Path(warehouse)
    if not p.is_file():
        raise WarehouseMissingError(
            f"warehouse {p} does not exist; build it first with `forgetful build-cohort --warehouse {p}`")
    return p


def _tables(con) -> set[str]:
    return {r[0] for r in con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()").fetchall()}


def content_hash(warehouse: str | os.PathLike) -> str:
    """The stored content hash (``build_info``), recomputed when absent."""
    p = require(warehouse)
    con = duckdb.connect(str(p), read_only=True)
    try:
        if "build_info" in _tables(con):
            row = con.execute("SELECT value FROM build_info WHERE key = 'content_hash'").fetchone()
            if row is not None:
                return str(row[0])
        from cohort.build import content_hash as compute

        return compute(con)
    finally:
        con.close()


def set_data_kind(warehouse: str | os.PathLike, kind: str) -> None:
    """Record what the warehouse holds ("demo", "synthetic", "mimic") for the report."""
    con = duckdb.connect(str(require(warehouse)))
    try:
        con.execute(f"CREATE TABLE IF NOT EXISTS {META} (key VARCHAR PRIMARY KEY, value VARCHAR)")
        con.execute(f"INSERT OR REPLACE INTO {META} VALUES ('data_kind', ?)", [kind])
    finally:
        con.close()


def data_kind(warehouse: str | os.PathLike) -> str:
    """"demo" | "synthetic" | "mimic" (from :func:`set_data_kind`, else from the build source)."""
    con = duckdb.connect(str(require(warehouse)), read_only=True)
    try:
        t = _tables(con)
        if META in t:
            row = con.execute(f"SELECT value FROM {META} WHERE key = 'data_kind'").fetchone()
            if row is not None:
                return str(row[0])
        if "build_info" in t:
            import json

            row = con.execute("SELECT value FROM build_info WHERE key = 'params'").fetchone()
            if row is not None:
                src = json.loads(row[0]).get("source")
                return "demo" if src == "demo" else "mimic"
        return "mimic"
    finally:
        con.close()


def stays(warehouse: str | os.PathLike, split: str | None = None) -> list[tuple[int, int, str, int]]:
    """(stay_id, subject_id, split, n_hours) ascending by stay_id (kept in memory, never logged)."""
    con = duckdb.connect(str(require(warehouse)), read_only=True)
    try:
        q = "SELECT stay_id, subject_id, split, n_hours FROM cohort_stays"
        args = []
        if split is not None:
            q += " WHERE split = ?"
            args.append(split)
        return [(int(a), int(b), str(c), int(d)) for a, b, c, d in con.execute(q + " ORDER BY stay_id", args).fetchall()]
    finally:
        con.close()


@contextlib.contextmanager
def transaction(warehouse: str | os.PathLike) -> Iterator[duckdb.DuckDBPyConnection]:
    """A read-write connection inside one transaction: COMMIT on success, ROLLBACK on any error."""
    con = duckdb.connect(str(warehouse))
    try:
        con.execute("BEGIN TRANSACTION")
        try:
            yield con
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    finally:
        con.close()
