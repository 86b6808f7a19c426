"""Issue 19, items 4 and 7: no erase or rewrite through a link, owner-only files, a key kept away
from the data. Every attack aims at decoy files in a temporary folder (never a real system
file); a decoy is checked byte for byte (sha256) after the command."""
from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from forget_site import (
    TARGET,
    copy_site,
    err_lines,
    export_to,
    make_base,
    present,
    sha,
    tree_sha,
)

from pipelines.cli import main
from pipelines.receipts.ledger import Ledger, default_dir
from pipelines.store.forget import forget_subject
from pipelines.store.keys import Keys
from pipelines.store.warehouse import Warehouse, cache_dir


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_base(tmp_path_factory)


@pytest.fixture
def site(base, tmp_path):
    return copy_site(base, tmp_path)


# ================================================================================ links
def test_linked_export_files_are_refused_and_decoys_untouched(site, tmp_path, capsys):
    p, _ = site
    a, b = tmp_path / "exp_a", tmp_path / "exp_b"
    export_to(p, a, capsys)
    export_to(p, b, capsys)
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
    import pipelines.store.exports as exports

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
        exports.erase([exports.ExportEntry(out, "parquet")], exports.SubjectSet({TARGET}))
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
    from pipelines.runtime import task_cache

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
    from pipelines.store import locking

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
        from pipelines.receipts.logaudit import anchor_path

        anchor = anchor_path(led.path)
        assert anchor.is_file() and mode(anchor) == 0o600 and mode(anchor.parent) == 0o700
        from pipelines.store.keys import key_file

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
    assert len(lines) == 1 and lines[0].startswith("error: KeyLocationError:")
    assert sha(p) == wh0 and not (default_dir(p) / "receipts.jsonl").exists()
    monkeypatch.setenv("FORGETFUL_ALLOW_KEY_NEAR_DATA", "1")  # the explicit opt-in
    assert main(["forget", "--subject-id", str(TARGET), "--warehouse", str(p)]) == 0
    assert present(p) == 0
