"""A stopped command leaves no flow, subflow or task run "Running" in the Prefect database/UI
(pipelines.runtime.crash_hooks; the hooks are wired into every CLI flow by ``runner.run_cli_flow`` and
the signal guard calls ``cancel_active`` before it stops the API server).

The flow below is what a ``run-all`` looks like when SIGINT arrives: a subflow is in flight, a
task runs in a worker thread, and the main thread is blocked waiting for it. The guard then gives
up on the threads and exits, so Prefect never reports an end state. The test checks first that
without ``cancel_active`` every run stays open (so it can fail), then that with it the root run
is CRASHED and the subflow and task runs are CANCELLED.
"""
from __future__ import annotations

import threading
import uuid

import pytest

OPEN = {"RUNNING", "PENDING", "SCHEDULED"}


def _states(name: str) -> tuple[list[str], list[str]]:
    """(flow run state types, task run state types) of the runs of the flow called ``name``."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        TaskRunFilter,
        TaskRunFilterFlowRunId,
    )

    with get_client(sync_client=True) as c:
        runs = c.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[name])))
        ids = [r.id for r in runs]
        flt = TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=ids))
        tasks = c.read_task_runs(task_run_filter=flt) if ids else []
    return sorted(r.state_type.value for r in runs), sorted(t.state_type.value for t in tasks)


@pytest.mark.parametrize("guard_cancels", [False, True], ids=["no-cancel", "cancel-active"])
def test_a_stopped_command_leaves_no_run_open(prefect_harness, guard_cancels):
    from prefect import flow, task

    from pipelines.runtime import crash_hooks

    tag = uuid.uuid4().hex[:8]
    started, release = threading.Event(), threading.Event()

    @task(name=f"slow-{tag}")
    def slow() -> int:
        started.set()
        release.wait(60)
        return 1

    @flow(name=f"child-{tag}")
    def child() -> None:
        fut = slow.submit()
        release.wait(60)  # the main thread, blocked while the worker runs
        fut.result()

    @flow(name=f"parent-{tag}")
    def parent() -> None:
        child()

    f = parent.with_options(on_running=[crash_hooks.record_running],
                            on_crashed=[crash_hooks.cancel_abandoned])
    crash_hooks.ACTIVE.clear()
    th = threading.Thread(target=lambda: _swallow(f), daemon=True)
    th.start()
    try:
        assert started.wait(60), "the task never started"
        assert len(crash_hooks.ACTIVE) == 1  # the root run was recorded by the on_running hook
        if guard_cancels:
            changed = crash_hooks.cancel_active("stopped by SIGINT", deadline_s=10)
            assert changed >= 3  # root crashed, subflow and task cancelled
        parent_flows, _ = _states(f"parent-{tag}")
        child_flows, child_tasks = _states(f"child-{tag}")
    finally:
        release.set()
        th.join(60)
        crash_hooks.ACTIVE.clear()
    if not guard_cancels:  # what a stopped command left behind before
        assert parent_flows == ["RUNNING"] and child_flows == ["RUNNING"] and child_tasks == ["RUNNING"]
        return
    assert parent_flows == ["CRASHED"]
    assert child_flows == ["CANCELLED"] and child_tasks == ["CANCELLED"]


def _swallow(f) -> None:
    try:
        f()
    except BaseException:  # noqa: BLE001 - the released run may be refused its end state
        pass


def test_cancel_active_is_bounded_and_silent_without_an_api(monkeypatch):
    """No server: the pass returns within its deadline and raises nothing."""
    import time

    from pipelines.runtime import crash_hooks

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # nothing listens there
    monkeypatch.setattr(crash_hooks, "ACTIVE", {uuid.uuid4()})
    t0 = time.monotonic()
    assert crash_hooks.cancel_active(deadline_s=0.5) == 0
    assert time.monotonic() - t0 < 5
