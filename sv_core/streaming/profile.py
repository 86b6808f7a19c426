"""Where a :class:`sv_core.StreamingGate`'s time goes: exclusive time per part of an operation.

:class:`CostProfile` wraps, on one gate *instance* (the class is untouched; ``detach`` restores
it), the internal steps of admission, reserve eviction and deletion, and charges each moment of
``clock`` time (default: process CPU time, robust on a shared machine; ``time.perf_counter`` for
wall time) to the innermost running part:

* ``hot_solve`` -- the hot :class:`~sv_core.Gate`'s C&P increments, decrements and reserve
  eviction (its KKT guard included);
* ``exact_g`` -- exact cold gradients ``g_j`` against the hot support (kernel rows, through the
  kernel cache): the admission check of an arriving key and the re-checks of screened keys;
* ``screen_bound`` -- the per-operation drift bound (:func:`sv_core.streaming.screen.step_bound`)
  and the hot view it reads;
* ``screen_scan`` -- the cold-tier scan for keys whose bound fell below the margin;
* ``undo_copy`` -- the restorable copy of the hot state taken before its first change;
* ``other`` -- everything else inside the operation (id maps, cold-store appends, journal).

Used by ``python -m sv_core.bench.stream --breakdown``; the shares explain how the per-token cost
grows with the stream (e.g. ``hot_solve`` with the margin set, ``exact_g`` with the re-checked
keys times the support size).
"""
from __future__ import annotations

import functools
import math
import time

import numpy as np

PARTS = ("hot_solve", "exact_g", "screen_bound", "screen_scan", "undo_copy", "other")


class CostProfile:
    """Exclusive ``clock`` time per part (seconds), accumulated while attached to ``sg``."""

    def __init__(self, sg, clock=time.process_time):
        self.sg = sg
        self.clock = clock
        self.totals = {p: 0.0 for p in PARTS}
        self._stack: list[str] = []
        self._mark = 0.0
        self._hot = None
        self._orig: dict[tuple[object, str], object] = {}
        self.attach()

    def _charge(self, now: float) -> None:
        if self._stack:
            self.totals[self._stack[-1]] += now - self._mark
        self._mark = now

    def _wrap(self, obj, name: str, part: str) -> None:
        fn = getattr(obj, name)
        self._orig[(obj, name)] = fn

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            self._charge(self.clock())
            self._stack.append(part)
            try:
                return fn(*args, **kwargs)
            finally:
                self._charge(self.clock())
                self._stack.pop()
        setattr(obj, name, timed)

    def attach(self) -> None:
        sg = self.sg
        for name in ("admit", "evict_reserve", "forget"):
            self._wrap(sg, name, "other")
        self._wrap(sg, "_cold_g", "exact_g")
        self._wrap(sg, "_account", "screen_bound")
        self._wrap(sg, "_hot_change", "undo_copy")
        self._wrap(sg._cold, "candidates", "screen_scan")
        self._wrap_hot()

    def _wrap_hot(self) -> None:
        hot = self.sg._hot
        if hot is self._hot:
            return
        self._hot = hot
        for name in ("admit", "forget", "evict_reserve"):
            self._wrap(hot, name, "hot_solve")

    def detach(self) -> None:
        for (obj, name), _ in self._orig.items():
            if name in vars(obj):
                delattr(obj, name)
        self._orig.clear()

    def refresh(self) -> None:
        """Call between operations: the gate may have replaced its hot gate (a rollback)."""
        self._wrap_hot()

    def snapshot(self) -> dict[str, float]:
        return dict(self.totals)


def parts_per_token(totals: dict[str, float], tokens: int) -> dict[str, float]:
    """Milliseconds per token of each part over ``tokens`` tokens."""
    return {p: 1e3 * totals[p] / max(tokens, 1) for p in PARTS}


def hot_shape(sg) -> dict[str, int]:
    """Sizes that set the cost of one operation: hot tier, support (alpha > 0), margin set
    (0 < alpha < C) and the lower bound ceil(1/C) on the support of any fixed-C solution."""
    hot = sg.hot_gate
    a = hot.alpha if hot.gated else np.zeros(0)
    n_sup = int((a > 0.0).sum())
    return {"n_support": n_sup, "n_margin": n_sup - int((a == sg.C).sum()),
            "support_lower_bound": int(math.ceil(1.0 / sg.C - 1e-12))}
