"""Issue 31: a forgotten patient stays forgotten under ordinary operator mistakes, and no user file
is ever touched. One test (or two) per item of the issue, each reproducing the attack it closes:

1. a second warehouse of the same source (and an older one) admits no forgotten patient; a
   registry of the source that cannot be read refuses the build (one line, exit 3);
2. restored copies of export folders are caught by ``receipts verify`` and cleaned by the next
   forget, which rewrites exports against the whole registry;
4. a failed export registers nothing; files a user keeps under export names — in a folder a
   failed export named, or beside a registered export's own files — are left byte for byte;
5. links on the receipt-log folder, its signed-head file, the anchors folder and a runs folder
   are refused (one line, exit 3) with decoys unchanged and no receipt committed half;
6. a re-keyed copy of a forgotten stay (new stay id, new subject, shifted dates) is dropped by
   content and counted in the funnel;
7. a missing or replaced signing or ledger key with an existing log is one line, exit 3, naming
   the recovery; no key is made.

Item 3 (orphan temporaries, kill at every rewrite step) is ``tests/test_forget_orphans.py``.
Every attack aims at decoy files in a temporary folder only; no id is printed.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import duckdb
import polars as pl
import pytest
from forget_site import TARGET, build_site, err_lines, export_to, make_base, present, receipts, sha, tree_sha

from pipelines.cli import main
from pipelines.receipts.ledger import default_dir
from pipelines.store.warehouse import Warehouse, read_meta

OTHER, LAST = 102, 105  # the fixture cohort's other patients (stays 302, 305)

@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_base(tmp_path_factory)


@pytest.fixture
def site(base, tmp_path):
    """(warehouse, source root, the base warehouse): a fresh copy in its own runs folder."""
    p0, root = base
    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copy(p0, runs / p0.name)
    return runs / p0.name, root, p0


def _forget(p: Path, subject: int, capsys) -> None:
    assert main(["forget", "--subject-id", str(subject), "--warehouse", str(p)]) == 0
    capsys.readouterr()


def _verify(p: Path, capsys) -> tuple[int, dict, str]:
    rc = main(["receipts", "verify", "--warehouse", str(p)])
    cap = capsys.readouterr()
    return rc, json.loads(cap.out.strip().splitlines()[-1]), cap.err


def _funnel(summary: dict) -> dict[str, int]:
    return {step: n for step, n, _ in summary["funnel"]}


# ============================================================================ 1. registry by source
def test_a_second_warehouse_of_the_same_source_admits_no_forgotten_patient(site, tmp_path, capsys):
    p, root, _ = site
    early = tmp_path / "early" / "warehouse.duckdb"  # built from the same source before the forgets
    build_site(early, root)
    assert present(early, TARGET) > 0
    for s in (TARGET, OTHER):
        _forget(p, s, capsys)
    second = tmp_path / "elsewhere" / "warehouse.duckdb"  # another folder: another forget-registry/ beside it
    s = build_site(second, root)
    assert present(second, TARGET) == 0 and present(second, OTHER) == 0
    funnel = _funnel(s)
    assert funnel["one_subject_per_stay"] - funnel["not_in_forget_registry"] == 2  # counts only
    assert not (default_dir(second) / "receipts.jsonl").exists()  # its own log is empty: the source's applies
    # the older warehouse: its next writing command (an export) completes the erasure before reading a row
    out = tmp_path / "early-export"
    assert main(["export", "--warehouse", str(early), "--out", str(out)]) == 0
    capsys.readouterr()
    assert pl.read_parquet(out / "stays.parquet").filter(pl.col("subject_id").is_in([TARGET, OTHER])).height == 0
    assert present(early, TARGET) == 0 and present(early, OTHER) == 0
    for w in (second, early):
        assert _verify(w, capsys)[0] == 0
    # a forget in the second warehouse reaches the others too (one registry per source)
    _forget(second, LAST, capsys)
    rc, out, _ = _verify(early, capsys)
    assert rc == 1 and out["pending_erasures"] == 1  # named by the second warehouse's registry
    with Warehouse.open(early):  # any writing command completes it
        pass
    assert present(early, LAST) == 0 and _verify(early, capsys)[0] == 0


def test_a_registry_that_cannot_be_read_refuses_the_build(site, tmp_path, capsys):
    from pipelines.errors import RegistryUnreadableError

    p, root, p0 = site
    _forget(p, TARGET, capsys)
    moved = tmp_path / "moved-away"
    shutil.move(default_dir(p), moved)  # the operator moved the first warehouse's registry away
    second = tmp_path / "elsewhere" / "warehouse.duckdb"
    with pytest.raises(RegistryUnreadableError, match="restore it from your backup"):
        build_site(second, root)
    assert not second.exists()
    # any writing command on a warehouse of the source: one typed line, exit 3, nothing changed
    other = tmp_path / "other" / "warehouse.duckdb"
    other.parent.mkdir()
    shutil.copy(p0, other)
    before = sha(other)
    assert main(["export", "--warehouse", str(other), "--out", str(tmp_path / "x")]) == 3
    lines = err_lines(capsys)
    assert len(lines) == 1 and lines[0].startswith("error: RegistryUnreadableError:"), lines
    assert sha(other) == before and not (tmp_path / "x").exists()
    # an edited registry is refused the same way
    shutil.move(moved, default_dir(p))
    log = default_dir(p) / "receipts.jsonl"
    good = log.read_bytes()
    log.write_bytes(good.replace(b'"n_stays":1', b'"n_stays":0'))
    with pytest.raises(RegistryUnreadableError):
        build_site(second, root)
    log.write_bytes(good)
    build_site(second, root)  # restored: built, without the patient
    assert present(second, TARGET) == 0 and present(second, OTHER) > 0


# ============================================================================ 2. restored exports
def _subject_rows(f: Path, subject: int) -> int:
    return pl.read_parquet(f).filter(pl.col("subject_id") == subject).height


def _rows(folder: Path, subject: int) -> int:
    """A Parquet export's stays of ``subject``, or a MEDS export's events and split rows."""
    if (folder / "stays.parquet").exists():
        return _subject_rows(folder / "stays.parquet", subject)
    return sum(_subject_rows(f, subject) for f in sorted(folder.rglob("*.parquet")) if f.name != "codes.parquet")


def test_restored_export_copies_are_caught_by_verify_and_cleaned(site, tmp_path, capsys):
    p, _, _ = site
    pq_exp, meds_exp = tmp_path / "pq", tmp_path / "meds"
    export_to(p, pq_exp, capsys)
    assert main(["export", "--format", "meds", "--warehouse", str(p), "--out", str(meds_exp)]) == 0
    backup = tmp_path / "backup"
    for d in (pq_exp, meds_exp):
        shutil.copytree(d, backup / d.name)
    _forget(p, TARGET, capsys)
    assert _rows(pq_exp, TARGET) == 0 and _rows(meds_exp, TARGET) == 0
    for d in (pq_exp, meds_exp):  # the operator puts the copies back
        shutil.rmtree(d)
        shutil.copytree(backup / d.name, d)
    assert _rows(pq_exp, TARGET) > 0 and _rows(meds_exp, TARGET) > 0
    rc, out, err = _verify(p, capsys)
    assert rc == 1 and out["export_forgotten_rows"] > 0 and out["warehouse_verified"] is False
    assert "NOT VERIFIED" in err and str(TARGET) not in err
    assert all(type(v) is int for k, v in out.items() if k.startswith("export_"))  # counts only
    with Warehouse.open(p):  # any writing command: the changed export files are cleaned first
        pass
    assert _rows(pq_exp, TARGET) == 0 and _rows(meds_exp, TARGET) == 0 and _rows(pq_exp, OTHER) > 0
    assert _verify(p, capsys)[0] == 0
    for d in (pq_exp, meds_exp):  # put back once more: the next forget rewrites against the whole registry
        shutil.rmtree(d)
        shutil.copytree(backup / d.name, d)
    _forget(p, OTHER, capsys)
    for d in (pq_exp, meds_exp):
        assert _rows(d, TARGET) == 0 and _rows(d, OTHER) == 0
    rc, out, _ = _verify(p, capsys)
    assert rc == 0 and out["export_forgotten_rows"] == 0 and out["export_files_not_ours"] == 0


# ============================================================================ 4. register only what was written
def test_a_failed_export_registers_nothing_and_user_files_are_never_touched(site, tmp_path, capsys):
    p, _, _ = site
    real, meds_real = tmp_path / "real", tmp_path / "meds-real"
    export_to(p, real, capsys)
    assert main(["export", "--format", "meds", "--warehouse", str(p), "--out", str(meds_real)]) == 0
    mine, mine_meds = tmp_path / "mine", tmp_path / "mine-meds"
    mine.mkdir()
    mine_meds.mkdir()
    assert main(["export", "--warehouse", str(p), "--out", str(mine), "--columns", "nope"]) in (2, 3)
    assert main(["export", "--format", "meds", "--warehouse", str(p), "--out", str(mine_meds),
                 "--shard-subjects", "0"]) in (2, 3)
    capsys.readouterr()
    assert list(mine.iterdir()) == [] and list(mine_meds.iterdir()) == []  # nothing left of the failed exports
    # files the user keeps there later, named like an export (copies with the patient's rows)
    for f in ("stays.parquet", "hourly.parquet"):
        shutil.copy(real / f, mine / f)
    for t in ("data", "metadata"):
        shutil.copytree(meds_real / t, mine_meds / t)
    # and, in registered exports: the user's own file beside the export's, and an export file the user replaced
    shard = next(f for f in sorted((meds_real / "data").rglob("*.parquet")) if _subject_rows(f, TARGET))
    extra = shard.parent / "99.parquet"
    shutil.copy(shard, extra)
    replaced = real / "hourly.parquet"
    pl.read_parquet(replaced).head(5).write_parquet(replaced)
    before = {d: tree_sha(d) for d in (mine, mine_meds)} | {extra: sha(extra), replaced: sha(replaced)}
    assert main(["forget", "--subject-id", str(TARGET), "--warehouse", str(p)]) == 0
    assert "2 file(s) in registered export folders are not the ones forgetful wrote" in capsys.readouterr().err
    assert {d: tree_sha(d) for d in (mine, mine_meds)} | {extra: sha(extra), replaced: sha(replaced)} == before
    assert _rows(real, TARGET) == 0 and _subject_rows(shard, TARGET) == 0  # the export's own files: cleaned
    assert _subject_rows(extra, TARGET) > 0
    assert sorted(json.loads(read_meta(p)["export_files"])) == sorted([str(real), str(meds_real)])  # only these


# ============================================================================ 5. links where the project writes
@pytest.fixture
def decoys(tmp_path):
    d = tmp_path / "decoys"
    d.mkdir()
    (d / "receipts.jsonl").write_bytes(b'{"decoy": 1}\n')
    (d / "heads.jsonl").write_bytes(b'{"decoy": 2}\n')
    return d


def _refused(rc: int, capsys) -> None:
    lines = err_lines(capsys)
    assert rc == 3 and len(lines) == 1 and lines[0].startswith("error: UnsafePathError:"), lines
    assert "symbolic link" in lines[0]


def test_a_linked_receipt_log_folder_is_refused(site, decoys, capsys):
    p, _, _ = site
    default_dir(p).symlink_to(decoys, target_is_directory=True)
    before, wh = tree_sha(decoys), sha(p)
    _refused(main(["forget", "--subject-id", str(TARGET), "--warehouse", str(p)]), capsys)
    assert tree_sha(decoys) == before and sha(p) == wh and present(p) > 0


def test_a_linked_signed_head_file_commits_nothing(site, decoys, capsys):
    p, _, _ = site
    _forget(p, TARGET, capsys)
    heads = default_dir(p) / "heads.jsonl"
    kept = heads.read_bytes()
    heads.unlink()
    heads.symlink_to(decoys / "heads.jsonl")
    before = tree_sha(decoys)
    log0 = (default_dir(p) / "receipts.jsonl").read_bytes()
    _refused(main(["forget", "--subject-id", str(OTHER), "--warehouse", str(p)]), capsys)
    assert tree_sha(decoys) == before and (default_dir(p) / "receipts.jsonl").read_bytes() == log0  # no receipt #2
    heads.unlink()
    heads.write_bytes(kept)
    assert _verify(p, capsys)[0] == 0  # the operator's log is whole
    _forget(p, OTHER, capsys)
    assert receipts(p) == 2


def test_linked_runs_and_anchor_folders_are_refused(site, tmp_path, monkeypatch, capsys):
    from pipelines.receipts import logaudit

    p, _, _ = site
    results = tmp_path / "results"
    with Warehouse.open(p) as w:
        w.register_runs_dir(results)
    (results / "ledger").mkdir()
    (results / "ledger" / "result.json").write_text('{"decoy": true}')
    copy = tmp_path / "results-copy"
    shutil.copytree(results, copy)
    shutil.rmtree(results)
    results.symlink_to(copy, target_is_directory=True)  # runs/ as a link to a copy
    before = tree_sha(copy)
    _refused(main(["forget", "--subject-id", str(TARGET), "--warehouse", str(p)]), capsys)
    assert tree_sha(copy) == before and not (default_dir(p) / "receipts.jsonl").exists()
    results.unlink()
    # the anchors folder of a configuration as a link (a fresh configuration, so the session's stays clean)
    cfg = tmp_path / "cfg"
    monkeypatch.setenv("FORGETFUL_CONFIG_DIR", str(cfg))
    anchors = logaudit.anchor_path(default_dir(p) / "receipts.jsonl").parent
    cfg.mkdir(mode=0o700)
    (tmp_path / "anchor-decoys").mkdir()
    anchors.symlink_to(tmp_path / "anchor-decoys", target_is_directory=True)
    _refused(main(["forget", "--subject-id", str(TARGET), "--warehouse", str(p)]), capsys)
    assert list((tmp_path / "anchor-decoys").iterdir()) == [] and not (default_dir(p) / "receipts.jsonl").exists()
    assert present(p) > 0


# ============================================================================ 6. content-level exclusion
def test_a_rekeyed_copy_of_a_forgotten_stay_is_dropped_by_content(tmp_path, capsys):
    from cohort.synthetic import generate
    from pipelines.flows.clinical_cohort import build_task
    from pipelines.settings import CohortSettings

    src = tmp_path / "src"
    generate(src, stays=10, seed=3, fmt="parquet")
    p = tmp_path / "runs" / "warehouse.duckdb"

    def build() -> dict:
        return build_task.fn("mimic", str(src), str(p), CohortSettings(min_hours=0, memory_limit="512MB"),
                             runs_dir=str(p.parent))
    n0 = build()["n_stays"]
    with duckdb.connect(str(p), read_only=True) as con:
        stay, subject = con.execute("SELECT stay_id, subject_id FROM cohort_stays ORDER BY n_hours DESC, stay_id "
                                    "LIMIT 1").fetchone()
        n_subject = con.execute("SELECT count(*) FROM cohort_stays WHERE subject_id = ?", [subject]).fetchone()[0]
    _forget(p, subject, capsys)
    # the source re-keys the stay: a copy under a new stay and a new subject, one of them shifted by a year
    icu = src / "icu"
    stays, ce = pl.read_parquet(icu / "icustays.parquet"), pl.read_parquet(icu / "chartevents.parquet")
    copies_s, copies_c = [], []
    for i, shift in enumerate((pl.duration(days=0), pl.duration(days=365))):
        new = {"subject_id": 90_000_001 + i, "hadm_id": 80_000_001 + i, "stay_id": 70_000_001 + i}
        copies_s.append(stays.filter(pl.col("stay_id") == stay).with_columns(
            *(pl.lit(v, dtype=pl.Int64).alias(k) for k, v in new.items()),
            pl.col("intime") + shift, pl.col("outtime") + shift))
        copies_c.append(ce.filter(pl.col("stay_id") == stay).with_columns(
            *(pl.lit(v, dtype=pl.Int64).alias(k) for k, v in new.items()),
            pl.col("charttime") + shift, pl.col("storetime") + shift))
    pl.concat([stays, *copies_s]).write_parquet(icu / "icustays.parquet")
    pl.concat([ce, *copies_c]).write_parquet(icu / "chartevents.parquet")
    s = build()
    funnel = _funnel(s)
    assert s["n_stays"] == n0 - n_subject  # neither copy admitted, nobody else dropped
    assert funnel["plausible_range"] - funnel["content_not_forgotten"] == 2
    with duckdb.connect(str(p), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM cohort_stays WHERE stay_id >= 70000001").fetchone()[0] == 0
    row = json.loads((default_dir(p) / "receipts.jsonl").read_text().splitlines()[-1])
    assert row["payload"]["content_fingerprints"]  # keyed fingerprints only: no value, no id


def test_content_blocks_need_dense_distinct_values():
    """Sparse or constant content is never fingerprinted (it could match another patient); a
    day's block is the same whatever day of the stay it is."""
    import numpy as np

    from cohort.build.content import MIN_CELLS, blocks

    rng = np.random.default_rng(0)
    hours = np.arange(48)
    vals = np.full((48, 6), np.nan)
    vals[:, 0] = rng.integers(60, 120, 48)
    assert len(blocks(hours, vals)) == 3  # the stay and both days
    assert blocks(hours[:MIN_CELLS - 1], vals[:MIN_CELLS - 1]) == []
    flat = np.full((48, 6), np.nan)
    flat[:, 4] = 98.0
    assert blocks(hours, flat) == []
    day2 = blocks(hours[24:] - 24, vals[24:])
    assert day2[1] == blocks(hours, vals)[2]


# ============================================================================ 7. keys never silently made
@pytest.fixture
def cfg(tmp_path, monkeypatch):
    c = tmp_path / "cfg"
    monkeypatch.setenv("FORGETFUL_CONFIG_DIR", str(c))
    return c


def test_a_moved_signing_key_is_refused_not_replaced(site, cfg, tmp_path, capsys):
    p, _, _ = site
    _forget(p, TARGET, capsys)  # a fresh configuration: keys made by this first command
    pub = tmp_path / "auditor.pub"
    assert main(["receipts", "public-key", "--out", str(pub)]) == 0
    good = pub.read_bytes()
    pub.unlink()
    shutil.move(cfg / "signing.key", tmp_path / "away.key")
    rc = main(["receipts", "public-key", "--out", str(pub)])
    lines = err_lines(capsys)
    assert rc == 3 and len(lines) == 1 and "restore signing.key from your backup" in lines[0], lines
    assert not (cfg / "signing.key").exists() and not pub.exists()
    rc = main(["forget", "--subject-id", str(OTHER), "--warehouse", str(p)])
    lines = err_lines(capsys)
    assert rc == 3 and len(lines) == 1 and "restore signing.key" in lines[0] and receipts(p) == 1
    # another key put in its place: refused too, never handed to an auditor
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    fd = os.open(cfg / "signing.key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    os.close(fd)
    rc = main(["receipts", "public-key", "--out", str(pub)])
    lines = err_lines(capsys)
    assert rc == 3 and len(lines) == 1 and "LedgerKeyMismatchError" in lines[0] and not pub.exists()
    (cfg / "signing.key").unlink()
    shutil.move(tmp_path / "away.key", cfg / "signing.key")  # the recovery named
    assert main(["receipts", "public-key", "--out", str(pub)]) == 0 and pub.read_bytes() == good


def test_a_moved_ledger_key_is_refused_not_recreated(site, cfg, tmp_path, capsys):
    p, _, _ = site
    _forget(p, TARGET, capsys)
    shutil.move(cfg / "ledger.key", tmp_path / "away.key")
    for argv in (["forget", "--subject-id", str(OTHER), "--warehouse", str(p)],
                 ["export", "--warehouse", str(p), "--out", str(tmp_path / "x")],
                 ["receipts", "verify", "--warehouse", str(p)]):
        rc = main(argv)
        lines = err_lines(capsys)
        assert rc == 3 and len(lines) == 1 and "LedgerKeyError" in lines[0] and "restore ledger.key" in lines[0], lines
        assert not (cfg / "ledger.key").exists()
    shutil.move(tmp_path / "away.key", cfg / "ledger.key")
    _forget(p, OTHER, capsys)
    assert receipts(p) == 2
