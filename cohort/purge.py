"""Right to be forgotten: delete one subject's rows from every derived per-stay table.

Runs inside the caller's transaction (no BEGIN/COMMIT here), so the pipelines can delete from
the warehouse and from their own stores atomically. Aggregates computed at build time
(``standardisation``, ``cohort_funnel``, the cohort medians) are not recomputed: they hold no
record-level data, and rebuilding them would silently change every other stay's tokens.
"""
from __future__ import annotations

import duckdb

#: Per-stay tables keyed by stay_id, deleted through cohort_stays. cohort_stays goes last.
PER_STAY_TABLES: tuple[str, ...] = ("vitals_hourly",)


def _count(con: duckdb.DuckDBPyConnection, sql: str, params: list) -> int:
    row = con.execute(sql, params).fetchone()
    return int(row[0]) if row is not None else 0


def purge_subject(con: duckdb.DuckDBPyConnection, subject_id: int) -> dict[str, int]:
    """Delete subject ``subject_id`` from every derived table.

    Parameters
    ----------
    con : open read-write DuckDB connection on the warehouse (the caller owns the transaction)
    subject_id : int

    Returns
    -------
    dict table -> number of rows deleted (0 everywhere for an unknown subject).
    """
    sid = int(subject_id)
    existing = {r[0] for r in con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()").fetchall()}
    out: dict[str, int] = {}
    stays = "(SELECT stay_id FROM cohort_stays WHERE subject_id = ?)"
    for t in PER_STAY_TABLES:
        if t in existing:
            n = _count(con, f"SELECT count(*) FROM {t} WHERE stay_id IN {stays}", [sid])
            con.execute(f"DELETE FROM {t} WHERE stay_id IN {stays}", [sid])
            out[t] = int(n)
    n = _count(con, "SELECT count(*) FROM cohort_stays WHERE subject_id = ?", [sid])
    con.execute("DELETE FROM cohort_stays WHERE subject_id = ?", [sid])
    out["cohort_stays"] = int(n)
    return out
