"""Physical erasure: rewrite a warehouse into a fresh file without the forgotten subjects.

``DELETE`` in DuckDB only marks blocks free: the old rows stay in the file (one copied header
block restores them). :func:`rewrite` therefore never deletes in place. It attaches the current
file read-only and a new file ``.<name>.forget-PID``, recreates every table (and index) from its
DDL, copies the rows that do **not** belong to an excluded subject (the excluded rows are never
written to the new file), swaps in updated gate states, recomputes the content hash,
checkpoints, fsyncs, and atomically replaces the warehouse (directory fsynced). The old inode
is then overwritten with zeros through a descriptor opened before the swap (best effort: the
file system or an SSD may keep copies — see the README's threat model). A crash at any point
leaves either the old or the new warehouse, never a mix; the temporary file of a killed run is
removed by the next command (:func:`pipelines.store.locking.clean_stale`).

Links are never followed: a warehouse path or WAL that is a symbolic link is refused
(:class:`~pipelines.errors.UnsafePathError`, nothing changed) and the old file is opened with
``O_NOFOLLOW``. The new file and its WAL are owner-only (0600) from their creation.

Tables with a ``subject_id`` column are filtered on it; tables with only a ``stay_id`` column on
the excluded subjects' stays. A table with neither must be a known aggregate table
(:data:`AGGREGATE_TABLES`), otherwise :class:`ErasureError` is raised and nothing changes (fail
closed: an unknown table could hold record-level data).
"""
from __future__ import annotations

import os
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from pipelines.errors import ErasureError
from pipelines.store import killpoint
from pipelines.store.safe_io import open_nofollow, refuse_link

#: tables that hold no record-level rows (aggregates, build metadata, opaque gate states)
AGGREGATE_TABLES = frozenset({"standardisation", "cohort_funnel", "build_info", "forgetful_meta", "gate_states",
                              # streaming ingest (pipelines/ingest/state.py): watermark/parameters, file
                              # identities with counts, the deletion queue (keyed hashes only)
                              "ingest_state", "ingest_files", "ingest_deletion_requests"})
GATE_STATES = "gate_states"


def fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def zero_and_close(fd: int) -> None:
    """Overwrite the whole file behind ``fd`` with zeros, fsync, close (best effort: a failure
    to zero never undoes the erasure that came before it)."""
    try:
        size = os.fstat(fd).st_size
        block = b"\0" * (1 << 20)
        os.lseek(fd, 0, os.SEEK_SET)
        left = size
        while left > 0:
            left -= os.write(fd, block[:min(left, len(block))])
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temp_path(warehouse: Path) -> Path:
    return warehouse.parent / f".{warehouse.name}.forget-{os.getpid()}"


def rewrite(warehouse: str | os.PathLike, subjects: set[int], gate_updates: dict[int, tuple | None],
            meta: dict[str, str], content_hash_fn=None) -> dict[str, int]:
    """Rewrite ``warehouse`` without ``subjects``; returns rows left out per table.

    gate_updates : context_id -> ``(blob, mac, n_tokens)`` for a rewritten gate, or None to drop
        the context. Contexts not named are copied as they are.
    meta : key -> value written to ``forgetful_meta`` (ledger head applied, …).
    content_hash_fn : ``f(con, schema) -> str`` recomputing ``build_info.content_hash``.
    """
    from cohort.build import attach_private

    wh = Path(os.path.abspath(warehouse))  # never resolve: a link in its place is refused, not followed
    refuse_link(wh, "warehouse")
    refuse_link(wh.parent / (wh.name + ".wal"), "warehouse WAL")
    tmp = temp_path(wh)
    for q in (tmp, tmp.parent / (tmp.name + ".wal")):
        q.unlink(missing_ok=True)
    con = duckdb.connect(":memory:")
    removed: dict[str, int] = {}
    try:
        con.execute(f"ATTACH '{wh}' AS old (READ_ONLY)")
        attach_private(con, tmp, "nw")
        tables = [r[0] for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = 'old' AND schema_name = 'main' "
            "ORDER BY table_name").fetchall()]
        cols = {t: [r[0] for r in con.execute(
            "SELECT column_name FROM duckdb_columns() WHERE database_name = 'old' AND table_name = ? "
            "ORDER BY column_index", [t]).fetchall()] for t in tables}
        for t in tables:
            if "subject_id" not in cols[t] and "stay_id" not in cols[t] and t not in AGGREGATE_TABLES:
                raise ErasureError(f"table {t!r} has no subject_id/stay_id column and is not a known aggregate "
                                   "table; refusing to erase (it could hold record-level rows)")
        subj = np.asarray(sorted(int(s) for s in subjects), dtype=np.int64)
        con.register("_x_subj_df", pa.table({"subject_id": pa.array(subj)}))
        con.execute("CREATE TEMP TABLE _x_subj AS SELECT * FROM _x_subj_df")
        con.unregister("_x_subj_df")
        stay_src = [f"SELECT stay_id FROM old.{t} WHERE subject_id IN (SELECT subject_id FROM _x_subj)"
                    for t in tables if "subject_id" in cols[t] and "stay_id" in cols[t]]
        con.execute("CREATE TEMP TABLE _x_stay AS " + (" UNION ".join(stay_src) if stay_src
                                                     else "SELECT NULL::BIGINT AS stay_id WHERE false"))
        ddl = {t: con.execute("SELECT sql FROM duckdb_tables() WHERE database_name = 'old' AND table_name = ?",
                              [t]).fetchone()[0] for t in tables}
        con.execute("USE nw")
        drop_ctx = [int(c) for c, u in gate_updates.items() if u is None]
        upd_ctx = [int(c) for c, u in gate_updates.items() if u is not None]
        for t in tables:
            con.execute(ddl[t])
            where = []
            if "subject_id" in cols[t]:
                where.append("subject_id NOT IN (SELECT subject_id FROM _x_subj)")
            elif "stay_id" in cols[t]:
                where.append("stay_id NOT IN (SELECT stay_id FROM _x_stay)")
            if "context_id" in cols[t] and (drop_ctx or (t == GATE_STATES and upd_ctx)):
                skip = drop_ctx + (upd_ctx if t == GATE_STATES else [])
                where.append(f"context_id NOT IN ({', '.join(str(c) for c in skip)})")
            w = (" WHERE " + " AND ".join(where)) if where else ""
            n_old = con.execute(f"SELECT count(*) FROM old.main.{t}").fetchone()[0]
            con.execute(f"INSERT INTO nw.main.{t} SELECT * FROM old.main.{t}{w}")
            n_new = con.execute(f"SELECT count(*) FROM nw.main.{t}").fetchone()[0]
            removed[t] = int(n_old - n_new)
        for cid in upd_ctx:
            blob, mac, n_tok = gate_updates[cid]
            con.execute(f"INSERT INTO nw.main.{GATE_STATES} SELECT * REPLACE (?::BLOB AS state_npz, ? AS state_mac, "
                        f"?::INTEGER AS n_tokens) FROM old.main.{GATE_STATES} WHERE context_id = ?",
                        [blob, mac, int(n_tok), cid])
        for (sql,) in con.execute("SELECT sql FROM duckdb_indexes() WHERE database_name = 'old' AND sql IS NOT NULL"
                                  ).fetchall():
            con.execute(sql)
        con.execute("CREATE TABLE IF NOT EXISTS nw.main.forgetful_meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
        for k, v in meta.items():
            con.execute("INSERT OR REPLACE INTO nw.main.forgetful_meta VALUES (?, ?)", [k, str(v)])
        if content_hash_fn is not None and {"build_info", "cohort_stays", "vitals_hourly",
                                            "standardisation"} <= set(tables):
            con.execute("UPDATE nw.main.build_info SET value = ? WHERE key = 'content_hash'",
                        [content_hash_fn(con, "nw.main.")])
        con.execute("USE memory")
        con.execute("CHECKPOINT nw")
        con.execute("DETACH nw")
        con.execute("DETACH old")
    except BaseException:
        con.close()
        for q in (tmp, tmp.parent / (tmp.name + ".wal")):
            q.unlink(missing_ok=True)
        raise
    con.close()
    try:
        fd = open_nofollow(tmp, os.O_RDONLY, "temporary warehouse")
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        old_fd = open_nofollow(wh, os.O_WRONLY, "warehouse")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    killpoint.hit("warehouse.written")
    try:
        os.replace(tmp, wh)
    except BaseException:
        os.close(old_fd)
        tmp.unlink(missing_ok=True)
        raise
    try:
        fsync_dir(wh.parent)
    except BaseException:
        os.close(old_fd)
        raise
    (wh.parent / (wh.name + ".wal")).unlink(missing_ok=True)
    killpoint.hit("warehouse.swapped")
    zero_and_close(old_fd)
    return removed
