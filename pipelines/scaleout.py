"""Study work in chunks on the local thread pool or a Dask cluster — one implementation for both.

A study maps one *chunk function* over chunks of stay ids. The chunk function is a plain,
importable function (``f(warehouse, content_hash, stay_ids, ...) -> small result``) that reads
its own stays from the warehouse (read-only DuckDB connection) and returns a few numbers per
stay; record-level arrays never travel through the scheduler. :func:`map_chunks` runs it:

* **local** (the command's ``ThreadPoolTaskRunner``): each chunk is one Prefect task (the task
  wraps the same chunk function), so chunks show in the Prefect UI;
* **Dask** (``--dask ADDRESS``; the flow's task runner is ``prefect_dask.DaskTaskRunner``): each
  chunk is a plain Dask future on the runner's client — no Prefect task engine runs on the
  workers for study chunks (measured: a Prefect task on a Dask worker costs 0.5–1.0 s of
  API round trips, which is what made one-stay tasks slower than local), so the workers send
  no Prefect events or logs for them. The flow run, its logs and its result file live in the
  command's own process and API. Each chunk runs under one BLAS thread
  (:func:`one_blas_thread`, inside the task: worker processes are the parallelism).

**Chunk sizing** (:func:`plan_chunks`): the first :data:`PILOT_STAYS` stays are computed in the
flow's own process through the same chunk function and timed; their seconds per stay-hour give
every stay an estimated cost (``hours × seconds per hour``), and the remaining stays are cut, in
order, into chunks of about :data:`TARGET_TASK_SECONDS` of work — fewer when that would leave
fewer than :data:`MIN_WAVES` chunks per worker slot (so no worker idles through a long last
chunk). Per-stay results do not depend on the chunking (each stay is computed alone, results
come back in submission order), so the local and the Dask run are bit-identical.
"""
from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

#: seconds of estimated work per chunk (a Dask task costs a few ms of scheduling; a local Prefect task ~20-50 ms)
TARGET_TASK_SECONDS = 3.0
#: stays timed in the flow's own process to size the chunks
PILOT_STAYS = 8
#: at least this many chunks per worker slot (load balance of the last wave)
MIN_WAVES = 3


@contextlib.contextmanager
def one_blas_thread():
    """BLAS limited to one thread: per-stay matrices are small and the chunks already run side by
    side (a multi-threaded BLAS on a small solve costs ~10-20× the CPU). No-op without threadpoolctl."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # optional: no limit without it
        yield
        return
    # scipy ships its own OpenBLAS, loaded on first use of scipy.linalg; a limit only covers the
    # libraries loaded when it is entered (and restores them on exit), so load it first
    import scipy.linalg  # noqa: F401
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def dask_client():
    """The Dask client of the running flow's ``DaskTaskRunner``, or None (local thread pool, no flow)."""
    if "prefect_dask" not in sys.modules:
        return None
    from prefect.context import FlowRunContext
    from prefect_dask import DaskTaskRunner

    ctx = FlowRunContext.get()
    tr = getattr(ctx, "task_runner", None) if ctx is not None else None
    return tr.client if isinstance(tr, DaskTaskRunner) else None


def worker_slots(client=None, local_workers: int = 2) -> int:
    """Chunks that can run at once: the cluster's worker threads, or the local pool size."""
    if client is None:
        return max(1, int(local_workers))
    workers = client.scheduler_info().get("workers", {})
    return max(1, sum(int(w.get("nthreads", 1)) for w in workers.values()))


def local_slots() -> int:
    """The running flow's thread-pool size (2 outside a flow or when unknown)."""
    try:
        from prefect.context import FlowRunContext

        ctx = FlowRunContext.get()
        return max(1, int(getattr(ctx.task_runner, "_max_workers", 2) or 2)) if ctx is not None else 2
    except Exception:  # noqa: BLE001 - no context
        return 2


#: a stay's estimated cost grows as hours ** COST_EXPONENT (the solve and the kernel peers work on
#: the stay's n × n kernel matrix: a 100-hour stay is cheap, an 8,000-hour one costs minutes)
COST_EXPONENT = 2


def stay_cost(hours: Sequence[int], seconds_per_unit: float) -> list[float]:
    """Estimated seconds of each stay: ``seconds_per_unit × hours ** COST_EXPONENT``."""
    return [float(max(1, int(h))) ** COST_EXPONENT * max(float(seconds_per_unit), 0.0) for h in hours]


def seconds_per_unit(seconds: float, hours: Sequence[int]) -> float:
    """The pilot's measured ``seconds`` over its stays' cost units (``Σ hours ** COST_EXPONENT``)."""
    return float(seconds) / max(1.0, sum(float(max(1, int(h))) ** COST_EXPONENT for h in hours))


def plan_chunks(stay_ids: Sequence[int], hours: Sequence[int], seconds_per_hour: float, *, slots: int,
                target_s: float = TARGET_TASK_SECONDS, min_waves: int = MIN_WAVES) -> list[list[int]]:
    """Cut ``stay_ids`` (in order) into chunks of about ``target_s`` estimated seconds each.

    stay_ids, hours : (m,) the stays and their lengths (hours), aligned.
    seconds_per_hour : measured seconds per cost unit (:func:`seconds_per_unit`; a stay costs
        ``hours ** COST_EXPONENT`` units, :func:`stay_cost`).
    slots : chunks that run at once; the cap per chunk is lowered so that there are at least
        ``min_waves × slots`` chunks when the work allows it.
    Returns a list of non-empty lists covering ``stay_ids`` exactly once, order kept.
    """
    ids = [int(s) for s in stay_ids]
    if len(ids) != len(hours):
        raise ValueError(f"{len(ids)} stay ids but {len(hours)} lengths")
    if not ids:
        return []
    cost = stay_cost(hours, seconds_per_hour)
    total = sum(cost)
    cap = min(float(target_s), total / max(1, int(slots) * int(min_waves)))
    if cap <= 0:  # nothing measurable: equal chunks, min_waves per slot
        size = max(1, math.ceil(len(ids) / max(1, int(slots) * int(min_waves))))
        return [ids[i:i + size] for i in range(0, len(ids), size)]
    out, cur, acc = [], [], 0.0
    for s, c in zip(ids, cost):
        if cur and acc + c > cap:
            out.append(cur)
            cur, acc = [], 0.0
        cur.append(s)
        acc += c
    if cur:
        out.append(cur)
    return out


def _run_chunk(fn: Callable, args: tuple) -> Any:
    """On a Dask worker: the chunk function under one BLAS thread."""
    with one_blas_thread():
        return fn(*args)


def map_chunks(fn: Callable, arglists: Sequence[tuple], *, local_task=None, desc: str = "chunks",
               progress: bool = True, costs: Sequence[float] | None = None) -> list:
    """``[fn(*a) for a in arglists]``, run side by side; results in the order of ``arglists``.

    costs : estimated seconds of each chunk; the most expensive are submitted first (a long
        chunk started last would leave the other workers idle at the end), the results are put
        back in ``arglists`` order.

    On Dask (:func:`dask_client`): plain futures of ``fn`` (importable by module path on the
    workers) under one BLAS thread each; pending ones are cancelled if the flow is interrupted.
    Locally: ``local_task.submit(*a)`` (a Prefect task whose body calls ``fn``) on the flow's
    thread pool, or ``fn`` in this thread when no task is given."""
    arglists = [tuple(a) for a in arglists]
    order = list(range(len(arglists)))
    if costs is not None:
        order.sort(key=lambda i: -float(costs[i]))  # stable: equal costs keep their order

    def unpermute(results: list) -> list:
        out: list = [None] * len(results)
        for i, r in zip(order, results):
            out[i] = r
        return out

    client = dask_client()
    if client is None:
        if local_task is None:
            with one_blas_thread():
                return [fn(*a) for a in arglists]
        from .futures import gather

        return unpermute(gather([local_task.submit(*arglists[i]) for i in order], desc, progress))
    from tqdm.auto import tqdm

    futures = [client.submit(_run_chunk, fn, arglists[i], pure=False, priority=len(order) - k)
               for k, i in enumerate(order)]
    try:
        bar = tqdm(total=len(futures), desc=desc, disable=not progress, file=sys.stderr, leave=False)
        out = []
        for f in futures:
            out.append(f.result())
            bar.update(1)
        bar.close()
        return unpermute(out)
    except BaseException:
        client.cancel(futures)
        raise


def timed(fn: Callable, *args) -> tuple[Any, float]:
    """``(fn(*args), seconds)`` under one BLAS thread (the pilot's measurement)."""
    with one_blas_thread():
        t0 = time.perf_counter()
        out = fn(*args)
        return out, time.perf_counter() - t0


# ------------------------------------------------------------------------------ worker hygiene
async def _drain_prefect_services() -> int:
    """On a Dask worker: flush and stop Prefect's event and API-log services, if Prefect ran
    there. Their instances are process-wide and keep the API URL they were created with (the
    events worker is keyed on its client type only), so a long-lived worker would send every
    later command's task events to the first command's API — a private server that has exited.
    Drained while the command's API is still up, the next command's tasks start fresh ones
    pointed at its own API. Returns the number of services drained."""
    import asyncio
    import logging

    if "prefect" not in sys.modules:
        return 0
    n = 0
    # "Still processing items: N remaining" while draining is progress, not news (as in the command)
    for name in ("EventsWorker", "APILogWorker"):
        logging.getLogger(name).setLevel(logging.ERROR)
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for svc in (EventsWorker, APILogWorker):
        n += len(svc._instances)  # noqa: SLF001 - count only, for the caller's message
        waiter = svc.drain_all(timeout=15)
        if asyncio.iscoroutine(waiter) or isinstance(waiter, asyncio.Future):
            await waiter
    return n


def prefect_services() -> dict:
    """On a Dask worker: Prefect's live event and API-log services in this process — ``{"events":
    [API URL of each events client], "logs": count}`` (``{}`` when Prefect was never imported).
    After :func:`drain_workers` both are empty; a live one is what would carry the next command's
    task events to a finished command's API."""
    if "prefect" not in sys.modules:
        return {}
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    live = [i for i in EventsWorker._instances.values() if not i._stopped]  # noqa: SLF001
    return {"events": [str(getattr(getattr(i, "_client", None), "_api_url", None)) for i in live],
            "logs": sum(1 for i in APILogWorker._instances.values() if not i._stopped)}  # noqa: SLF001


def drain_workers(address: str) -> dict:
    """Run :func:`_drain_prefect_services` on every worker of the scheduler at ``address``
    (``{worker: services drained}``); called by :func:`pipelines.runner.run_cli_flow` when a
    command used ``--dask``, before the command (and its private API) exits."""
    from distributed import Client

    with Client(address, timeout=30, set_as_default=False) as c:
        return c.run(_drain_prefect_services)
