"""Issue 19, items 4-7: no erase or rewrite through a link, typed storage failures, owner-only
files, a key kept away from the data.

Every attack aims at decoy files in a temporary folder (never a real system file); a decoy is
checked byte for byte (sha256) after the command. Disk-full runs twice: on a real 8 MB tmpfs
(when the container lets the test mount one; skipped with the reason otherwise) and by
deterministic fault injection at each write point of ``forget``, ``build-cohort`` and ``export``.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import duckdb
import pytest

from pipelines.cli import main
from pipelines.forget import forget_subject
from pipelines.keys import Keys
from pipelines.ledger import Ledger, default_dir
from pipelines.warehouse import Warehouse, cache_dir

FIX = Path(__file__).parent / "fixtures" / "cohort"
TARGET, OTHER = 101, 103  # subjects of the MIMIC fixture's stays 301 and 303 (both in the cohort)


def _build(p: Path, root: Path) -> dict:
    from pipelines.flows.clinical_cohort import build_task

    return build_task.fn("mimic", str(root), str(p), 48, None, 0, "512MB", False, None, str(p.parent))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("hard")
    root = d / "src"
    shutil.copytree(FIX / "mimic_small", root)
    p = d / "runs" / "warehouse.duckdb"
    _build(p, root)
    return p, root


@pytest.fixture
def site(base, tmp_path):
    """A fresh copy of the fixture warehouse in its own runs folder (no ledger yet)."""
    p0, root = base
    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copy(p0, runs / p0.name)
    return runs / p0.name, root


def sha(p: Path) -> str:
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


def tree_sha(d: Path) -> dict[str, str]:
    return {str(f.relative_to(d)): sha(f) for f in sorted(Path(d).rglob("*")) if f.is_file()}


def present(p: Path, subject: int = TARGET) -> int:
    con = duckdb.connect(str(p), read_only=True)
    try:
        return con.execute("SELECT count(*) FROM cohort_stays WHERE subject_id = ?", [subject]).fetchone()[0]
    finally:
        con.close()


def data_hash(p: Path) -> str:
    """Content hash recomputed from the warehouse's data tables (independent of meta rows)."""
    from cohort.build import content_hash

    con = duckdb.connect(str(p), read_only=True)
    try:
        return content_hash(con)
    finally:
        con.close()


def receipts(p: Path) -> int:
    return len(Ledger(default_dir(p), Keys.load()).rows())


def err_lines(capsys) -> list[str]:
    return [x for x in capsys.readouterr().err.splitlines() if x.strip()]


def _export(p: Path, out: Path, capsys) -> None:
    assert main(["export", "--warehouse", str(p), "--out", str(out)]) == 0
    capsys.readouterr()


# ================================================================================ links
def test_linked_export_files_are_refused_and_decoys_untouched(site, tmp_path, capsys):
    p, _ = site
    a, b = tmp_path / "exp_a", tmp_path / "exp_b"
    _export(p, a, capsys)
    _export(p, b, capsys)
    decoys = tmp_path / "decoys"
    decoys.mkdir()
    # decoys hold real export content (the patient's rows too), so following the link would rewrite them
    shutil.copy(a / "hourly.parquet", decoys / "hourly.parquet")
    shutil.copy(b / "stays.parquet", decoys / "stays.parquet")
    (a / "hourly.parquet").unlink()
    (a / "hourly.parquet").symlink_to(decoys / "hourly.parquet")
    (b / "stays.parquet").unlink()
    (b / "stays.parquet").symlink_to(decoys / "stays.parquet")
    before, wh_before, b_hourly = tree_sha(decoys), sha(p), sha(b / "hourly.parquet")
    assert main(["forget", "--subject-id", str(TARGET), "--warehouse", str(p)]) == 3
    lines = err_lines(capsys)
    assert len(lines) == 1 and lines[0].startswith("error: UnsafePathError:") and "symbolic link" in lines[0]
    assert tree_sha(decoys) == before  # byte-identical
    assert sha(p) == wh_before and sha(b / "hourly.parquet") == b_hourly  # nothing changed at all
    assert not (default_dir(p) / "receipts.jsonl").exists()  # refused before the receipt
    # once the links are gone, the forget runs and the real export files are cleaned
    (a / "hourly.parquet").unlink()
    (b / "stays.parquet").unlink()
    assert main(["forget", "--subject-id", str(TARGET), "--warehouse", str(p)]) == 0
    assert present(p) == 0 and tree_sha(decoys) == before


def test_linked_export_file_planted_after_the_check_is_not_followed(site, tmp_path, monkeypatch):
    """The check and the write are separate moments: O_NOFOLLOW refuses a link planted between them."""
    import pipelines.exports as exports

    p, _ = site
    out = tmp_path / "exp"
    assert main(["export", "--warehouse", str(p), "--out", str(out)]) == 0
    decoy = tmp_path / "decoy.parquet"
    shutil.copy(out / "hourly.parquet", decoy)
    before = sha(decoy)
    monkeypatch.setattr(exports, "check_links", lambda folders: None)  # the race: the check saw a plain file

    def plant():
        (out / "hourly.parquet").unlink()
        (out / "hourly.parquet").symlink_to(decoy)
    plant()
    from pipelines.errors import UnsafePathError

    with pytest.raises(UnsafePathError):
        exports.erase([out], {TARGET})
    assert sha(decoy) == before


def test_linked_cache_folder_is_removed_not_followed(site, tmp_path, capsys):
    p, _ = site
    decoy = tmp_path / "decoy_cache"
    decoy.mkdir()
    (decoy / "keep.txt").write_text("the user's own file")
    cache_dir(p).symlink_to(decoy, target_is_directory=True)
    before = tree_sha(decoy)
    assert main(["forget", "--subject-id", str(TARGET), "--warehouse", str(p)]) == 0
    err = capsys.readouterr().err
    assert not os.path.lexists(cache_dir(p))  # the link is gone (shutil.rmtree on a link used to do nothing)
    assert tree_sha(decoy) == before and "symbolic link: removed the link only" in err
    assert present(p) == 0


def test_task_cache_never_writes_into_a_linked_folder(site, tmp_path, capsys):
    from pipelines import task_cache

    p, _ = site
    decoy = tmp_path / "decoy_dir"
    decoy.mkdir()
    cache_dir(p).symlink_to(decoy, target_is_directory=True)

    @task_cache.cached
    def body(warehouse, x):
        return {"x": x}
    assert body(str(p), 1) == {"x": 1}
    assert list(decoy.iterdir()) == [] and cache_dir(p).is_dir() and not cache_dir(p).is_symlink()
    assert stat.S_IMODE(cache_dir(p).stat().st_mode) == 0o700
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in cache_dir(p).iterdir())
    assert "removed the link only" in capsys.readouterr().err


@pytest.mark.parametrize("which", ["warehouse", "wal"])
def test_linked_warehouse_or_wal_is_refused(site, tmp_path, capsys, which):
    p, root = site
    decoy = tmp_path / "decoy.bin"
    if which == "warehouse":
        shutil.copy(p, decoy)  # a real warehouse as the target: following it would rewrite it
        p.unlink()
        p.symlink_to(decoy)
        target = p
    else:
        decoy.write_bytes(b"\x00not a wal, the user's file" * 100)
        target = p.parent / (p.name + ".wal")
        target.symlink_to(decoy)
    before = sha(decoy)
    assert main(["forget", "--subject-id", str(TARGET), "--warehouse", str(p)]) == 3
    lines = err_lines(capsys)
    assert len(lines) == 1 and lines[0].startswith("error: UnsafePathError:")
    assert sha(decoy) == before and target.is_symlink()
    if which == "warehouse":  # the low-level build refuses too (os.replace would replace the link's target)
        from cohort.build import build_warehouse
        from cohort.errors import BadParameterError

        with pytest.raises(BadParameterError, match="symbolic link"):
            build_warehouse("mimic", root, p, progress=False, memory_limit="512MB")
        assert sha(decoy) == before


def test_planted_links_at_temporary_names_are_never_followed(site, tmp_path):
    """Predictable temporary names (stale marker, a dead build's folder) planted as links."""
    from pipelines import locking

    p, _ = site
    decoy = tmp_path / "decoy.txt"
    decoy.write_text("the user's own file")
    decoy_dir = tmp_path / "decoy_dir"
    decoy_dir.mkdir()
    (decoy_dir / "f").write_text("x")
    before, before_dir = sha(decoy), tree_sha(decoy_dir)
    runs = p.parent
    (runs / "icu_retention").mkdir()
    (runs / "icu_retention" / "result.json").write_text("{}")  # a result the forget marks stale
    (runs / f".stale.json.tmp{os.getpid()}").symlink_to(decoy)  # forget's stale marker (this process)
    dead = 2 ** 22 + 4321
    (runs / f".{p.name}.building-{dead}.buckets").symlink_to(decoy_dir, target_is_directory=True)
    with Warehouse.open(p) as w:
        w.register_runs_dir(runs)
    assert locking.clean_stale(p) == 0  # already cleaned by the open: the link itself was removed
    assert not os.path.lexists(runs / f".{p.name}.building-{dead}.buckets")
    forget_subject(p, subject_id=TARGET)
    assert json.loads((runs / "stale.json").read_text())["receipt_seq"] == 1
    assert sha(decoy) == before and tree_sha(decoy_dir) == before_dir


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
    ("ledger-append", "pipelines.ledger.Ledger.append", _raise(ENOSPC), "ENOSPC", False, False),
    ("export-rewrite", "pipelines.exports._swap", _raise(ENOSPC), "ENOSPC", True, False),
    ("export-readonly", "pipelines.exports._swap", _raise(OSError(errno.EROFS, os.strerror(errno.EROFS))), "EROFS",
     True, False),
    ("cache-purge", "pipelines.safe_io.remove_own_dir", _raise(PermissionError(errno.EACCES, "Permission denied")),
     "EACCES", True, False),
    ("stale-marker", "pipelines.forget._mark_stale", _raise(ENOSPC), "ENOSPC", True, False),
    ("duckdb-new-file", "cohort.build.attach_private", _duck_full, "ENOSPC", True, False),
    ("warehouse-swap", "pipelines.erasure.os", _OsProxy(replace=_raise(ENOSPC)), "ENOSPC", True, False),
    ("ledger-card", "pipelines.forget._write_ledger_result", _raise(ENOSPC), "ENOSPC", True, True),
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
    _export(p, exp, capsys)
    wh0, exp0, rest0 = sha(p), tree_sha(exp), others(exp)
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
    if not done:  # the warehouse is exactly as before: its swap is the erasure's last step
        assert sha(p) == wh0 and present(p) > 0
    if not committed:
        assert "nothing was erased" in lines[0] and tree_sha(exp) == exp0
    elif not done:
        assert "is pending" in lines[0] and "next forgetful command" in lines[0]
        rc_v, res = _verify(p, capsys)
        assert rc_v == 1 and res["pending_erasures"] == 1 and res["warehouse_verified"] is False
    else:
        assert "erasure is complete" in lines[0] and present(p) == 0
    # the next command (any that writes the warehouse, no fault now) completes a committed erasure
    _export(p, tmp_path / "exp_next", capsys)
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
            _build(p, root)
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
    assert list(out.iterdir()) == [] and data_hash(p) == data0  # (the folder was registered: meta only)


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
    _export(p, exp, capsys)
    wh0, rest0 = sha(p), others(exp)
    filler = _fill(tmpfs, leave)
    rc = main(["forget", "--subject-id", str(TARGET), "--warehouse", str(p)])
    lines = err_lines(capsys)
    with capsys.disabled():  # shown with -s: the line a user sees on a full disk
        print("\ntmpfs forget:", lines)
    assert rc == 4 and len(lines) == 1 and lines[0].startswith("error: StorageError: forget: "), lines
    assert "the disk is full (ENOSPC)" in lines[0]
    assert sha(p) == wh0 and present(p) > 0 and same_others(exp, rest0)  # nothing lost
    n = receipts(p)  # the ledger verifies
    if n:
        rc_v, res = _verify(p, capsys)
        assert rc_v == 1 and res["pending_erasures"] == 1
    else:
        assert "nothing was erased" in lines[0]
    # build-cohort on the full disk: typed, the old warehouse unchanged, no temporaries left
    with pytest.raises(StorageError, match="ENOSPC") as ei:
        _build(p, root)
    with capsys.disabled():
        print("tmpfs build-cohort:", ei.value)
    assert sha(p) == wh0 and not [q for q in runs.iterdir() if ".building-" in q.name]
    # export on the full disk (with a pending erasure, completing it is what fails first): typed, nothing left
    rc = main(["export", "--warehouse", str(p), "--out", str(runs / "exp2")])
    lines = err_lines(capsys)
    with capsys.disabled():
        print("tmpfs export:", lines)
    assert rc == 4 and len(lines) == 1 and lines[0].startswith("error: StorageError: ")
    assert not list((runs / "exp2").glob("*.parquet")) and sha(p) == wh0
    filler.unlink()
    assert main(["forget", "--subject-id", str(TARGET), "--warehouse", str(p)]) == 0
    capsys.readouterr()
    assert present(p) == 0 and receipts(p) == 1 and target_rows(exp) == 0 and same_others(exp, rest0)
    assert _verify(p, capsys)[0] == 0


# ================================================================================ safe defaults
def test_created_files_are_owner_only(site, tmp_path, capsys, monkeypatch):
    from cohort.build import build_warehouse

    p, root = site
    monkeypatch.setenv("FORGETFUL_CONFIG_DIR", str(tmp_path / "cfg"))  # key and anchors created by this command
    old = os.umask(0o022)  # a permissive caller: the command must not depend on it
    try:
        out = tmp_path / "new" / "exp"
        assert main(["export", "--warehouse", str(p), "--out", str(out)]) == 0
        assert main(["forget", "--subject-id", str(TARGET), "--warehouse", str(p)]) == 0
        assert os.umask(0o022) == 0o022  # restored after the command
        mode = lambda q: stat.S_IMODE(os.stat(q).st_mode)  # noqa: E731
        assert mode(p) == 0o600 and not Path(str(p) + ".wal").exists()
        assert mode(out) == 0o700 and {mode(f) for f in out.iterdir()} == {0o600}
        led = Ledger(default_dir(p), Keys.load())
        assert mode(led.dir) == 0o700 and mode(led.path) == 0o600
        anchor = led._anchor_path()
        assert anchor.is_file() and mode(anchor) == 0o600 and mode(anchor.parent) == 0o700
        from pipelines.keys import key_file

        assert mode(key_file()) == 0o600
        # the library build (no CLI): the warehouse file is owner-only from its creation
        q = tmp_path / "lib" / "w.duckdb"
        build_warehouse("mimic", root, q, progress=False, memory_limit="512MB")
        assert mode(q) == 0o600
    finally:
        os.umask(old)
    capsys.readouterr()


@pytest.mark.parametrize("where", ["key-file", "config-dir"])
def test_key_beside_the_data_is_refused(site, monkeypatch, capsys, where):
    p, _ = site
    if where == "key-file":
        kf = p.parent / "ledger.key"
        kf.write_text("k" * 64)
        kf.chmod(0o600)
        monkeypatch.setenv("FORGETFUL_KEY_FILE", str(kf))
    else:
        monkeypatch.setenv("FORGETFUL_CONFIG_DIR", str(p.parent / "config"))
    wh0 = sha(p)
    assert main(["forget", "--subject-id", str(TARGET), "--warehouse", str(p)]) == 3
    lines = err_lines(capsys)
    assert len(lines) == 1 and lines[0].startswith("error: KeyBesideDataError:")
    assert sha(p) == wh0 and not (default_dir(p) / "receipts.jsonl").exists()
    monkeypatch.setenv("FORGETFUL_ALLOW_KEY_BESIDE_DATA", "1")  # the explicit opt-in
    assert main(["forget", "--subject-id", str(TARGET), "--warehouse", str(p)]) == 0
    assert present(p) == 0
