"""Memory-aware list schedule of pipelines.runtime.scaleout.map_chunks on the local thread pool: long stays'
chunks never run side by side when their estimated n x n memory together passes the budget,
smaller chunks fill the other thread meanwhile, results come back in order."""
from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest

from pipelines.runtime import scaleout

GB = 2**30


def test_chunk_memory_is_the_longest_stays_n_squared():
    assert scaleout.chunk_memory([10, 7670, 300]) == pytest.approx(scaleout.STAY_BYTES_PER_HOUR2 * 7670**2)
    assert scaleout.chunk_memory([]) == 0.0
    # the two longest stays of full MIMIC-IV size do not fit together, either fits with a short one
    big, second, short = (scaleout.chunk_memory([h]) for h in (7670, 6627, 500))
    assert big + second > scaleout.MEMORY_BUDGET_BYTES >= big + short


def test_next_chunk_takes_the_first_that_fits_and_lets_a_large_one_run_alone():
    mem = [1.1 * GB, 0.9 * GB, 0.05 * GB, 0.05 * GB]
    assert scaleout.next_chunk([0, 1, 2, 3], mem, [], 1.25 * GB) == 0  # nothing runs: the first, whatever its size
    assert scaleout.next_chunk([1, 2, 3], mem, [1.1 * GB], 1.25 * GB) == 2  # the 0.9 GB one waits, a small one fills
    assert scaleout.next_chunk([1], mem, [1.1 * GB], 1.25 * GB) is None  # wait for a chunk to finish
    assert scaleout.next_chunk([1, 2], mem, [1.1 * GB], float("inf")) == 1  # no budget: cost order only
    assert scaleout.next_chunk([0], [3 * GB], [], 1.25 * GB) == 0  # over the budget alone: still runs, alone


class _Task:
    """A stand-in for a Prefect task on a 2-thread pool (``submit`` -> a future with
    ``add_done_callback`` and ``result``, as PrefectConcurrentFuture)."""

    def __init__(self, fn, pool):
        self.fn, self.pool = fn, pool

    def submit(self, *args):
        fut = self.pool.submit(self.fn, *args)

        class F:
            def add_done_callback(self, cb):
                fut.add_done_callback(lambda _: cb(self))

            def result(self):
                return fut.result()
        return F()


def _run(memory, budget, costs):
    lock, running, seen = threading.Lock(), {}, []

    def fn(w, h, stay_ids, mem):
        with lock:
            running[tuple(stay_ids)] = mem
            seen.append(dict(running))
        time.sleep(0.15)
        with lock:
            running.pop(tuple(stay_ids))
        return sum(stay_ids)

    args = [("w", "h", [i], m) for i, m in enumerate(memory)]
    with concurrent.futures.ThreadPoolExecutor(2) as pool, scaleout.chunk_log() as log:
        out = scaleout.map_chunks(fn, args, local_task=_Task(fn, pool), progress=False, costs=costs,
                                  memory=memory, memory_budget=budget)
    return out, seen, log[0]["chunks"]


def test_long_chunks_never_overlap_past_the_budget_and_short_ones_fill_in():
    memory = [1.1 * GB, 0.9 * GB, 0.8 * GB] + [0.01 * GB] * 6
    costs = [9.0, 8.0, 7.0] + [1.0] * 6
    out, seen, chunks = _run(memory, 1.25 * GB, costs)
    assert out == list(range(9))  # results in argument order
    assert max(sum(r.values()) for r in seen) <= 1.25 * GB  # never two long chunks at once
    assert max(len(r) for r in seen) == 2  # but both threads were used: short chunks beside the long ones
    assert all(c["submitted"] <= c["received"] for c in chunks)
    # without the budget (cost order only) the two longest run side by side: the check above can fail
    out, seen, _ = _run(memory, float("inf"), costs)
    assert out == list(range(9)) and max(sum(r.values()) for r in seen) > 1.25 * GB
