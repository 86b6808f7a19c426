"""Study work in chunks on the local thread pool or a Dask cluster — one implementation for both.

A study maps one *chunk function* over chunks of stay ids. The chunk function is a plain,
importable function (``f(warehouse, content_hash, stay_ids, ...) -> small result``) that reads
its own stays from the warehouse (read-only DuckDB connection) and returns a few numbers per
stay; record-level arrays never travel through the scheduler. :func:`map_phases` runs the chunks
on the command's thread pool (one Prefect task each) or as plain futures on a Dask cluster
(``--dask ADDRESS``), most expensive first; :func:`plan_chunks` cuts the stays into chunks by
their estimated cost (:func:`stay_units`, :data:`COST_MODEL`). Per-stay results do not depend on
the chunking: local and Dask are bit-identical. docs/DASK.md.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pipelines.runtime.chunk_memory import MEMORY_BUDGET_BYTES, STAY_BYTES_PER_HOUR2, chunk_memory, next_chunk  # noqa: F401 (re-exported)

#: the largest chunk, in seconds of estimated work (large enough that a Dask task's scheduling and a
#: local Prefect task's overhead stay small beside it)
TARGET_TASK_SECONDS = 3.0
#: the smallest cap (a chunk also opens a read-only connection)
MIN_TASK_SECONDS = 0.25
#: stays timed in the flow's own process to size the chunks
PILOT_STAYS = 8
#: at least this many chunks per worker slot when the work allows it
MIN_WAVES = 3
#: guided self-scheduling: a chunk's cap is the work still to be cut over ``GUIDED_WAVES × slots``
GUIDED_WAVES = 2

_LOG: list[dict] | None = None


@contextlib.contextmanager
def chunk_log():
    """Record every :func:`map_chunks` call (and the pilot's :func:`timed`) in this process while
    active. Yields a list that receives one dict per call: ``{"desc", "executor", "start", "end",
    "chunks"}`` (wall clock, :func:`time.time`); each chunk ``{"stay_ids", "predicted_s", "seconds",
    "worker", "start", "end", "received"}`` (and ``"submitted"``) in submission order. On Dask
    ``seconds``/``start``/``end`` are measured on the worker; on the local thread pool only
    ``submitted`` and ``received`` (completion seen by the flow) are known. Stay ids are kept in
    memory for the caller (write aggregates only)."""
    global _LOG
    prev, _LOG = _LOG, []
    try:
        yield _LOG
    finally:
        _LOG = prev


def lpt_makespan(seconds: Sequence[float], workers: int) -> float:
    """Makespan of ``seconds`` (task durations) on ``workers`` identical workers, longest first,
    each to the least-loaded worker (LPT; within 4/3 of the optimum, exact when one task is at
    least the rest over ``workers``)."""
    load = [0.0] * max(1, int(workers))
    for x in sorted((float(v) for v in seconds), reverse=True):
        i = load.index(min(load))
        load[i] += x
    return max(load)


def makespan_bound(seconds: Sequence[float], workers: int) -> float:
    """Lower bound on any schedule of these tasks: ``max(longest, total / workers)``."""
    xs = [float(v) for v in seconds]
    return max(max(xs, default=0.0), sum(xs) / max(1, int(workers)))


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


#: a stay's cost in units of one stay-hour², ``FIXED + n² + n³ / CUBIC`` for ``n`` hours: reading and
#: the per-stay bookkeeping (as much as the n² work of a 150-hour stay), the n × n kernel work of the
#: solve and the peers, and the kernel-leverage peer's Cholesky factor and triangular inverse (n³,
#: equal to the n² part at 35,000 h). Fitted per stay on this project's retention chunk function (one
#: BLAS thread); only their ratios matter, the pilot sets the scale.
COST_FIXED_UNITS = 150.0 ** 2
COST_CUBIC_HOURS = 35_000.0
COST_MODEL = f"{COST_FIXED_UNITS ** 0.5:.0f}² + n² + n³/{COST_CUBIC_HOURS:,.0f} for n hours"


def sizing_text() -> str:
    """How chunks are sized, in one line, from this module's constants (for help texts and result
    files: no number restated elsewhere)."""
    return (f"a pilot of {PILOT_STAYS} stays timed in the flow's process sets the seconds per cost unit (a "
            f"stay's units: {COST_MODEL}), then chunks of at most {TARGET_TASK_SECONDS:g} s of estimated "
            f"work, shrinking towards the end (at least {MIN_TASK_SECONDS:g} s; at least {MIN_WAVES} per worker "
            "slot when the work allows), the most expensive submitted first")


def stay_units(hours: Sequence[int]) -> list[float]:
    """Each stay's cost in units (:data:`COST_MODEL`): ``(m,)`` hours -> ``(m,)`` units."""
    out = []
    for h in hours:
        n = float(max(1, int(h)))
        out.append(COST_FIXED_UNITS + n * n + n ** 3 / COST_CUBIC_HOURS)
    return out


def stay_cost(hours: Sequence[int], seconds_per_unit: float) -> list[float]:
    """Estimated seconds of each stay: ``seconds_per_unit × stay_units(hours)``."""
    k = max(float(seconds_per_unit), 0.0)
    return [u * k for u in stay_units(hours)]


def seconds_per_unit(seconds: float, hours: Sequence[int]) -> float:
    """The pilot's measured ``seconds`` over its stays' cost units (``Σ stay_units(hours)``)."""
    return float(seconds) / max(1.0, sum(stay_units(hours)))


def plan_chunks(stay_ids: Sequence[int], hours: Sequence[int], seconds_per_hour: float, *, slots: int,
                target_s: float = TARGET_TASK_SECONDS, min_waves: int = MIN_WAVES,
                min_s: float = MIN_TASK_SECONDS, guided_waves: int = GUIDED_WAVES) -> list[list[int]]:
    """Cut ``stay_ids`` (in order) into contiguous chunks whose estimated seconds shrink towards the end.

    stay_ids, hours : (m,) the stays and their lengths (hours), aligned.
    seconds_per_hour : measured seconds per cost unit (:func:`seconds_per_unit`; a stay costs
        :func:`stay_units` units, :func:`stay_cost`).
    slots : chunks that run at once. A chunk is closed before it would pass its cap: the work not
        yet cut (stays that alone pass ``target_s`` left out: they are chunks of their own) over
        ``guided_waves × slots``, clipped to ``[min_s, target_s]`` and to at most the divisible
        work over ``min_waves × slots`` — big chunks first, small ones last, so that submitted
        longest first (:func:`map_chunks`) no worker idles through a long last chunk.
    Returns a list of non-empty lists covering ``stay_ids`` exactly once, order kept.

    The first :data:`PILOT_STAYS` stays are computed in the flow's own process through the same chunk
    function and timed; they set the machine's seconds per cost unit, and every stay gets an estimated
    cost (:func:`stay_units`: a fixed per-stay part, the n² kernel work and the n³ factorisations,
    with shape constants fitted once, :data:`COST_MODEL`). The remaining stays are cut, in order, into
    chunks whose cap shrinks with the work still to be cut (guided self-scheduling: about
    ``remaining / (GUIDED_WAVES × slots)``, between :data:`MIN_TASK_SECONDS` and
    :data:`TARGET_TASK_SECONDS`), so the last chunks are small; a stay above the cap is a chunk of its
    own.
    """
    ids = [int(s) for s in stay_ids]
    if len(ids) != len(hours):
        raise ValueError(f"{len(ids)} stay ids but {len(hours)} lengths")
    if not ids:
        return []
    slots = max(1, int(slots))
    cost = stay_cost(hours, seconds_per_hour)
    if sum(cost) <= 0:  # nothing measurable: equal chunks, min_waves per slot
        size = max(1, math.ceil(len(ids) / (slots * max(1, int(min_waves)))))
        return [ids[i:i + size] for i in range(0, len(ids), size)]
    small = [c if c <= target_s else 0.0 for c in cost]  # the divisible work
    left = sum(small)
    top = min(float(target_s), max(left / (slots * max(1, int(min_waves))), float(min_s)))
    out, cur, acc = [], [], 0.0
    cap = top
    for s, c, d in zip(ids, cost, small):
        if cur and acc + c > cap:
            out.append(cur)
            cur, acc = [], 0.0
        if not cur:  # a new chunk: its cap from the work still to be cut
            cap = min(top, max(float(min_s), left / (max(1, int(guided_waves)) * slots)))
        cur.append(s)
        acc += c
        left -= d
    if cur:
        out.append(cur)
    return out




def _worker_name() -> str:
    try:
        from distributed import get_worker

        return str(get_worker().name)
    except (ImportError, ValueError):  # not on a Dask worker
        return f"pid {os.getpid()}"


#: on a worker process: what :func:`_run_chunk` holds open between chunks (``hold`` of :func:`map_phases`)
_HELD: dict = {}


def _release_held() -> int:
    """On a worker: close what :func:`_run_chunk` held open; returns how many."""
    n = len(_HELD)
    while _HELD:
        _HELD.popitem()[1].close()
    return n


def _run_chunk(fn: Callable, args: tuple, hold: tuple | None = None) -> tuple[Any, dict]:
    """On a Dask worker: the chunk function under one BLAS thread, and when/where it ran. With
    ``hold = (opener, key)``, ``opener(key)`` is opened once per worker process and held until
    :func:`_release_held` (a read-only warehouse connection: later ones in the process share its
    database instance instead of opening the file again for every chunk)."""
    if hold is not None and hold[1] not in _HELD:
        _HELD[hold[1]] = hold[0](hold[1])
    start, t0, c0 = time.time(), time.perf_counter(), time.process_time()
    with one_blas_thread():
        out = fn(*args)
    return out, {"seconds": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "worker": _worker_name(),
                 "start": start, "end": time.time()}


def _stays_of(args: tuple) -> list:
    """The stay ids of a chunk's arguments (``f(warehouse, content_hash, stay_ids, ...)``)."""
    return list(args[2]) if len(args) > 2 and isinstance(args[2], (list, tuple)) else []


@dataclass
class Phase:
    """One kind of chunk in a :func:`map_phases` call: ``fn`` over ``arglists``, its Prefect task
    for the local thread pool (``local_task``), a description for the log, and each chunk's
    estimated seconds (``costs``, same scale across the call's phases; None: unknown, 0) and peak
    bytes (``memory``, :func:`chunk_memory`; None: 0)."""

    fn: Callable
    arglists: Sequence[tuple]
    local_task: Any = None
    desc: str = "chunks"
    costs: Sequence[float] | None = None
    memory: Sequence[float] | None = None


def map_chunks(fn: Callable, arglists: Sequence[tuple], *, local_task=None, desc: str = "chunks",
               progress: bool = True, costs: Sequence[float] | None = None, memory: Sequence[float] | None = None,
               memory_budget: float | None = None) -> list:
    """``[fn(*a) for a in arglists]``, run side by side; results in the order of ``arglists``
    (one :class:`Phase` of :func:`map_phases`: ``costs`` and ``memory`` as there)."""
    return map_phases([Phase(fn, arglists, local_task, desc, costs, memory)], progress=progress,
                      memory_budget=memory_budget)[0]


def map_phases(phases: Sequence[Phase], *, progress: bool = True, hold: tuple | None = None,
               memory_budget: float | None = None) -> list[list]:
    """Every phase's ``[fn(*a) for a in arglists]`` in one pool: independent kinds of work (a
    study's stay batches, its refit audit, its sensitivity chunks) fill each other's gaps instead
    of each waiting for the previous one's last chunk. Returns one result list per phase, each in
    the order of its ``arglists``.

    The chunks of all phases are submitted most expensive first (``costs``; a long chunk started
    last would leave the other workers idle at the end; equal costs keep phase, then chunk order).
    On Dask (:func:`dask_client`): plain futures of ``fn`` (importable by module path on the
    workers) under one BLAS thread each, one per worker thread at a time (the next is submitted as
    one completes: the list schedule, with no chunk queued behind a long one); submitted ones are
    cancelled if the flow is interrupted. Locally: ``local_task.submit(*a)`` (a Prefect task whose
    body calls ``fn``) on the flow's thread pool, as a list schedule too (one chunk per pool thread,
    the next in cost order as one completes) that also goes by memory: the chunks share this
    process, so one does not start beside running ones when their ``memory`` together would pass
    ``memory_budget`` (default :data:`MEMORY_BUDGET_BYTES`; :func:`next_chunk` picks what starts
    next, shorter chunks fill the free thread meanwhile; not applied on Dask, where each worker is
    its own process); or ``fn`` in this thread when a phase has no task. While :func:`chunk_log`
    is active each phase is recorded as one call
    (its ``start`` the pool's, its ``end`` its last chunk's completion).

    hold : ``(opener, key)`` (importable ``opener``): on Dask, each worker process opens
        ``opener(key)`` once, before its first chunk, and closes it when the pool is done, also
        after a failure (a read-only warehouse connection, otherwise opened once per chunk; closed
        before the command writes the warehouse).

    * **local** (the command's ``ThreadPoolTaskRunner``): each chunk is one Prefect task (the task
      wraps the same chunk function), so chunks show in the Prefect UI. The chunks share this
      process's memory, so they also go by their estimated peak (:func:`chunk_memory`: the longest
      stay's n x n matrices): a chunk does not start beside running ones when their estimates together
      would pass :data:`MEMORY_BUDGET_BYTES` (:func:`next_chunk`).
    * **Dask** (the flow's task runner is ``prefect_dask.DaskTaskRunner``): each chunk is a plain Dask
      future on the runner's client — no Prefect task engine runs on the workers for study chunks (a
      Prefect task on a worker pays API round trips per chunk), so the workers send no Prefect events
      or logs for them. The flow run, its logs and its result file live in the command's own process
      and API. Each chunk runs under one BLAS thread (:func:`one_blas_thread`, inside the task: worker
      processes are the parallelism).

    Chunks are submitted most expensive first (longest-processing-time order: the long stays start at
    once, the small chunks fill the end). Each stay is computed alone, chunks are contiguous and
    results come back in chunk order. :func:`chunk_log` records each chunk's stays, estimated and
    measured seconds, worker and start/end (``python -m pipelines.bench.dask_workers`` reads it);
    :func:`lpt_makespan` is the benchmark's schedule.
    """
    from tqdm.auto import tqdm

    jobs = [(p, i, tuple(a)) for p, ph in enumerate(phases) for i, a in enumerate(ph.arglists)]
    cost = [0.0 if phases[p].costs is None else float(phases[p].costs[i]) for p, i, _ in jobs]
    order = sorted(range(len(jobs)), key=lambda j: -cost[j])  # stable
    client = dask_client()
    t_start = time.time()
    recs = [{"desc": ph.desc, "executor": "dask" if client is not None else "threads", "start": t_start,
             "end": t_start, "chunks": []} for ph in phases]
    entry = {}  # job -> its log entry
    for j in order:
        p, i, a = jobs[j]
        entry[j] = {"stay_ids": _stays_of(a), "predicted_s": None if phases[p].costs is None else cost[j]}
        recs[p]["chunks"].append(entry[j])
    out: list[list] = [[None] * len(ph.arglists) for ph in phases]

    def done(j: int, value, meta: dict | None = None) -> None:
        p, i, _ = jobs[j]
        out[p][i] = value
        now = time.time()
        entry[j].update(meta or {}, received=now)
        recs[p]["end"] = max(recs[p]["end"], now)

    bar = tqdm(total=len(jobs), desc=", ".join(ph.desc for ph in phases), disable=not progress, file=sys.stderr,
               leave=False)
    if client is None and any(phases[p].local_task is None for p, _, _ in jobs):
        with one_blas_thread():
            for j in order:
                p, i, a = jobs[j]
                t0, p0 = time.time(), time.perf_counter()
                value = phases[p].fn(*a)
                done(j, value, {"seconds": time.perf_counter() - p0, "worker": "flow", "start": t0, "end": time.time()})
                bar.update(1)
    elif client is None:
        import queue

        mem = [0.0 if phases[p].memory is None else float(phases[p].memory[i]) for p, i, _ in jobs]
        cap = MEMORY_BUDGET_BYTES if memory_budget is None else float(memory_budget)
        slots, waiting, running, futures = local_slots(), list(order), {}, {}
        finished: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(len(order)):
            while waiting and len(running) < slots:
                j = next_chunk(waiting, mem, list(running.values()), cap)
                if j is None:
                    break
                waiting.remove(j)
                running[j] = mem[j]
                entry[j]["submitted"] = time.time()
                futures[j] = phases[jobs[j][0]].local_task.submit(*jobs[j][2])
                futures[j].add_done_callback(lambda _f, j=j: finished.put(j))
            j = finished.get()
            running.pop(j)
            done(j, None)
            bar.update(1)
        for j, f in futures.items():
            out[jobs[j][0]][jobs[j][1]] = f.result()
    else:
        from distributed import as_completed as dask_completed

        # at most one chunk in flight per worker thread, the next submitted as one completes: the
        # scheduler would otherwise queue a second chunk on each worker (worker-saturation), where
        # it can wait behind a long chunk while another worker idles
        where: dict = {}
        futures: list = []

        def submit_more(n_done: int) -> list:
            new = []
            while len(futures) < len(order) and len(futures) - n_done < worker_slots(client):
                j = order[len(futures)]
                p, _, a = jobs[j]
                f = client.submit(_run_chunk, phases[p].fn, a, hold, pure=False, priority=len(order) - len(futures))
                where[f.key] = j
                entry[j]["submitted"] = time.time()
                futures.append(f)
                new.append(f)
            return new

        try:
            pending = dask_completed(submit_more(0), loop=client.loop)
            for n_done, f in enumerate(pending, start=1):
                value, meta = f.result()
                done(where[f.key], value, meta)
                pending.update(submit_more(n_done))
                bar.update(1)
        except BaseException:
            client.cancel(futures)
            raise
        finally:
            if hold is not None:
                client.run(_release_held)
    bar.close()
    if _LOG is not None:
        _LOG.extend(recs)
    return out


@dataclass
class Clock:
    """What :func:`timed` measured: ``seconds`` once its block has ended."""

    seconds: float = 0.0


@contextlib.contextmanager
def timed(stay_ids: Sequence[int]):
    """Time the ``with`` block under one BLAS thread (the pilot's measurement): yields a
    :class:`Clock` whose ``seconds`` are set when the block ends (recorded as a one-chunk call
    ``desc="pilot"`` of ``stay_ids`` while :func:`chunk_log` is active). A context, not a call
    wrapper: the timed work runs in the caller's own frame."""
    clock = Clock()
    with one_blas_thread():
        start, t0 = time.time(), time.perf_counter()
        yield clock
        clock.seconds = secs = time.perf_counter() - t0
    if _LOG is not None:
        _LOG.append({"desc": "pilot", "executor": "flow", "start": start, "end": time.time(),
                     "chunks": [{"stay_ids": list(stay_ids), "predicted_s": None, "seconds": secs, "worker": "flow",
                                 "start": start, "end": start + secs, "received": start + secs}]})
