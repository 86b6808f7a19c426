"""The report's ledger card and stale marks tell the truth after any forget, re-render, copy and
move of a runs folder (issue 18, the auditor sequence); runs folders are registered by identity.

The sequence runs the product path: ``run-all`` (build-cohort, retention, report) on a small
synthetic cohort with one ephemeral Prefect server, then ``forget``; the report is read back as
HTML. ``tests/test_dashboards_browser.py`` reads the same cards in headless Chromium.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path

import pytest

from pipelines.receipts.ledger import Ledger, default_dir
from pipelines.store import runs_registry
from pipelines.store.forget import forget_subject
from pipelines.store.keys import Keys
from pipelines.store.warehouse import Warehouse, stays

SKIP = ("heldout-spo2", "patient-deletion", "deterioration", "audit", "studies", "fidelity")


# ------------------------------------------------------------------------------ reading a report
def ledger_count(page: str) -> int:
    """The receipt count the rendered ledger card shows."""
    m = re.search(r'<span class="count">([\d,]+)</span> deletion receipt', page)
    assert m, "no ledger card headline in the report"
    return int(m.group(1).replace(",", ""))


def card_head(page: str, study: str) -> str:
    """The heading of ``study``'s card (title and badges)."""
    m = re.search(rf'<article class="study[^"]*" id="study-{study}">.*?</h3>', page, re.S)
    assert m, f"no card for {study}"
    return m.group(0)


def stale_badge(page: str, study: str) -> int | None:
    m = re.search(r"stale since receipt #(\d+)", card_head(page, study))
    return int(m.group(1)) if m else None


def card_json(runs: Path) -> dict:
    return json.loads((runs / "ledger" / "result.json").read_text())["metrics"]


def head_of(runs: Path) -> str:
    return Ledger(default_dir(runs / "warehouse.duckdb"), Keys.load()).verify()["head"]


# ------------------------------------------------------------------------------ the auditor sequence
def run_all_small(runs: Path) -> None:
    """``forgetful run-all --source synthetic --stays 24`` with the slow steps skipped."""
    from pipelines.flows.run_all import run_all_flow
    from pipelines.runtime import runner
    from pipelines.settings import CohortSettings, RetentionSettings, RunAllSettings

    settings = RunAllSettings(cohort=CohortSettings(stays=24, seed=0, memory_limit="1GB"),
                              retention=RetentionSettings(n_boot=50), skip=tuple(SKIP))
    with runner.results_context(str(runs)):
        run_all_flow.with_options(task_runner=runner.make_task_runner(None, 2))(
            source="synthetic", runs_dir=str(runs), settings=settings, progress=False)


_SEQUENCE: dict[str, dict] = {}  # one run per test session, shared with tests/test_dashboards_browser.py


def auditor_sequence(tmp_path_factory) -> dict:
    """The sequence's outcome, computed once per session (needs the ``prefect_harness`` fixture)."""
    if "done" not in _SEQUENCE:
        _SEQUENCE["done"] = _run_sequence(tmp_path_factory.mktemp("auditor"))
    return _SEQUENCE["done"]


#: the receipt count each page's ledger card must show
EXPECTED_COUNT = {"run-all": 0, "after forget": 1, "re-rendered": 1, "copy after forget": 2,
                  "original after 2nd forget": 2, "copy after original's 2nd forget": 2}


@pytest.fixture(scope="module")
def auditor(prefect_harness, tmp_path_factory):
    return auditor_sequence(tmp_path_factory)


def _run_sequence(root: Path) -> dict:
    """run-all → forget → re-render → copy the runs folder → forget on the copy → forget on the original.

    Returns the folders and the report text after each step (what an auditor would have opened)."""
    runs = root / "runs"
    run_all_small(runs)
    subjects = [s for _, s, _, _ in stays(runs / "warehouse.duckdb")]
    pages = {"run-all": (runs / "report.html").read_text()}
    forget_subject(runs / "warehouse.duckdb", subject_id=subjects[0], verify=False)
    pages["after forget"] = (runs / "report.html").read_text()
    from dashboards.report import main

    assert main(["--runs", str(runs), "--out", str(runs / "report.html")]) == 0
    pages["re-rendered"] = (runs / "report.html").read_text()
    copy = root / "runs_copy"
    shutil.copytree(runs, copy)
    before_copy_forget = {f: (runs / f).read_bytes() for f in ("stale.json", "ledger/result.json", "report.html")}
    forget_subject(copy / "warehouse.duckdb", subject_id=subjects[1], verify=False)
    pages["copy after forget"] = (copy / "report.html").read_text()
    untouched = all((runs / f).read_bytes() == b for f, b in before_copy_forget.items())
    forget_subject(runs / "warehouse.duckdb", subject_id=subjects[2], verify=False)
    pages["original after 2nd forget"] = (runs / "report.html").read_text()
    pages["copy after original's 2nd forget"] = (copy / "report.html").read_text()
    return {"runs": runs, "copy": copy, "pages": pages, "original_untouched_by_copy": untouched,
            "subjects": subjects}


def test_the_card_counts_the_receipts_of_its_own_ledger_after_every_step(auditor):
    runs, copy, pages = auditor["runs"], auditor["copy"], auditor["pages"]
    # after forget: the report the forget re-rendered itself; copy after forget: the copied receipt + its own
    assert {name: ledger_count(page) for name, page in pages.items()} == EXPECTED_COUNT
    assert "the ledger is empty" in pages["run-all"] and "the ledger is empty" not in pages["after forget"]
    assert auditor["original_untouched_by_copy"]  # a forget on the copy leaves the original as it was
    for folder in (runs, copy):
        card = card_json(folder)
        assert card["receipts"] == 2 and card["chain_verified"] is True
        assert card["head"] == head_of(folder)  # each card carries the head of its own folder's ledger
    assert head_of(runs) != head_of(copy)  # two ledgers that diverged after the copy


def test_stale_marks_are_per_folder_and_never_on_the_ledger_card(auditor):
    pages = auditor["pages"]
    assert stale_badge(pages["run-all"], "cohort") is None and stale_badge(pages["run-all"], "icu_retention") is None
    for name in ("after forget", "re-rendered", "copy after forget", "original after 2nd forget"):
        page = pages[name]
        # results computed before the first deletion stay "stale since #1" after later ones
        assert stale_badge(page, "cohort") == 1 and stale_badge(page, "icu_retention") == 1, name
        assert stale_badge(page, "ledger") is None, name  # rewritten by every forget: never stale
        assert "stale since" not in card_head(page, "ledger")
    skipped = re.search(r"skipped non-result JSON files: ([^<]*)<", pages["after forget"])
    assert skipped is None or "stale.json" not in skipped.group(1)  # the stale marks are the report's own input
    st = json.loads((auditor["copy"] / "stale.json").read_text())
    assert st["receipt_seq"] == 1 and "ledger/result.json" not in st["files"]
    assert {"cohort/result.json", "icu_retention/result.json"} <= set(st["files"])


def test_a_rerun_clears_its_mark_in_its_folder_only(auditor, tmp_path):
    from dashboards.report import render_report
    from pipelines.runtime.runner import write_study_result

    other = tmp_path / "runs_other"
    shutil.copytree(auditor["copy"], other)
    res = json.loads((other / "cohort" / "result.json").read_text())
    write_study_result(res, other)  # what rerunning build-cohort there writes
    page = render_report(other)
    assert stale_badge(page, "cohort") is None and stale_badge(page, "icu_retention") == 1
    assert stale_badge(render_report(auditor["copy"]), "cohort") == 1


def test_runs_folders_are_registered_by_identity(auditor):
    runs, copy = auditor["runs"], auditor["copy"]
    idf = runs / runs_registry.ID_FILE
    assert stat.S_IMODE(idf.stat().st_mode) == 0o600  # owner-only
    assert idf.read_text() == (copy / runs_registry.ID_FILE).read_text()  # copied with the folder ...
    with Warehouse.open(runs / "warehouse.duckdb") as w:
        assert w.runs_dirs() == [runs.resolve()]
    with Warehouse.open(copy / "warehouse.duckdb") as w:
        assert w.runs_dirs() == [copy.resolve()]  # ... yet each warehouse finds its own folder
    # the stored registration holds a relative path and the folder's id, not just an absolute path
    with Warehouse.open(copy / "warehouse.duckdb") as w:
        (entry,) = w.runs_registry()
    assert entry["rel"] == "." and entry["id"] == idf.read_text().strip()


# ------------------------------------------------------------------------------ the registry alone
def _folder(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


def test_moved_folder_is_found_and_a_registered_copy_gets_its_own_id(tmp_path):
    base = _folder(tmp_path / "warehouse-home")
    a = _folder(tmp_path / "project" / "runs")
    entries = runs_registry.register([], a, base)
    (e,) = entries
    assert e["rel"] == os.path.relpath(a, base) and runs_registry.resolve(entries, base) == [a.resolve()]
    # moved (the old place is gone): not found by path ...
    moved = tmp_path / "elsewhere" / "runs"
    moved.parent.mkdir()
    a.rename(moved)
    assert runs_registry.resolve(entries, base) == []
    # ... until registered again, which keeps its identity and updates where it is
    entries = runs_registry.register(entries, moved, base)
    assert [x["id"] for x in entries] == [e["id"]] and runs_registry.resolve(entries, base) == [moved.resolve()]
    # a copy registered with the same warehouse while the original still exists: a new folder, new id
    dup = tmp_path / "dup"
    shutil.copytree(moved, dup)
    entries = runs_registry.register(entries, dup, base)
    assert len({x["id"] for x in entries}) == 2
    assert runs_registry.folder_id(dup) != runs_registry.folder_id(moved)
    assert sorted(runs_registry.resolve(entries, base)) == sorted([moved.resolve(), dup.resolve()])
    # registering again changes nothing
    assert runs_registry.register(entries, dup, base) == entries


def test_the_folder_moves_with_its_warehouse(tmp_path):
    runs = _folder(tmp_path / "a" / "runs")
    entries = runs_registry.register([], runs, runs)  # the warehouse lives in the runs folder
    shutil.move(str(tmp_path / "a"), str(tmp_path / "b"))
    assert runs_registry.resolve(entries, tmp_path / "b" / "runs") == [(tmp_path / "b" / "runs").resolve()]


def test_legacy_absolute_entries_still_work_and_are_upgraded(tmp_path):
    runs = _folder(tmp_path / "runs")
    legacy = runs_registry.load(json.dumps([str(runs)]))
    assert legacy == [{"id": None, "rel": None, "abs": str(runs)}]
    assert runs_registry.resolve(legacy, tmp_path) == [runs.resolve()]
    up = runs_registry.register(legacy, runs, tmp_path)
    assert len(up) == 1 and up[0]["id"] == runs_registry.folder_id(runs) and up[0]["rel"] == "runs"
    assert runs_registry.load(runs_registry.dump(up)) == up


def test_an_id_file_that_is_not_an_id_is_replaced(tmp_path):
    runs = _folder(tmp_path / "runs")
    (runs / runs_registry.ID_FILE).write_text("../../etc/passwd\n")
    assert runs_registry.folder_id(runs) is None
    fid = runs_registry.folder_id(runs, create=True)
    assert re.fullmatch(r"[0-9a-f]{32}", fid) and runs_registry.folder_id(runs) == fid


def test_a_folder_that_cannot_hold_an_id_is_remembered_by_path(tmp_path, monkeypatch):
    runs = _folder(tmp_path / "runs")

    def read_only(folder, fresh):
        raise PermissionError(13, "Permission denied", str(folder))

    monkeypatch.setattr(runs_registry, "_write_id", read_only)  # as in a folder we may not write into
    entries = runs_registry.register([], runs, tmp_path)
    assert entries == [{"id": None, "rel": None, "abs": str(runs.resolve())}]
    assert runs_registry.register(entries, runs, tmp_path) == entries
    assert runs_registry.resolve(entries, tmp_path) == [runs.resolve()]
    assert not (runs / runs_registry.ID_FILE).exists()


def test_links_in_place_of_the_id_file_are_never_followed(tmp_path):
    runs = _folder(tmp_path / "runs")
    decoy = tmp_path / "decoy.txt"
    decoy.write_text("0123456789abcdef0123456789abcdef\n")  # looks like an id: still not read through the link
    (runs / runs_registry.ID_FILE).symlink_to(decoy)
    (runs / f"{runs_registry.ID_FILE}.tmp{os.getpid()}").symlink_to(decoy)
    assert runs_registry.folder_id(runs) is None
    (e,) = runs_registry.register([], runs, tmp_path)
    assert e["id"] != "0123456789abcdef0123456789abcdef" and decoy.read_text().startswith("0123456789abcdef")
    assert not (runs / runs_registry.ID_FILE).is_symlink() and runs_registry.folder_id(runs) == e["id"]
