"""Issue 19, item 5: a full disk, a read-only file system or a refused permission during
``forget``, ``build-cohort`` or ``export`` is one typed line (exit 4) and loses nothing; a
committed receipt's erasure is completed by the next command, and ``receipts verify`` reports a
pending erasure as not verified (exit 1). Disk-full runs twice: on a real 8 MB tmpfs (when the
container lets the test mount one; skipped with the reason otherwise) and by deterministic fault
injection at each write point."""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import duckdb
import pytest
from forget_site import (
    TARGET,
    build_site,
    copy_site,
    data_hash,
    err_lines,
    export_to,
    make_base,
    present,
    receipts,
    sha,
    tree_sha,
)

from pipelines.cli import main
from pipelines.store.warehouse import read_meta


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_base(tmp_path_factory)


@pytest.fixture
def site(base, tmp_path):
    return copy_site(base, tmp_path)


# ================================================================================ storage failures
ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _duck_full(*a, **k):
    raise duckdb.IOException('IO Error: Could not write file ".x": No space left on device')


def _raise(exc):
    def f(*a, **k):
        raise exc
    return f


class _OsProxy:
    """``os`` for one module, with one function replaced (the rest delegate)."""

    def __init__(self, **over):
        self._over = over

    def __getattr__(self, name):
        return self._over.get(name, getattr(os, name))


#: (name, module attribute to patch, replacement, errno shown, receipt committed?, erasure done when it fails?)
FORGET_FAULTS = [
    ("ledger-append", "pipelines.receipts.ledger.Ledger.append", _raise(ENOSPC), "ENOSPC", False, False),
    ("export-rewrite", "pipelines.store.exports._swap", _raise(ENOSPC), "ENOSPC", True, False),
    ("export-readonly", "pipelines.store.exports._swap", _raise(OSError(errno.EROFS, os.strerror(errno.EROFS))),
     "EROFS", True, False),
    ("cache-purge", "pipelines.store.safe_io.remove_own_dir",
     _raise(PermissionError(errno.EACCES, "Permission denied")), "EACCES", True, False),
    ("stale-marker", "pipelines.store.forget_apply.mark_stale", _raise(ENOSPC), "ENOSPC", True, False),
    ("duckdb-new-file", "cohort.build.attach_private", _duck_full, "ENOSPC", True, False),
    ("warehouse-swap", "pipelines.store.erasure.os", _OsProxy(replace=_raise(ENOSPC)), "ENOSPC", True, False),
    ("ledger-card", "pipelines.store.forget.write_ledger_result", _raise(ENOSPC), "ENOSPC", True, True),
]


def _patch(monkeypatch, target: str, value):
    import importlib

    mod, _, attr = target.rpartition(".")
    owner, _, cls = mod.rpartition(".")
    if cls[:1].isupper():  # a class attribute (module.Class.attr)
        monkeypatch.setattr(getattr(importlib.import_module(owner), cls), attr, value)
    else:
        monkeypatch.setattr(importlib.import_module(mod), attr, value)


def _verify(p: Path, capsys) -> tuple[int, dict]:
    rc = main(["receipts", "verify", "--warehouse", str(p)])
    out = capsys.readouterr().out.strip().splitlines()
    return rc, json.loads(out[-1])


def others(exp: Path, subject: int = TARGET):
    """An export's rows of everyone but ``subject`` (what a failed forget must not lose)."""
    import polars as pl

    st = pl.read_parquet(exp / "stays.parquet")
    mine = st.filter(pl.col("subject_id") == subject)["stay_id"]
    return (st.filter(pl.col("subject_id") != subject),
            pl.read_parquet(exp / "hourly.parquet").filter(~pl.col("stay_id").is_in(mine)))


def same_others(exp: Path, before) -> bool:
    now = others(exp)
    return now[0].equals(before[0]) and now[1].equals(before[1])


def target_rows(exp: Path) -> int:
    import polars as pl

    return pl.read_parquet(exp / "stays.parquet").filter(pl.col("subject_id") == TARGET).height


@pytest.mark.parametrize("name,target,value,code,committed,done", FORGET_FAULTS, ids=[f[0] for f in FORGET_FAULTS])
def test_storage_failure_at_each_forget_write_point(site, tmp_path, monkeypatch, capsys, name, target, value, code,
                                                    committed, done):
    p, _ = site
    exp = tmp_path / "exp"
    export_to(p, exp, capsys)
    data0, exp0, rest0 = data_hash(p), tree_sha(exp), others(exp)
    _patch(monkeypatch, target, value)
    rc = main(["forget", "--subject-id", str(TARGET), "--warehouse", str(p)])
    lines = err_lines(capsys)
    monkeypatch.undo()
    assert rc == 4, lines
    assert len(lines) == (2 if done else 1), lines  # done: the erasure's own progress line came first
    assert lines[-1].startswith("error: StorageError: forget: ") and f"({code})" in lines[-1], lines
    assert "Traceback" not in "".join(lines)
    lines = lines[-1:]
    assert (receipts(p) == 1) is committed  # the ledger verifies either way
    assert same_others(exp, rest0)  # nobody else's rows were lost
    if not done:  # the warehouse's data is exactly as before: its swap is the erasure's last step (its meta
        # table may already record the export versions the erasure wrote, issue 31)
        assert data_hash(p) == data0 and present(p) > 0
    if not committed:
        assert "nothing was erased" in lines[0] and tree_sha(exp) == exp0
    elif not done:
        assert "is pending" in lines[0] and "next forgetful command" in lines[0]
        rc_v, res = _verify(p, capsys)
        assert rc_v == 1 and res["pending_erasures"] == 1 and res["warehouse_verified"] is False
    else:
        assert "erasure is complete" in lines[0] and present(p) == 0
    # the next command (any that writes the warehouse, no fault now) completes a committed erasure
    export_to(p, tmp_path / "exp_next", capsys)
    if not committed:
        assert present(p) > 0
        assert main(["forget", "--subject-id", str(TARGET), "--warehouse", str(p)]) == 0
        capsys.readouterr()
    assert present(p) == 0 and receipts(p) == 1 and target_rows(exp) == 0 and same_others(exp, rest0)
    assert _verify(p, capsys)[0] == 0


def test_storage_failure_in_build_and_export_is_typed_and_changes_nothing(site, tmp_path, monkeypatch, capsys):
    from cohort import _hourly
    from pipelines.errors import StorageError

    p, root = site
    wh0, data0 = sha(p), data_hash(p)
    # build: the scratch spool (a Python write) and DuckDB's new file, each in turn
    for target, value in (("cohort._hourly.BucketSpool._write", _raise(ENOSPC)),
                          ("cohort.build.attach_private", _duck_full)):
        _patch(monkeypatch, target, value)
        with pytest.raises(StorageError, match=r"build-cohort: building the warehouse: the disk is full \(ENOSPC\)"):
            build_site(p, root)
        monkeypatch.undo()
        assert sha(p) == wh0
        assert not [q for q in p.parent.iterdir() if ".building-" in q.name]  # no temporary left
    assert _hourly.BucketSpool._write is not None
    # export: the second file fails; the first one is removed again, the warehouse is untouched
    import cohort.frames as frames

    real, calls = frames._write_private, []

    def second_fails(frame, path):
        calls.append(path.name)
        if len(calls) == 2:
            with open(path, "wb") as fh:  # a partial file, as a full disk leaves it
                fh.write(b"PAR1 partial")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(frame, path)
    monkeypatch.setattr(frames, "_write_private", second_fails)
    out = tmp_path / "exp"
    assert main(["export", "--warehouse", str(p), "--out", str(out)]) == 4
    lines = err_lines(capsys)
    assert len(lines) == 1 and lines[0].startswith("error: StorageError: export: ") and "were removed" in lines[0]
    assert not out.exists() and data_hash(p) == data0  # the folder it made is gone again; nothing registered
    meta = read_meta(p)
    assert not json.loads(meta.get("export_files") or "{}") and not json.loads(meta.get("export_pending") or "{}")


def _mount_tmpfs(d: Path, size: str = "8m") -> str | None:
    """Mount a tmpfs at ``d``; returns the reason when the container does not allow it."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        return "needs root and mount(8)"
    d.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)], capture_output=True, text=True)
    return None if r.returncode == 0 else f"mount -t tmpfs refused: {r.stderr.strip()[:200]}"


def _fill(d: Path, leave: int) -> Path:
    st = os.statvfs(d)
    free = st.f_bavail * st.f_frsize
    f = d / "filler"
    with open(f, "wb") as fh:
        fh.write(b"\xff" * max(0, free - leave))
    return f


@pytest.fixture
def tmpfs(tmp_path):
    d = tmp_path / "tmpfs"
    why = _mount_tmpfs(d)
    if why:
        pytest.skip(f"no 8 MB tmpfs in this container: {why}")
    yield d
    subprocess.run(["umount", "-l", str(d)], check=False)


@pytest.mark.parametrize("leave", [256 * 1024, 0], ids=["room-for-the-receipt", "no-room-at-all"])
def test_full_8mb_tmpfs(base, tmpfs, capsys, leave):
    """A real full disk: one typed line (exit 4), nothing lost, the next command completes it."""
    from pipelines.errors import StorageError

    p0, root = base
    runs = tmpfs / "runs"
    runs.mkdir()
    p = runs / p0.name
    shutil.copy(p0, p)
    exp = runs / "exp"
    export_to(p, exp, capsys)
    data0, rest0 = data_hash(p), others(exp)
    filler = _fill(tmpfs, leave)
    rc = main(["forget", "--subject-id", str(TARGET), "--warehouse", str(p)])
    lines = err_lines(capsys)
    assert rc == 4 and len(lines) == 1 and lines[0].startswith("error: StorageError: forget: "), lines
    assert "the disk is full (ENOSPC)" in lines[0]
    assert data_hash(p) == data0 and present(p) > 0 and same_others(exp, rest0)  # nothing lost
    n = receipts(p)  # the ledger verifies
    if n:
        rc_v, res = _verify(p, capsys)
        assert rc_v == 1 and res["pending_erasures"] == 1
    else:
        assert "nothing was erased" in lines[0]
    # build-cohort on the full disk: typed, the old warehouse unchanged, no temporaries left
    with pytest.raises(StorageError, match="ENOSPC"):
        build_site(p, root)
    assert data_hash(p) == data0 and not [q for q in runs.iterdir() if ".building-" in q.name]
    # export on the full disk (with a pending erasure, completing it is what fails first): typed, nothing left
    rc = main(["export", "--warehouse", str(p), "--out", str(runs / "exp2")])
    lines = err_lines(capsys)
    assert rc == 4 and len(lines) == 1 and lines[0].startswith("error: StorageError: ")
    assert not list((runs / "exp2").glob("*.parquet")) and data_hash(p) == data0
    filler.unlink()
    assert main(["forget", "--subject-id", str(TARGET), "--warehouse", str(p)]) == 0
    capsys.readouterr()
    assert present(p) == 0 and receipts(p) == 1 and target_rows(exp) == 0 and same_others(exp, rest0)
    assert _verify(p, capsys)[0] == 0
