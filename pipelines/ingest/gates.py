"""Per-stay gate updates of the incremental ingest: a pure function of arrays
(:func:`update_stay`) and the worker processes that run it (:class:`Pool`).

:mod:`pipelines.ingest.batch` reads a batch of stays and writes it back; between the two, each
stay's ``StreamingGate`` is loaded from its blob (MAC already checked by the reader), the
re-computed hours are admitted or replaced, the reserve is evicted, and the new blob, token map
and counts come back. Nothing here touches DuckDB, so it runs unchanged in a worker.
"""
from __future__ import annotations

import os

import numpy as np

from pipelines.ingest import state as st

PARALLEL_MIN_STAYS = 400  # below this many affected stays a step runs in the calling process


def update_stay(C: float, sigma: float, blob: bytes | None, tok_old: np.ndarray, r0: int, z: np.ndarray,
                old_z: np.ndarray):
    """The stay's gate after re-computing hours ``[r0, r0 + len(z))``.

    ``tok_old`` (em,) live token of each emitted hour 0..em−1; ``z`` (m, 6) the recomputed
    keys; ``old_z`` (em − r0, 6) the stored keys of the re-opened hours. A re-opened hour whose
    key is unchanged keeps its token; a changed one is admitted anew and its old token forgotten
    (exact decrement) after the admissions (feasibility). Returns ``(blob, tokens (r0 + m,),
    hot (r0 + m,) bool, counts dict)``."""
    from sv_core import StreamingGate

    sg = StreamingGate(C, sigma) if blob is None else StreamingGate.from_state(st.decode_state(blob), verify=False)
    em, k = tok_old.size, tok_old.size - r0
    changed = ~np.all(old_z == z[:k], axis=1) if k else np.zeros(0, bool)
    tok = np.empty(r0 + z.shape[0], np.int64)
    tok[:em] = tok_old
    readm0 = int(sg.stats["readmissions"])
    admit = np.vstack([z[:k][changed], z[k:]])
    if admit.shape[0]:
        ids = sg.admit(admit)
        nchg = int(changed.sum())
        reo = tok[r0:em]
        reo[changed] = ids[:nchg]
        tok[em:] = ids[nchg:]
    for t in tok_old[r0:em][changed].tolist():
        sg.forget(int(t))
    cert = sg.evict_reserve()
    if not cert.get("issued"):
        cert = sg.certificate(exact=False)
    hot = np.isin(tok, sg.hot_ids)
    counts = {"n": int(sg.n), "n_hot": int(sg.n_hot), "n_cold": int(sg.n_cold), "gated": bool(sg.gated),
              "readmissions": int(sg.stats["readmissions"]), "readm_delta": int(sg.stats["readmissions"]) - readm0,
              "future_safe": bool(cert.get("future_safe", False)), "cert_gated": bool(cert.get("gated", sg.gated)),
              "new": int(z.shape[0] - k), "replaced": int(changed.sum()), "reopened": int(k)}
    return st.encode_state(sg.to_state()), tok, hot, counts


def runq_wait_s() -> float:
    """Seconds this process has spent runnable but waiting for a CPU (Linux
    ``/proc/self/schedstat``; 0.0 where it is not available): wall time lost to other
    processes on the machine, as opposed to CPU time or time blocked on I/O."""
    try:
        with open("/proc/self/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def update_chunk(C: float, sigma: float, items: list) -> tuple[list, float, float, float]:
    """:func:`update_stay` over a list of ``(blob, tok_old, r0, z, old_z)`` (a worker task);
    returns the results, the CPU seconds they took, the process's peak RSS (MB) and the
    seconds it waited for a CPU meanwhile (:func:`runq_wait_s`)."""
    import resource
    import time

    c0, q0 = time.process_time(), runq_wait_s()
    out = [update_stay(C, sigma, *it) for it in items]
    return (out, time.process_time() - c0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            runq_wait_s() - q0)


def _worker_init(parent: int) -> None:
    """One BLAS thread per worker process (the parent keeps its own setting), and a watch on the
    ingest process: a worker whose ingest process died (``kill -9``) exits within a second or
    two instead of waiting forever on its task queue (and keeping the forkserver alive)."""
    import threading
    import time

    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
    except Exception:  # noqa: BLE001 - threadpoolctl is optional
        pass

    def gone() -> bool:
        try:
            with open(f"/proc/{parent}/stat", "rb") as f:  # a killed parent not yet reaped is a zombie
                return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
        except FileNotFoundError:
            return True
        except OSError:  # no /proc: ask the kernel
            try:
                os.kill(parent, 0)
                return False
            except ProcessLookupError:
                return True
            except PermissionError:
                return False

    def watch() -> None:
        while not gone():
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="forgetful-ingest-parent-watch", daemon=True).start()


class Pool:
    """Worker processes for :func:`update_chunk`; ``jobs`` ≤ 1 runs inline.

    Workers come from a *forkserver* (a clean process that never held a DuckDB connection or its
    threads). Like every ``multiprocessing`` start method but fork, a worker imports the main
    module: a script calling :func:`pipelines.ingest.ingest` needs the usual
    ``if __name__ == "__main__":`` guard (``forgetful`` and ``python -m`` entry points have it).
    If the pool breaks anyway (a worker died), the batch is computed inline and so is the rest
    of the run, with a one-line warning: the results are the same either way."""

    def __init__(self, jobs: int):
        self.jobs = max(1, int(jobs))
        self._ex = None
        self.worker_cpu_s = 0.0  # CPU seconds of the worker processes (not children of this one)
        self.worker_peak_rss_mb = 0.0
        self.worker_runq_s = 0.0  # seconds the workers waited for a CPU (other load)

    def _inline(self, C: float, sigma: float, items: list):
        res = update_chunk(C, sigma, items)[0]
        return lambda: res

    def _broken(self, exc) -> None:
        import sys

        print(f"[forgetful] ingest worker processes failed ({type(exc).__name__}); continuing in this process",
              file=sys.stderr)
        self.close()
        self.jobs = 1

    def submit(self, C: float, sigma: float, items: list, parallel: bool = True):
        """Start the gate updates of a batch; returns a function that gives the results."""
        from concurrent.futures.process import BrokenProcessPool

        if self.jobs == 1 or not parallel or len(items) < 2:
            return self._inline(C, sigma, items)
        try:
            if self._ex is None:
                import concurrent.futures as cf
                import multiprocessing as mp

                ctx = mp.get_context("forkserver")
                ctx.set_forkserver_preload(["numpy", "sv_core", "pipelines.ingest.gates"])
                self._ex = cf.ProcessPoolExecutor(max_workers=self.jobs, mp_context=ctx, initializer=_worker_init,
                                                   initargs=(os.getpid(),))
            n = max(1, -(-len(items) // (4 * self.jobs)))
            futs = [self._ex.submit(update_chunk, C, sigma, items[i:i + n]) for i in range(0, len(items), n)]
        except BrokenProcessPool as exc:
            self._broken(exc)
            return self._inline(C, sigma, items)

        def get():
            try:
                done = [f.result() for f in futs]
            except BrokenProcessPool as exc:
                self._broken(exc)
                return self._inline(C, sigma, items)()
            self.worker_cpu_s += sum(d[1] for d in done)
            self.worker_peak_rss_mb = max([self.worker_peak_rss_mb] + [d[2] for d in done])
            self.worker_runq_s += sum(d[3] for d in done)
            return [r for d in done for r in d[0]]

        return get

    def close(self) -> None:
        if self._ex is not None:
            self._ex.shutdown(wait=True, cancel_futures=True)
            self._ex = None


def default_jobs() -> int:
    """Worker processes: the CPUs this process may use, at most 8."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    return max(1, min(8, n))
