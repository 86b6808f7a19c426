"""Warehouse facts read from the DuckDB file itself (no lock, key or ledger involved).

The meta table (``forgetful_meta``), the task-cache location, the tables present, the stored
content hash, what the warehouse holds (demo / synthetic / mimic), its stays, and transaction
helpers. :mod:`pipelines.store.warehouse` re-exports every name; the ledger, the task cache and the
erasure code use this module directly (they sit below the :class:`pipelines.store.warehouse.Warehouse`
handle, which opens them).
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import duckdb

from pipelines.errors import WarehouseMissingError

META = "forgetful_meta"


def cache_dir(warehouse: str | os.PathLike) -> Path:
    """The task cache of a warehouse: ``.<name>.cache`` beside it (located from the warehouse,
    never from the current directory), removed by every forget."""
    p = Path(warehouse).resolve()
    return p.parent / f".{p.name}.cache"


def subjects_present(con) -> set[int]:
    """Every subject id held by any table of the warehouse (connection ``con``)."""
    out: set[int] = set()
    for (t,) in con.execute("SELECT table_name FROM duckdb_columns() WHERE column_name = 'subject_id' "
                            "AND schema_name = current_schema() AND database_name = current_database()").fetchall():
        out.update(int(r[0]) for r in con.execute(f"SELECT DISTINCT subject_id FROM {t}").fetchall()
                   if r[0] is not None)
    return out


def read_meta(warehouse: str | os.PathLike) -> dict[str, str]:
    """Every key of the warehouse's meta table (empty when it has none)."""
    con = duckdb.connect(str(warehouse), read_only=True)
    try:
        if META not in table_names(con):
            return {}
        return {str(k): str(v) for k, v in con.execute(f"SELECT key, value FROM {META}").fetchall()}
    finally:
        con.close()


def put_meta(con, key: str, value: str) -> None:
    con.execute(f"CREATE TABLE IF NOT EXISTS {META} (key VARCHAR PRIMARY KEY, value VARCHAR)")
    con.execute(f"INSERT OR REPLACE INTO {META} VALUES (?, ?)", [key, value])


def get_meta(con, key: str) -> str | None:
    if META not in table_names(con):
        return None
    row = con.execute(f"SELECT value FROM {META} WHERE key = ?", [key]).fetchone()
    return None if row is None else str(row[0])


def require(warehouse: str | os.PathLike) -> Path:
    p = Path(warehouse)
    if not p.is_file():
        raise WarehouseMissingError.at(p)
    return p


def table_names(con) -> set[str]:
    return {r[0] for r in con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()").fetchall()}


def content_hash(warehouse: str | os.PathLike) -> str:
    """The stored content hash (``build_info``), recomputed when absent."""
    p = require(warehouse)
    con = duckdb.connect(str(p), read_only=True)
    try:
        if "build_info" in table_names(con):
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
        t = table_names(con)
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
        return [(int(a), int(b), str(c), int(d))
                for a, b, c, d in con.execute(q + " ORDER BY stay_id", args).fetchall()]
    finally:
        con.close()


@contextlib.contextmanager
def in_transaction(con: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    """``BEGIN`` … ``COMMIT`` on an open connection; ``ROLLBACK`` on any error."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield con
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


@contextlib.contextmanager
def transaction(warehouse: str | os.PathLike) -> Iterator[duckdb.DuckDBPyConnection]:
    """A read-write connection inside one transaction: COMMIT on success, ROLLBACK on any error."""
    con = duckdb.connect(str(warehouse))
    try:
        with in_transaction(con):
            yield con
    finally:
        con.close()
