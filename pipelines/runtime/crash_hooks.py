"""No run is left "Running" in the Prefect database/UI after a stopped command.

When a command is stopped (SIGINT/SIGTERM, :mod:`pipelines.runtime.signals`), its worker threads are
abandoned and the process exits after a short grace period, often while the main thread is still
waiting for those threads inside the task runner, so Prefect never reports the end of the flow
run, of the task runs in flight or of a ``run-all`` subflow run: they would stay *Running* (or
*Pending*) for ever. Every CLI flow (``runner.run_cli_flow``) therefore carries two hooks:

* ``on_running`` → :func:`record_running`: the root flow run of this process is remembered;
* ``on_crashed`` → :func:`cancel_abandoned`: when Prefect does see the crash, the crashed run's
  unfinished subflow and task runs are cancelled;

and the signal guard calls :func:`cancel_active` just before it stops the API server: every
remembered root run still open is set *Crashed* ("stopped by SIGINT"), and its unfinished subflow
runs and task runs *Cancelled* (forced, with a one-line message). Best effort and bounded: each
request times out after ``TIMEOUT_S`` and the whole pass stops at its deadline; it never changes
the command's exit.
"""
from __future__ import annotations

import threading
import time
from typing import Any

#: per-request timeout of the API calls: with the 1 s deadline of :func:`cancel_active` the
#: signal guard still leaves within 5 s (3.5 s grace + 1 s + one late request)
TIMEOUT_S = 0.5
#: at most this many subflow generations / runs are visited
MAX_DEPTH = 8
MAX_RUNS = 2000
#: the API's page size limit (Prefect rejects a larger ``limit``)
PAGE = 200
MESSAGE = "abandoned: the command was stopped before this run finished"


#: root flow runs of this process that reached Running (ids), for :func:`cancel_active`
ACTIVE: set[Any] = set()
_lock = threading.Lock()


def record_running(flow: Any, flow_run: Any, state: Any) -> None:
    """``on_running`` hook: remember this process's root flow run."""
    with _lock:
        ACTIVE.add(flow_run.id)


def cancel_active(reason: str = "the command was stopped", deadline_s: float = 1.0) -> int:
    """Close every remembered root run that is still open (Crashed) and cancel its unfinished
    descendants; returns how many runs were changed. Called by the signal guard."""
    with _lock:
        roots = list(ACTIVE)
    end = time.monotonic() + deadline_s
    changed = 0
    for root in roots:
        if time.monotonic() >= end:
            break
        try:
            changed += _cancel(root, end, crash_root=reason)
        except Exception:  # noqa: BLE001 - best effort while the command is going down
            pass
    return changed


def cancel_abandoned(flow: Any, flow_run: Any, state: Any) -> None:
    """``on_crashed`` hook: cancel the crashed run's unfinished subflow runs and task runs."""
    try:
        _cancel(flow_run.id)
    except Exception:  # noqa: BLE001 - best effort while the command is going down
        pass


def _cancel(root: Any, end: float | None = None, crash_root: str | None = None) -> int:
    """Cancel unfinished descendants of flow run ``root`` (and, with ``crash_root``, set ``root``
    itself Crashed if it is still open); stops at monotonic time ``end``. Returns the count."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterParentFlowRunId,
        TaskRunFilter,
        TaskRunFilterFlowRunId,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelled, Crashed

    open_ = (StateType.RUNNING, StateType.PENDING, StateType.SCHEDULED, StateType.PAUSED)
    cancelled = 0
    def late() -> bool:
        return end is not None and time.monotonic() >= end

    with get_client(sync_client=True, httpx_settings={"timeout": TIMEOUT_S}) as client:
        if crash_root is not None and client.read_flow_run(root).state_type in open_:
            client.set_flow_run_state(root, Crashed(message=crash_root), force=True)
            cancelled += 1
        runs = [root]
        frontier = [root]
        for _ in range(MAX_DEPTH):
            if not frontier or len(runs) >= MAX_RUNS or late():
                break
            kids = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=frontier)),
                limit=PAGE)
            frontier = [k.id for k in kids if k.id not in runs]
            runs += frontier
            for k in kids:
                if k.state_type in open_ and not late():
                    client.set_flow_run_state(k.id, Cancelled(message=MESSAGE), force=True)
                    cancelled += 1
        task_filter = TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=runs),
                                    state=TaskRunFilterState(type=TaskRunFilterStateType(any_=list(open_))))
        for _ in range(MAX_RUNS // PAGE):  # cancelled runs leave the filter: always read page one
            tasks = [] if late() else client.read_task_runs(task_run_filter=task_filter, limit=PAGE)
            for tr in tasks:
                if late():
                    break
                client.set_task_run_state(tr.id, Cancelled(message=MESSAGE), force=True)
                cancelled += 1
            if len(tasks) < PAGE:
                break
    return cancelled
