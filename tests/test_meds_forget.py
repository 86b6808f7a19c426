"""``forget`` reaches a registered MEDS export exactly as it reaches a Parquet export (issue 23,
item 1): every data shard and the split file lose the patient's rows (fresh file, fsync, atomic
swap, old inode zeroed), ``codes.parquet`` and ``dataset.json`` stay byte-identical, no byte of
the patient's id is left, a link anywhere in the export is refused before the receipt, a
shard edited by hand is left alone and reported (issue 31), a kill half-way is completed by the
next command, a rebuild keeps the registration, and a Parquet export folder's own ``data/`` is never touched.
Attacks aim at decoy files in a temporary folder only."""
from __future__ import annotations

import hashlib
import shutil
import stat
from pathlib import Path

import duckdb
import polars as pl
import pyarrow.parquet as pq
import pytest
from test_pipelines_forget import byte_hits

from cohort.synthetic import generate
from pipelines.cli import main
from pipelines.receipts.ledger import default_dir
from pipelines.store.forget import forget_subject


def _sha(p: Path) -> str:
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


def _tree(d: Path) -> dict[str, str]:
    return {str(f.relative_to(d)): _sha(f) for f in sorted(Path(d).rglob("*")) if f.is_file()}


def _build(p: Path, root: Path) -> dict:
    from pipelines.flows.clinical_cohort import build_task
    from pipelines.settings import CohortSettings

    return build_task.fn("mimic", str(root), str(p), CohortSettings(memory_limit="512MB"), runs_dir=str(p.parent))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("meds_forget")
    generate(d / "mimic", stays=30, seed=0, fmt="parquet")
    p = d / "runs" / "warehouse.duckdb"
    p.parent.mkdir()
    _build(p, d / "mimic")
    return p, d / "mimic"


@pytest.fixture
def site(base, tmp_path):
    p0, root = base
    (tmp_path / "runs").mkdir()
    shutil.copy(p0, tmp_path / "runs" / p0.name)
    p = tmp_path / "runs" / p0.name
    con = duckdb.connect(str(p), read_only=True)
    subjects = [r[0] for r in con.execute("SELECT DISTINCT subject_id FROM cohort_stays ORDER BY 1").fetchall()]
    con.close()
    return p, root, subjects


def _export(p: Path, out: Path, capsys, *extra: str) -> None:
    assert main(["export", "--format", "meds", "--warehouse", str(p), "--out", str(out), "--shard-subjects", "3",
                 *extra]) == 0
    capsys.readouterr()


def _events(root: Path, skip: Path | None = None) -> pl.DataFrame:
    return pl.concat([pl.from_arrow(pq.read_table(f)) for f in sorted((root / "data").rglob("*.parquet"))
                      if f != skip])


def test_forget_erases_the_patient_from_every_shard_and_the_split_file(site, tmp_path, capsys):
    p, _, subjects = site
    target, other = subjects[0], subjects[1]
    exp = tmp_path / "elsewhere" / "meds"  # outside the warehouse folder: reached by registration
    _export(p, exp, capsys)
    fixed = {n: _sha(exp / "metadata" / n) for n in ("codes.parquet", "dataset.json")}
    assert _events(exp).filter(pl.col("subject_id") == target).height > 0
    inodes = {f: f.stat().st_ino for f in (exp / "data").rglob("*.parquet")}
    assert main(["forget", "--subject-id", str(target), "--warehouse", str(p)]) == 0
    assert "exports:" in capsys.readouterr().err
    ev = _events(exp)
    assert ev.filter(pl.col("subject_id") == target).height == 0
    assert ev.filter(pl.col("subject_id") == other).height > 0
    splits = pl.from_arrow(pq.read_table(exp / "metadata" / "subject_splits.parquet"))
    assert target not in splits["subject_id"].to_list() and other in splits["subject_id"].to_list()
    assert {n: _sha(exp / "metadata" / n) for n in fixed} == fixed  # no record in them: untouched
    assert not byte_hits([exp], [target])  # decimal, int32 and int64 encodings alike
    # exactly a fresh export of the warehouse after the forget (every other row kept as it was)
    fresh = tmp_path / "fresh"
    _export(p, fresh, capsys)
    assert ev.sort("subject_id", "time", "code").equals(_events(fresh).sort("subject_id", "time", "code"))
    rewritten = [f for f, ino in inodes.items() if f.exists() and f.stat().st_ino != ino]
    assert len(rewritten) == 1  # only the patient's shard was swapped for a fresh file
    for f in exp.rglob("*"):
        assert not f.name.startswith(".") and stat.S_IMODE(f.stat().st_mode) == (0o700 if f.is_dir() else 0o600)
    # validates with the reference package after the erasure
    from test_meds import validate_with_meds

    validate_with_meds(exp)


def test_a_link_anywhere_in_a_meds_export_is_refused_before_the_receipt(site, tmp_path, capsys):
    p, _, subjects = site
    exp = tmp_path / "meds"
    _export(p, exp, capsys)
    decoys = tmp_path / "decoys"
    shard = sorted((exp / "data").rglob("*.parquet"))[0]
    (decoys / "split").mkdir(parents=True)
    shutil.copy(shard, decoys / "shard.parquet")  # real export content: following the link would rewrite it
    for f in shard.parent.iterdir():
        shutil.copy(f, decoys / "split" / f.name)
    before = _tree(decoys)
    for plant in ("file", "folder"):
        if plant == "file":
            shard.unlink()
            shard.symlink_to(decoys / "shard.parquet")
        else:
            shard.unlink()
            shutil.rmtree(shard.parent)
            shard.parent.symlink_to(decoys / "split", target_is_directory=True)
        wh_before = _sha(p)
        assert main(["forget", "--subject-id", str(subjects[0]), "--warehouse", str(p)]) == 3
        err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
        assert len(err) == 1 and err[0].startswith("error: UnsafePathError:") and "symbolic link" in err[0]
        assert _tree(decoys) == before and _sha(p) == wh_before
        assert not (default_dir(p) / "receipts.jsonl").exists()


def test_link_planted_after_the_check_is_not_followed(site, tmp_path, monkeypatch, capsys):
    import pipelines.store.exports as exports
    from pipelines.errors import UnsafePathError

    p, _, subjects = site
    exp = tmp_path / "meds"
    _export(p, exp, capsys)
    split_file = exp / "metadata" / "subject_splits.parquet"
    decoy = tmp_path / "decoy.parquet"
    shutil.copy(split_file, decoy)
    before = _sha(decoy)
    monkeypatch.setattr(exports, "meds_shards", lambda folder: [])  # the race: the walk saw nothing
    monkeypatch.setattr(exports, "check_links", lambda folders: None)
    split_file.unlink()
    split_file.symlink_to(decoy)
    with pytest.raises(UnsafePathError):
        exports.erase([exports.ExportEntry(exp, "meds")], exports.SubjectSet({subjects[0]}))
    assert _sha(decoy) == before


def test_edited_shard_is_left_alone_and_a_kill_is_completed_by_the_next_command(site, tmp_path, monkeypatch,
                                                                                   capsys):
    """A shard edited by hand is no longer one the project wrote (issue 31, item 4): left byte for
    byte, reported, and counted by ``receipts verify``; the project's own files are completed."""
    import pipelines.store.exports as exports

    p, _, subjects = site
    exp = tmp_path / "meds"
    _export(p, exp, capsys)
    shards = sorted((exp / "data").rglob("*.parquet"))
    hit = [f for f in shards if subjects[0] in pq.read_table(f).column("subject_id").to_pylist()]
    edited = next(f for f in shards if f not in hit)
    edited.write_bytes(b"edited by hand")
    real, calls = exports._swap, []

    def swap_then_die(frame, target, recorded):
        calls.append(target.name)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed between the shard and the split file")
        return real(frame, target, recorded)
    monkeypatch.setattr(exports, "_swap", swap_then_die)
    with pytest.raises(KeyboardInterrupt):
        forget_subject(p, subject_id=subjects[0])
    monkeypatch.undo()
    assert calls == [hit[0].name, "subject_splits.parquet"]
    assert edited.read_bytes() == b"edited by hand"  # not the project's: never touched
    assert subjects[0] in pq.read_table(exp / "metadata" / "subject_splits.parquet").column("subject_id").to_pylist()
    assert main(["export", "--warehouse", str(p), "--out", str(tmp_path / "x")]) == 0  # any next command
    capsys.readouterr()
    splits = pq.read_table(exp / "metadata" / "subject_splits.parquet")
    assert subjects[0] not in splits.column("subject_id").to_pylist()
    assert _events(exp, skip=edited).filter(pl.col("subject_id") == subjects[0]).height == 0
    assert edited.read_bytes() == b"edited by hand"
    assert main(["receipts", "verify", "--warehouse", str(p)]) == 1  # it cannot be shown clean: not verified
    assert "cannot be read to show them clean" in capsys.readouterr().err


def test_a_rebuild_keeps_the_registration_and_foreign_folders_are_never_touched(site, tmp_path, capsys):
    p, root, subjects = site
    exp, pq_exp = tmp_path / "meds", tmp_path / "parquet"
    _export(p, exp, capsys)
    # a Parquet export next to the user's own data/ folder: only stays/hourly are the export's
    (pq_exp / "data").mkdir(parents=True)
    (pq_exp / "data" / "mine.parquet").write_bytes(b"the user's own file")
    assert main(["export", "--warehouse", str(p), "--out", str(pq_exp)]) == 0
    # a folder the MEDS export refused (it holds data/): never registered or touched
    foreign = tmp_path / "mine"
    (foreign / "data").mkdir(parents=True)
    shutil.copy(sorted((exp / "data").rglob("*.parquet"))[0], foreign / "data" / "0.parquet")
    assert main(["export", "--format", "meds", "--warehouse", str(p), "--out", str(foreign)]) == 3
    capsys.readouterr()
    mine = _tree(foreign)
    _build(p, root)  # a rebuild writes a new warehouse file
    assert main(["forget", "--subject-id", str(subjects[0]), "--warehouse", str(p)]) == 0
    capsys.readouterr()
    assert _events(exp).filter(pl.col("subject_id") == subjects[0]).height == 0
    assert pl.read_parquet(pq_exp / "stays.parquet").filter(pl.col("subject_id") == subjects[0]).height == 0
    assert (pq_exp / "data" / "mine.parquet").read_bytes() == b"the user's own file"
    assert _tree(foreign) == mine


def test_export_options(site, tmp_path, capsys):
    p, _, _ = site
    assert main(["export", "--format", "meds", "--columns", "hr", "--warehouse", str(p), "--out",
                 str(tmp_path / "m")]) == 3
    assert "--columns applies to --format parquet only" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()
    _export(p, tmp_path / "t", capsys, "--split", "test", "--json", str(tmp_path / "e.json"))
    import json

    out = json.loads((tmp_path / "e.json").read_text())
    assert out["format"] == "meds" and out["split"] == "test"
    assert [d.name for d in (tmp_path / "t" / "data").iterdir()] == ["held_out"]
