"""Exact completion of the gate's maintained operations: the KKT guard, the warm SMO tightening
and the exact fallback (fresh independent refit, maintained state rebuilt from it).

:class:`ExactCompletion` (one per gate, part of :class:`sv_core._gate_state.GateState`) runs every
maintained C&P operation through :meth:`ExactCompletion.guarded`, which decides when the path's
result is accepted, and counts what it had to do (``fallbacks``, ``log``, ``tightenings``).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from sv_core._blas import single_thread
from sv_core._state import ERROR, MARGIN, RESERVE, SNAP_TOL
from sv_core.errors import PathError, RefitError
from sv_core.refit import refit, smo_polish

if TYPE_CHECKING:
    from sv_core.solver import MaintainedSVDD

#: probes are jittered with Gaussian noise of this scale in ``verify`` (SPEC §3 deletion audit)
JITTER_SCALE = 0.1
#: largest KKT violation (read from the maintained gradient) accepted at the end of an operation;
#: above it the operation completes by the exact fallback (fresh refit of the current keys)
KKT_GUARD = 1e-9
#: above this residual (but within the guard) the state is tightened by a warm SMO polish
TIGHTEN_AT = 1e-12
#: ``verify=True`` accepts a deletion when the score deviation from the independent refit is at
#: most this and the KKT residual at most ``VERIFY_KKT``; otherwise the exact fallback is taken
VERIFY_SCORE_TOL = 1e-6
VERIFY_KKT = 1e-9


def _repeat_candidates(X: np.ndarray) -> np.ndarray:
    """Rows that may repeat another row (increasing): equal rows have equal hashes
    ``sum_k X[:, k] w_k`` (the same elementwise arithmetic), so rows with a unique hash are
    excluded in O(n log n) before the exact row comparison."""
    n, d = X.shape
    if n < 2:
        return np.zeros(0, dtype=np.int64)
    h = X[:, 0].copy()
    for k in range(1, d):
        h += X[:, k] * (1.0 + 0.6180339887498949 * k)
    order = np.argsort(h, kind="stable")
    hs = h[order]
    same = hs[1:] == hs[:-1]
    if not same.any():
        return np.zeros(0, dtype=np.int64)
    keep = np.zeros(n, dtype=bool)
    keep[1:] |= same
    keep[:-1] |= same
    return np.sort(order[keep])


def consolidate_repeats(X: np.ndarray, a: np.ndarray, status: np.ndarray, C: float):
    """Bit-identical keys have identical kernel columns, so any split of their mass is optimal;
    gather it (members at C, one remainder, the rest 0) so at most one of them is a margin key
    and the bordered system stays non-singular. Gradients and scores are unchanged. The count at
    C is read with ``SNAP_TOL`` (a group whose members all sit at C sums to k·C only up to
    rounding: it stays k members at C, with no margin member holding a rounding residue)."""
    cand = _repeat_candidates(X)
    if cand.size == 0:
        return a, status
    _, inv, counts = np.unique(X[cand], axis=0, return_inverse=True, return_counts=True)
    if counts.max(initial=1) < 2:
        return a, status
    a = a.copy()
    status = status.copy()
    inv = inv.ravel()
    for grp in np.flatnonzero(counts > 1):
        mem = cand[inv == grp]
        m = float(a[mem].sum())
        full = min(mem.size, int(np.floor(m / C + SNAP_TOL)))
        rem = m - full * C
        if rem <= SNAP_TOL * C:
            rem = 0.0
        for r, k in enumerate(mem):
            if r < full:
                a[k], status[k] = C, ERROR
            elif r == full and rem > 0.0:
                a[k], status[k] = rem, MARGIN
            else:
                a[k], status[k] = 0.0, RESERVE
    return a, status



class ExactCompletion:
    """The guard around a gate's maintained operations and its record.

    Attributes
    ----------
    fallbacks : operations completed by the exact fallback (fresh refit, maintained state rebuilt)
    log : one ``{"op", "reason"}`` dict per fallback taken, in order
    tightenings : operations whose end state was tightened by a warm SMO polish (``tighten``)
    """

    def __init__(self) -> None:
        self.fallbacks = 0
        self.log: list[dict] = []
        self.tightenings = 0

    def mark(self) -> tuple[int, int, int]:
        """What :meth:`reset` needs to undo the record of operations that are rolled back."""
        return self.fallbacks, len(self.log), self.tightenings

    def reset(self, mark: tuple[int, int, int]) -> None:
        self.fallbacks, n_log, self.tightenings = mark
        del self.log[n_log:]

    def fallback(self, core: MaintainedSVDD, op: str, reason: str) -> None:
        """Complete an operation exactly when the maintained path cannot: solve the current live
        keys afresh with the independent refit oracle and rebuild the maintained state from it
        (margin set, bordered inverse and gradient recomputed). Counted in ``fallbacks``."""
        slots = core.live()
        try:
            a, rho, info = refit(core.X[slots], C=core.C, sigma=core.sigma, return_info=True)
        except RefitError as exc:
            raise PathError(f"{op}: maintained path failed ({reason}) and the exact fallback "
                            f"failed too ({exc})") from exc
        a, status = consolidate_repeats(core.X[slots], a, info["status"], core.C)
        core.load_solution(slots, a, status, rho)
        v = core.maintained_violation()
        if not v <= VERIFY_KKT:
            raise PathError(f"{op}: exact fallback left KKT violation {v:.3g} ({reason})")
        self.fallbacks += 1
        self.log.append({"op": op, "reason": reason})

    def guarded(self, core: MaintainedSVDD, op: str, step: Callable[[], int],
                on_fail: Callable[[], None] | None = None, snap: dict | None = None) -> tuple[int, str | None]:
        """Run ``step()`` (a maintained-path operation returning its event count) and check the
        maintained KKT residual; on a path error (state restored to before ``step``, then
        ``on_fail()`` applies the structural change) or a tripped guard, complete exactly by
        :meth:`fallback`. Returns (events, fallback reason or None)."""
        core.materialise()
        if snap is None:
            snap = core.snapshot()
        try:
            with single_thread(core.n_slots):
                events = step()
                core.end_operation()
        except PathError as exc:
            core.restore(snap)
            if on_fail is not None:
                on_fail()
            reason = f"{type(exc).__name__}: {exc}"
            self.fallback(core, op, reason)
            return 0, reason
        v = core.guard_residual()
        if not v <= TIGHTEN_AT:
            # the residual guard: recompute the gradient exactly before judging
            core.recompute_g()
            v = core.guard_residual()
            if v > TIGHTEN_AT and np.isfinite(v):
                v = self.tighten(core, v)
            if not v <= KKT_GUARD:
                reason = f"KKT guard: maintained-path residual {v:.3g} > {KKT_GUARD:g}"
                self.fallback(core, op, reason)
                return events, reason
        return events, None

    def tighten(self, core: MaintainedSVDD, v: float) -> float:
        """Ill-conditioned (near-duplicate) margin systems leave KKT residuals of 1e-11..1e-9
        that the score at off-data probes amplifies; a warm pairwise SMO polish of the current
        coefficients drives the KKT gap to rounding level. Kept only if it lowers the residual."""
        slots = core.live()
        snap = core.snapshot()
        K = core.K[np.ix_(slots, slots)]
        a2, rho2, st2 = smo_polish(K, core.C, core.alpha[slots])
        a2, st2 = consolidate_repeats(core.X[slots], a2, st2, core.C)
        try:
            core.load_solution(slots, a2, st2, rho2)
            v2 = core.guard_residual()
        except PathError:
            v2 = float("inf")
        if v2 < v:
            self.tightenings += 1
            return v2
        core.restore(snap)
        return v
