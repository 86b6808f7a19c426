"""A warehouse held open by another process (a DuckDB shell, a notebook, another command) gives one
typed line and exit 3, never DuckDB's raw "Could not set lock" traceback, and changes nothing."""
from __future__ import annotations

import hashlib
import subprocess
import sys
import types

import duckdb
import pytest

from pipelines.runtime import runner

HOLD = """
import sys, time, duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
print("holding", flush=True)
time.sleep(120)
"""


@pytest.fixture
def held(tmp_path):
    wh = tmp_path / "warehouse.duckdb"
    con = duckdb.connect(str(wh))
    con.execute("create table t as select 1 as x")
    con.close()
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(wh)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "holding"
        yield wh
    finally:
        proc.kill()
        proc.wait()


def test_a_warehouse_held_by_another_process_is_one_typed_line(held, capsys):
    before = hashlib.sha256(held.read_bytes()).hexdigest()

    @runner.cli_errors
    def command(args):
        con = duckdb.connect(str(args.warehouse))  # a writer: refused while the other process reads
        con.execute("insert into t values (2)")
        return 0

    rc = command(types.SimpleNamespace(warehouse=held))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == runner.EXIT_DOMAIN
    assert len(err) == 1 and err[0].startswith("error: WarehouseBusyError: the database file")
    assert str(held) in err[0] and "nothing was changed" in err[0]
    assert "Traceback" not in err[0]
    assert hashlib.sha256(held.read_bytes()).hexdigest() == before


def test_other_duckdb_io_errors_are_not_called_a_lock(capsys):
    @runner.cli_errors
    def command(args):
        raise duckdb.IOException("IO Error: Cannot open file: No such file or directory")

    with pytest.raises(duckdb.IOException):
        command(types.SimpleNamespace())
