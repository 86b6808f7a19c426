"""One straight path per command (issue 34 item 2): the warehouse opened once and its handle reused
by every flow the command runs, and ``forgetful retention`` reaching its compute function through
each room once."""
from __future__ import annotations

import shutil
import sys
import threading

import pytest

from cohort.synthetic import make_small_warehouse

PROJECT = ("pipelines", "cohort", "evaluation", "sv_core", "models", "dashboards")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_small_warehouse(tmp_path_factory.mktemp("path") / "src", stays=24, seed=1)


@pytest.fixture
def site(base, tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    w = runs / "warehouse.duckdb"
    shutil.copy(base, w)
    return str(w), str(runs)


@pytest.fixture
def opens(monkeypatch):
    """Counts of what a real open does: the key read, the ledger check, the pending-erasure pass."""
    from pipelines.receipts import ledger
    from pipelines.store import forget_apply, keys

    n = {"keys": 0, "ledger": 0, "pending": 0}
    load, check, complete = keys.Keys.load.__func__, ledger.Ledger.check_recorded, forget_apply.complete_pending

    def counted(key, f):
        def g(*a, **k):
            n[key] += 1
            return f(*a, **k)
        return g
    monkeypatch.setattr(keys.Keys, "load", classmethod(counted("keys", load)))
    monkeypatch.setattr(ledger.Ledger, "check_recorded", counted("ledger", check))
    monkeypatch.setattr(forget_apply, "complete_pending", counted("pending", complete))
    return n


def test_an_open_inside_an_open_is_the_same_handle(site, opens):
    from pipelines.store.keys import HELD, for_warehouse
    from pipelines.store.warehouse import Warehouse

    w, _ = site
    with Warehouse.open(w) as outer:
        with Warehouse.open(w) as inner, Warehouse.open(w, write=False) as reader:
            assert inner is outer is reader and for_warehouse(w) is outer.keys
    assert opens == {"keys": 1, "ledger": 1, "pending": 1} and not HELD
    with Warehouse.open(w, write=False) as ro:  # a shared hold does not stand in for a writer's
        with Warehouse.open(w) as rw:
            assert rw is not ro and rw.writable and not ro.writable
    assert opens["keys"] == 3


def test_a_pending_erasure_is_still_completed_once_the_file_exists(site, tmp_path, opens):
    from pipelines.store.warehouse import Warehouse

    w, _ = site
    new = tmp_path / "later" / "warehouse.duckdb"
    new.parent.mkdir()
    with Warehouse.open(new, must_exist=False) as outer:  # run-all's open, before its build
        assert opens["pending"] == 0 and not outer.reconciled
        shutil.copy(w, new)
        with Warehouse.open(new, reconcile=False):  # the build's own open
            assert opens["pending"] == 0
        for _ in range(2):  # the studies' opens: completed on the first, once
            with Warehouse.open(new) as inner:
                assert inner is outer and outer.reconciled
    assert opens == {"keys": 1, "ledger": 1, "pending": 1}


def test_retention_walks_from_the_command_line_to_its_compute_function_in_a_straight_line(
        prefect_harness, site, opens, monkeypatch):
    from evaluation.clinical import retention as study
    from pipelines import cli

    w, runs = site
    stack: list[tuple[str, str]] = []
    real = study.stay_retention

    def spy(*a, **k):
        if not stack and threading.current_thread() is threading.main_thread():  # the pilot, in the flow's thread
            f = sys._getframe(1)
            while f is not None:
                mod = f.f_globals.get("__name__", "")
                if mod.split(".")[0] in PROJECT and f.f_code.co_name != "wrapper":  # decorators are no room
                    stack.append((mod, f.f_code.co_name))
                f = f.f_back
        return real(*a, **k)
    monkeypatch.setattr(study, "stay_retention", spy)
    rc = cli.main(["retention", "--warehouse", w, "--runs", runs, "--stays", "12", "--n-boot", "100",
                   "--audit-stays", "0", "--sensitivity-stays", "0", "--no-progress"])
    assert rc == 0 and stack
    rooms = []
    for mod, _ in reversed(stack):
        if not rooms or rooms[-1] != mod:
            rooms.append(mod)
    rooms.append("evaluation.clinical.retention")
    assert len(rooms) == len(set(rooms)) <= 8, rooms  # no room entered twice, at most ~8 of them
    assert rooms == ["pipelines.cli", "pipelines.flows.retention_cli", "pipelines.runtime.runner",
                     "pipelines.flows.clinical_retention", "pipelines.flows.retention_plan",
                     "pipelines.flows.retention_chunks", "evaluation.clinical.retention"]
    assert opens == {"keys": 1, "ledger": 1, "pending": 1}  # the command's one open; the flow took its handle
