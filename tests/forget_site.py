"""Shared site of the issue-19 hardening tests (``test_forget_links``, ``test_forget_storage``):
the hand-written MIMIC fixture built once through the pipelines' build, copied fresh per test,
and small helpers (sha256 of files and trees, presence of the target patient, receipts count)."""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import duckdb

from pipelines.cli import main
from pipelines.receipts.ledger import Ledger, default_dir
from pipelines.store.keys import Keys

FIX = Path(__file__).parent / "fixtures" / "cohort"
TARGET, OTHER = 101, 103  # subjects of the MIMIC fixture's stays 301 and 303 (both in the cohort)


def build_site(p: Path, root: Path) -> dict:
    from pipelines.flows.clinical_cohort import build_task
    from pipelines.settings import CohortSettings

    return build_task.fn("mimic", str(root), str(p), CohortSettings(memory_limit="512MB"), runs_dir=str(p.parent))


def make_base(tmp_path_factory) -> tuple[Path, Path]:
    """(warehouse, source root): the fixture built once per test module."""
    d = tmp_path_factory.mktemp("hard")
    root = d / "src"
    shutil.copytree(FIX / "mimic_small", root)
    p = d / "runs" / "warehouse.duckdb"
    build_site(p, root)
    return p, root


def copy_site(base, tmp_path) -> tuple[Path, Path]:
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


def export_to(p: Path, out: Path, capsys) -> None:
    assert main(["export", "--warehouse", str(p), "--out", str(out)]) == 0
    capsys.readouterr()


