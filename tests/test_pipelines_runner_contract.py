"""Upgrade safety (issue 23, item 6): the Prefect private attributes that
:class:`InterruptibleThreadPoolTaskRunner <pipelines.runtime.runner._interruptible_runner_class>` relies on
(``ThreadPoolTaskRunner._executor`` and ``._cancel_events``), checked against the installed
Prefect. Each failure names the attribute and the Prefect version, so an upgrade that changes them
fails here, loudly, instead of silently turning Ctrl-C back into "wait for the longest task".
The pin in pyproject.toml is checked to contain the installed (tested) Prefect.

No Prefect server is started: the runner is entered and exited directly, with plain callables
submitted to its executor."""
from __future__ import annotations

import concurrent.futures
import inspect
import threading
import time
import tomllib
import uuid
from pathlib import Path

import pytest

prefect = pytest.importorskip("prefect")
from prefect.task_runners import ThreadPoolTaskRunner  # noqa: E402

from pipelines.runtime import runner  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WHERE = "pipelines.runtime.runner.InterruptibleThreadPoolTaskRunner"


def _broken(attr: str, what: str) -> str:
    return (f"Prefect {prefect.__version__}: ThreadPoolTaskRunner.{attr} {what}; {WHERE} relies on it "
            f"(runner.PREFECT_PRIVATE_ATTRIBUTES) - adapt it to this Prefect, or keep Prefect within the pin")


def test_the_attributes_are_named_once():
    assert runner.PREFECT_PRIVATE_ATTRIBUTES == ("_executor", "_cancel_events")
    src = inspect.getsource(runner._interruptible_runner_class)
    for attr in runner.PREFECT_PRIVATE_ATTRIBUTES:
        assert attr in src, attr


def test_prefect_still_has_the_private_attributes():
    r = ThreadPoolTaskRunner(max_workers=1)
    for attr in runner.PREFECT_PRIVATE_ATTRIBUTES:
        if not hasattr(r, attr):
            pytest.fail(_broken(attr, "no longer exists after __init__"))
    if not isinstance(r._cancel_events, dict):
        pytest.fail(_broken("_cancel_events", f"is a {type(r._cancel_events).__name__}, no longer a dict"))
    r.__enter__()
    try:
        if not isinstance(r._executor, concurrent.futures.ThreadPoolExecutor):
            pytest.fail(_broken("_executor", f"is a {type(r._executor).__name__} inside the runner, "
                                             "no longer a ThreadPoolExecutor"))
    finally:
        r.__exit__(None, None, None)
    # submit() still registers one cancel event per task run and runs tasks on _executor
    src = inspect.getsource(ThreadPoolTaskRunner.submit)
    if "self._cancel_events[" not in src:
        pytest.fail(_broken("_cancel_events", "is no longer filled by submit()"))
    if "self._executor.submit(" not in src:
        pytest.fail(_broken("_executor", "no longer runs the submitted tasks"))


def _blocked(r) -> tuple[threading.Event, threading.Event, concurrent.futures.Future]:
    gate, cancel = threading.Event(), threading.Event()
    r._cancel_events[uuid.uuid4()] = cancel
    fut = r._executor.submit(gate.wait, 30)
    while not fut.running():
        time.sleep(0.001)
    return gate, cancel, fut


def test_prefects_own_exit_joins_the_executor():
    """What the override is for: Prefect's exit waits for a running task on ``_executor``."""
    r = ThreadPoolTaskRunner(max_workers=1)
    r.__enter__()
    gate, _, fut = _blocked(r)
    t = threading.Thread(target=r.__exit__, args=(KeyboardInterrupt, KeyboardInterrupt(), None), daemon=True)
    t.start()
    t.join(0.5)
    joined = t.is_alive()
    gate.set()
    t.join(30)
    if not joined:
        pytest.fail(_broken("_executor", "is no longer what Prefect's __exit__ waits on (the override may be moot "
                                         "or no longer effective)"))
    assert fut.done()


def test_an_interrupt_abandons_the_running_worker_and_sets_its_cancel_event():
    r = runner.make_task_runner(None, 1)
    r.__enter__()
    gate, cancel, fut = _blocked(r)
    t0 = time.perf_counter()
    try:
        r.__exit__(KeyboardInterrupt, KeyboardInterrupt(), None)
        waited = time.perf_counter() - t0
        if waited > 5:
            pytest.fail(_broken("_executor", f"shutdown joined the running task ({waited:.1f} s)"))
        if not cancel.is_set():
            pytest.fail(_broken("_cancel_events", "events were not set on interrupt"))
        assert fut.running() and r._executor is None
    finally:
        gate.set()
        fut.result(30)
    # an ordinary exit still waits for running work (nothing abandoned)
    r2 = runner.make_task_runner(None, 1)
    r2.__enter__()
    done = []
    r2._executor.submit(lambda: (time.sleep(0.2), done.append(1)))
    r2.__exit__(None, None, None)
    assert done == [1]


def test_the_pinned_prefect_range_holds_the_tested_version():
    from packaging.requirements import Requirement

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    req = next(Requirement(d) for d in deps if Requirement(d).name == "prefect")
    assert req.specifier.contains(prefect.__version__), (
        f"Prefect {prefect.__version__} is installed but pyproject.toml pins {req.specifier}: run this test file "
        "against the new Prefect, then move the pin")
    from packaging.version import Version

    bounds = {s.operator: Version(s.version) for s in req.specifier}
    lo, hi = bounds.get(">="), bounds.get("<")
    assert lo and hi and len(bounds) == 2 and (hi.major, hi.minor) == (lo.major, lo.minor + 1), (
        f"pin Prefect to the one tested minor release (>=X.Y,<X.Y+1), got {req.specifier}")
