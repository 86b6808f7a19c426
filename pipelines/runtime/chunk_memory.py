"""How much memory a chunk of stays needs, and which chunk may start beside running ones
(:func:`pipelines.runtime.scaleout.map_phases` on the local thread pool, where the chunks share one
process: issue 20's 2 GB bound at full MIMIC-IV size is set by the longest stays' n x n
matrices, not by the number of stays)."""
from __future__ import annotations

from collections.abc import Sequence

#: the most that chunks running side by side in this process may add up to, in estimated bytes
#: (:func:`chunk_memory`): at full MIMIC-IV size the two longest stays (7,670 and 6,627 hours)
#: would otherwise run together, their n x n matrices at once past issue 20's 2 GB bound
MEMORY_BUDGET_BYTES = 1.25 * 2**30
#: a stay's peak working memory per hour², in bytes: the n x n kernel matrix of the solve and the
#: peers' n x n buffers (the longest stay's held-out chunk's measured peak over its hours², rounded up)
STAY_BYTES_PER_HOUR2 = 20.0


def chunk_memory(hours: Sequence[int]) -> float:
    """Estimated peak bytes of a chunk whose stays have ``hours`` (one stay at a time: its longest)."""
    return STAY_BYTES_PER_HOUR2 * float(max((int(h) for h in hours), default=0)) ** 2


def next_chunk(waiting: Sequence[int], memory: Sequence[float], running: Sequence[float],
               budget: float) -> int | None:
    """The chunk to start next: the first of ``waiting`` (positions in submission order) whose
    ``memory`` fits beside the ``running`` chunks' estimates within ``budget``, or any chunk when
    nothing runs (one over the budget then runs with nothing else beside it); None: wait for one
    to finish."""
    used = sum(running)
    for k in waiting:
        if not running or used + memory[k] <= budget:
            return k
    return None
