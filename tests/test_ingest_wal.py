"""The ingest run's DuckDB settings (:func:`pipelines.ingest.steps.configure_run`): a commit
larger than DuckDB's default auto-checkpoint size (16 MB) stays in the WAL (durable, not yet
rewritten into the database file) until the run's explicit ``CHECKPOINT``, so a run with many
batches rewrites its updated tables once, not once per batch; and a run leaves no WAL behind."""
from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from pipelines.ingest.steps import configure_run


def _wal(p: Path) -> int:
    w = Path(str(p) + ".wal")
    return w.stat().st_size if w.is_file() else 0


def _commit_blobs(con, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    con.register("_b", pa.table({"k": pa.array(np.arange(n, dtype=np.int64)),
                                 "b": pa.array([rng.bytes(8000) for _ in range(n)], pa.binary())}))
    con.execute("BEGIN TRANSACTION")
    con.execute("INSERT OR REPLACE INTO t SELECT * FROM _b")
    con.execute("COMMIT")
    con.unregister("_b")


def test_a_large_commit_stays_in_the_wal_until_the_checkpoint(tmp_path):
    p = tmp_path / "w.duckdb"
    con = duckdb.connect(str(p))
    try:
        configure_run(con, "512MB")
        got = dict(con.execute("SELECT name, value FROM duckdb_settings() WHERE name IN "
                               "('wal_autocheckpoint', 'memory_limit')").fetchall())
        ref = duckdb.connect()
        ref.execute("SET wal_autocheckpoint = '128MB'")  # a quarter of the limit: room left for sorts
        want = ref.execute("SELECT value FROM duckdb_settings() WHERE name = 'wal_autocheckpoint'").fetchone()[0]
        ref.close()
        assert got["wal_autocheckpoint"] == want, got
        con.execute("CREATE TABLE t (k BIGINT PRIMARY KEY, b BLOB)")
        con.execute("CHECKPOINT")
        size0 = p.stat().st_size
        _commit_blobs(con, 2500, 0)  # ~20 MB: past DuckDB's default 16 MB auto-checkpoint
        _commit_blobs(con, 2500, 1)  # an update of every row: with the defaults it checkpoints here
        assert _wal(p) > 32 * 2 ** 20, "a commit was checkpointed (the whole table rewritten)"
        assert p.stat().st_size == size0
        con.execute("CHECKPOINT")
        assert _wal(p) == 0
        assert con.execute("SELECT count(*) FROM t").fetchone()[0] == 2500
    finally:
        con.close()


def test_memory_sizes_parse_and_a_bad_one_is_one_typed_line():
    import pytest

    from pipelines.errors import IngestError
    from pipelines.ingest.steps import memory_megabytes

    assert [memory_megabytes(x) for x in ("1GB", "512MB", " 2.5gb ", "1GiB")] == [1000.0, 512.0, 2500.0, 1073.741824]
    with pytest.raises(IngestError, match="not a memory size"):
        memory_megabytes("lots")


def test_default_settings_would_checkpoint_at_the_commit(tmp_path):
    """The reference behaviour the setting changes (so the test above can tell them apart)."""
    p = tmp_path / "d.duckdb"
    con = duckdb.connect(str(p))
    try:
        con.execute("CREATE TABLE t (k BIGINT PRIMARY KEY, b BLOB)")
        con.execute("CHECKPOINT")
        size0 = p.stat().st_size
        _commit_blobs(con, 2500, 0)
        _commit_blobs(con, 2500, 1)
        assert _wal(p) < 32 * 2 ** 20 and p.stat().st_size > size0 + 16 * 2 ** 20
    finally:
        con.close()
