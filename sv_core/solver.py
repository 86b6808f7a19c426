"""The maintained fp64 Cauwenberghs-Poggio (C&P) solver of the fixed-C SVDD dual.

Problem (SPEC §1)::

    min_a  a^T K a - diag(K)^T a    s.t.  sum(a) = 1,  0 <= a_i <= C

State: keys, coefficients ``alpha``, offset ``rho``, gradient ``g_i = rho - K_ii + 2 (K a)_i``,
the partition margin ``S`` (0 < a < C, g = 0), error ``E`` (a = C, g <= 0), reserve ``R``
(a = 0, g >= 0), and ``Rinv = M^{-1}`` for the bordered matrix ``M = [[0, 1^T], [1, 2 K_SS]]``,
kept by rank-one border updates (a key enters S) and Schur downdates (a key leaves S), with a
full refactorisation every ``refactor_every`` updates and whenever a conditioning guard trips.

One event loop, :meth:`MaintainedSVDD._sweep`, moves a single coefficient ``alpha_c`` while all
other keys keep their KKT conditions. It serves:

* admission ("settle"): a new key enters with ``alpha_c = 0``; if ``g_c < 0`` it is increased
  until ``g_c`` reaches 0 (margin) or ``alpha_c`` reaches C (error);
* initialisation: the first keys start *pending* at ``alpha = 1/n`` (feasible) and are settled one
  by one, moving ``alpha_c`` up or down until its own KKT condition holds;
* deletion ("remove"): ``alpha_c`` is driven to 0 whatever ``g_c`` does.

When the margin set is empty no coefficient can move without breaking ``sum(a) = 1``; the loop
then sweeps ``rho`` instead (every ``g`` moves at rate 1) until an error or reserve key reaches
``g = 0`` and joins the margin set. This is what lets a decrement complete when S empties
mid-path (the seed's reference raised there).

The gradient is updated incrementally along the path and by every margin re-solve
(``O(|S| n)``); it is recomputed exactly every ``G_REFRESH`` operations, after any degenerate
handling, and whenever the gate's KKT guard reads a residual above ``1e-12``.

Layout: this module holds storage, the event loop and the operations; the bordered-inverse
algebra (``Rinv`` updates, margin re-solves, polish) is :mod:`sv_core._bordered`; the handling of
(near-)duplicate keys (twin hand-over, near-twin swap, degenerate pivot, state rebuild for the
exact fallback) is :mod:`sv_core._degenerate`.

Slots are internal positions; the public :class:`sv_core.Gate` maps stable token ids to slots.
"""
from __future__ import annotations

import numpy as np

from ._bordered import (  # noqa: F401  (re-exported: the solver's public constants)
    _NAMES,
    DEAD,
    DUPLICATE_TOL,
    ERROR,
    G_REFRESH,
    INVERSE_GUARD,
    MARGIN,
    NEAR_TWIN_TOL,
    PENDING,
    POLISH_EVERY,
    RESERVE,
    RISKY_RATE,
    SNAP_TOL,
    BorderedMixin,
    _Degenerate,
    rho_midpoint,
)
from ._degenerate import DegenerateMixin
from .errors import PathError
from .kernels import rbf_kernel


class MaintainedSVDD(BorderedMixin, DegenerateMixin):
    """Slot-based maintained C&P state (fp64). Not thread-safe.

    Parameters
    ----------
    C : float, the fixed box.
    sigma : float, RBF bandwidth.
    dim : int, key dimension.
    refactor_every : int, refactorise ``Rinv`` after this many low-rank updates.
    """

    #: tolerance on rates (beta, gamma) below which a coefficient/gradient is treated as constant
    RATE_EPS = 1e-13
    #: relative Schur-complement size below which a border update is refused as ill-conditioned
    GUARD = 1e-14

    def __init__(self, C: float, sigma: float, dim: int, refactor_every: int = 64):
        self.C = float(C)
        self.sigma = float(sigma)
        self.dim = int(dim)
        self.refactor_every = int(refactor_every)
        cap = 16
        self.X = np.zeros((cap, dim))
        self.K = np.zeros((cap, cap))
        self.kd = np.zeros(cap)
        self.alpha = np.zeros(cap)
        self.g = np.zeros(cap)
        self.status = np.full(cap, DEAD, dtype=np.int8)
        self.n_slots = 0
        self.S: list[int] = []
        self.Rinv = np.zeros((1, 1))
        self.rho = 0.0
        self.solved = False
        self._updates = 0
        self.events = 0  # path events of the current operation
        self.refactorisations = 0
        self._ops = 0  # operations since the last exact gradient recompute
        self._since_polish = 0
        #: set by degenerate handling (near-twin swap, twin hand-over, pivot, snaps) in an
        #: operation: its end recomputes g exactly before the KKT guard reads it
        self._risky = False
        #: keys are stored (False for ``from_gram``): exact duplicates are then recognised by
        #: equal keys rather than by a feature-space distance at rounding level
        self._keyed = True

    # ------------------------------------------------------------------ storage
    def _grow(self, need: int) -> None:
        cap = self.X.shape[0]
        if need <= cap:
            return
        new = max(need, 2 * cap)
        X = np.zeros((new, self.dim)); X[:cap] = self.X
        K = np.zeros((new, new)); K[:cap, :cap] = self.K
        kd = np.zeros(new); kd[:cap] = self.kd
        a = np.zeros(new); a[:cap] = self.alpha
        g = np.zeros(new); g[:cap] = self.g
        st = np.full(new, DEAD, dtype=np.int8); st[:cap] = self.status
        self.X, self.K, self.kd, self.alpha, self.g, self.status = X, K, kd, a, g, st

    def append(self, Xnew: np.ndarray) -> np.ndarray:
        """Store new keys as PENDING slots (alpha 0); returns their slots. No solve."""
        m = Xnew.shape[0]
        lo = self.n_slots
        hi = lo + m
        self._grow(hi)
        self.X[lo:hi] = Xnew
        Knew = rbf_kernel(Xnew, self.X[:hi], self.sigma)
        self.K[lo:hi, :hi] = Knew
        self.K[:hi, lo:hi] = Knew.T
        self.kd[lo:hi] = np.diag(self.K)[lo:hi]
        self.alpha[lo:hi] = 0.0
        self.g[lo:hi] = 0.0
        self.status[lo:hi] = PENDING
        self.n_slots = hi
        return np.arange(lo, hi)

    @classmethod
    def from_gram(cls, K: np.ndarray, C: float, refactor_every: int = 64) -> MaintainedSVDD:
        """A solver over a given symmetric Gram matrix (keys are not stored); call ``initialise``."""
        n = K.shape[0]
        core = cls(C, 1.0, 1, refactor_every)
        core._keyed = False
        core._grow(n)
        core.K[:n, :n] = K
        core.kd[:n] = np.diag(K)
        core.status[:n] = PENDING
        core.n_slots = n
        return core

    def live(self) -> np.ndarray:
        return np.flatnonzero(self.status[: self.n_slots] >= 0)

    def compact(self) -> np.ndarray:
        """Drop dead slots; returns ``old_to_new`` (-1 for dead). Rinv is unaffected (S order kept)."""
        keep = self.live()
        old_to_new = np.full(self.n_slots, -1, dtype=np.int64)
        old_to_new[keep] = np.arange(keep.size)
        n = keep.size
        self.X[:n] = self.X[keep]
        self.K[:n, :n] = self.K[np.ix_(keep, keep)]
        for arr in (self.kd, self.alpha, self.g):
            arr[:n] = arr[keep]
        self.status[:n] = self.status[keep]
        self.status[n : self.n_slots] = DEAD
        self.n_slots = n
        self.S = [int(old_to_new[s]) for s in self.S]
        return old_to_new

    # ------------------------------------------------------------------ linear algebra


    # ------------------------------------------------------------------ gradients
    def recompute_g(self) -> None:
        """``g = rho - diag K + 2 K alpha`` from scratch on live slots."""
        self._ops = 0
        n = self.n_slots
        # dense mat-vec over all slots (dead/pending slots have alpha 0): faster than a gather
        self.g[:n] = self.rho - self.kd[:n] + 2.0 * (self.K[:n, :n] @ self.alpha[:n])


    def end_operation(self) -> None:
        """Bookkeeping at the end of a maintained operation: periodic exact gradient refresh."""
        self._ops += 1
        if self._ops >= G_REFRESH or self._risky:
            self.recompute_g()
        self._risky = False


    # ------------------------------------------------------------------ the event loop
    def _rates(self, c: int):
        """beta (margin sensitivities incl. rho) and gamma (gradient sensitivities)."""
        S = np.asarray(self.S, dtype=np.int64)
        v = np.empty(S.size + 1)
        v[0] = 1.0
        v[1:] = 2.0 * self.K[S, c]
        beta = -self.Rinv @ v
        if not self._risky and np.abs(beta).max(initial=0.0) > RISKY_RATE:
            # an ill-conditioned margin system: incremental gradient updates lose digits
            self._risky = True
        n = self.n_slots
        # contiguous row gather of K[S, :n] (K is symmetric) instead of a column gather
        gam_all = 2.0 * self.K[c, :n] + beta[0] + 2.0 * (beta[1:] @ self.K[S, :n])
        return S, beta, gam_all

    def _sweep(self, c: int, mode: str, max_events: int | None = None, frozen=()) -> int:
        """See :meth:`_sweep_events` (this wrapper silences 0/0 in the vectorised ratio tests)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return self._sweep_events(c, mode, max_events, frozen)

    def _sweep_events(self, c: int, mode: str, max_events: int | None = None, frozen=()) -> int:
        """Move ``alpha_c`` keeping KKT on every other settled key.

        mode ``"settle"``: stop when ``g_c = 0`` (c joins S) or ``alpha_c`` hits its bound.
        mode ``"remove"``: stop when ``alpha_c = 0``.
        mode ``"pivot"``: degenerate entry of c (``g_c = 0`` at a bound, its bordered Schur
        complement ~0, so ``g_c`` does not move with ``alpha_c``): move ``alpha_c`` into the box
        until a margin key leaves S and c can take its place, or ``alpha_c`` reaches the other
        bound. ``frozen`` slots (an enclosing sweep's moving key) take no gradient events.
        Returns the number of path events. Raises :class:`PathError` if it cannot complete.
        """
        C = self.C
        events = 0
        if max_events is None:
            max_events = 20 * max(self.n_slots, 1) + 200
        zero_steps = 0
        pinned: dict[int, int] = {}  # exact duplicates of margin keys: g pinned at 0 with their twin
        swapped: set[int] = set()  # keys involved in a near-twin swap during this sweep
        deg_pins: set[int] = set()  # numerically degenerate entrants, held at their bound until S changes
        while True:
            if events > max_events:
                raise PathError(f"C&P path did not terminate within {max_events} events")
            if mode == "remove":
                s = -1.0
                if self.alpha[c] <= 0.0:
                    self.alpha[c] = 0.0
                    return events
            elif mode == "pivot":
                self._risky = True
                s = 1.0 if self.status[c] == RESERVE else -1.0
                if not self.S:
                    self.g[c] = 0.0
                    self.status[c] = MARGIN
                    self._border_add(c)
                    return events
            else:
                gc = self.g[c]
                if gc < 0.0 and self.alpha[c] < C:
                    s = 1.0
                elif gc > 0.0 and self.alpha[c] > 0.0:
                    s = -1.0
                else:
                    self._classify_settled(c)
                    return events

            if not self.S:
                # margin set empty: sweep rho (every g moves at the same rate)
                live = self.live()
                others = live[(self.status[live] != MARGIN) & (live != c)]
                ost = self.status[others]
                cand_t, cand_k = [], []
                if s > 0:  # increase rho: error keys (g <= 0) and c's own g approach 0
                    pool = others[ost == ERROR]
                    if pool.size:
                        j = int(np.argmax(self.g[pool]))
                        cand_t.append(max(0.0, -self.g[pool[j]])); cand_k.append(int(pool[j]))
                    if mode == "settle":
                        cand_t.append(max(0.0, -self.g[c])); cand_k.append(c)
                else:  # decrease rho: reserve keys (g >= 0) approach 0
                    pool = others[ost == RESERVE]
                    if pool.size:
                        j = int(np.argmin(self.g[pool]))
                        cand_t.append(max(0.0, self.g[pool[j]])); cand_k.append(int(pool[j]))
                    if mode == "settle":
                        cand_t.append(max(0.0, self.g[c])); cand_k.append(c)
                if not cand_t and mode == "remove" and self.alpha[c] <= SNAP_TOL * C:
                    # the remaining keys already carry the mass (rounding residue only)
                    self.alpha[c] = 0.0
                    return events
                if not cand_t:
                    raise PathError(
                        "margin set is empty and no error/reserve key can enter it; "
                        "the problem would become infeasible"
                    )
                j = int(np.argmin(cand_t))
                t, k = cand_t[j], cand_k[j]
                delta = s * t
                self.rho += delta
                idx = live
                self.g[idx] += delta
                events += 1
                if k == c:
                    self.g[c] = 0.0
                    self._classify_settled(c, prefer_margin=True)
                    return events
                self.g[k] = 0.0
                self.status[k] = MARGIN
                self._border_add(k)  # S is empty here, so this cannot be degenerate
                continue

            S, beta, gam_all = self._rates(c)
            n = self.n_slots
            eps = self.RATE_EPS
            # c reaches its bound
            best_t = (C - self.alpha[c]) if s > 0 else self.alpha[c]
            best = ("c_bound", c)
            # c's gradient reaches 0 (settle only)
            if mode == "settle":
                rate = gam_all[c] * s
                if (self.g[c] < 0 and rate > eps) or (self.g[c] > 0 and rate < -eps):
                    t = -self.g[c] / rate
                    if t < best_t:
                        best_t, best = t, ("c_g", c)
            # margin keys reach 0 or C
            if S.size:
                rS = beta[1:] * s
                aS = self.alpha[S]
                t_S = np.where(rS < -eps, aS / -rS, np.where(rS > eps, (C - aS) / rS, np.inf))
                j = int(np.argmin(t_S))
                if t_S[j] < best_t:
                    best_t, best = max(t_S[j], 0.0), ("S_to_R" if rS[j] < 0 else "S_to_E", int(S[j]))
            # error / reserve keys' gradients reach 0: with sgn = +1 (error), -1 (reserve), 0
            # (margin, pending, dead), a key's gradient approaches 0 iff sgn * rate > eps, after
            # t = max(-sgn g, 0) / (sgn rate)
            st = self.status[:n]
            sgn = (st == ERROR).astype(np.float64)
            sgn -= st == RESERVE
            den = gam_all * (s * sgn)
            excl = [c, *frozen, *deg_pins]
            for k_, tw in list(pinned.items()):
                if st[tw] != MARGIN or st[k_] == MARGIN:
                    del pinned[k_]
                else:
                    excl.append(k_)
            den[excl] = 0.0
            num = self.g[:n] * -sgn
            np.maximum(num, 0.0, out=num)
            t_o = np.where(den > eps, num / den, np.inf)
            j = int(np.argmin(t_o))
            if t_o[j] < best_t:
                best_t, best = t_o[j], ("E_to_S" if st[j] == ERROR else "R_to_S", j)
            if not np.isfinite(best_t):
                raise PathError("no finite C&P step")
            t = float(best_t)
            zero_steps = zero_steps + 1 if t == 0.0 else 0
            if zero_steps > 2 * len(self.S) + 50:
                raise PathError("C&P path is cycling on degenerate (zero-length) steps")
            d = s * t
            self.alpha[c] += d
            self.alpha[S] += beta[1:] * d
            self.rho += beta[0] * d
            self.g[:n] += gam_all * d  # (dead slots carry meaningless g; never read)
            self.g[S] = 0.0
            for k_ in pinned:
                self.g[k_] = 0.0
            events += 1
            kind, k = best
            if kind == "c_bound":
                self.alpha[c] = C if s > 0 else 0.0
                if mode == "remove":
                    return events
                if mode == "pivot":
                    self.status[c] = ERROR if s > 0 else RESERVE
                    self.g[c] = 0.0
                    return events
                self._classify_settled(c)
                return events
            if kind == "c_g":
                self.g[c] = 0.0
                self._join_margin_or_yield(c)
                return events
            if kind in ("S_to_R", "S_to_E"):
                deg_pins.clear()
            if kind == "S_to_R":
                self.alpha[k] = 0.0
                self.g[k] = 0.0
                self.status[k] = RESERVE
                self._border_remove(k)
            elif kind == "S_to_E":
                self.alpha[k] = C
                self.g[k] = 0.0
                self.status[k] = ERROR
                self._border_remove(k)
            else:  # E_to_S / R_to_S
                self.g[k] = 0.0
                prev = self.status[k]
                self.status[k] = MARGIN
                try:
                    # a key that already swapped with a near-twin in this sweep joins beside
                    # it instead (swapping again at a zero-length step would cycle)
                    self._border_add(k, near_tol=0.0 if k in swapped else NEAR_TWIN_TOL)
                    if t == 0.0 and not self._enters_consistently(c, k, s, prev):
                        # numerically degenerate entry (its rate in S contradicts the direction
                        # it entered from, so it would leave again at once: a zero-step cycle).
                        # It is handled as a degenerate pivot (inside a pivot: held at its bound
                        # with g_k = 0, taking no events until S changes)
                        self._border_remove(k)
                        self.status[k] = prev
                        if mode != "pivot":
                            self._sweep(k, "pivot", frozen=(c, *frozen, *pinned))
                        else:
                            deg_pins.add(k)
                        continue
                    deg_pins.clear()
                except _Degenerate as exc:
                    self.status[k] = prev
                    if len(exc.args) > 2:
                        swapped.add(k)
                        swapped.add(exc.args[1])
                        if self._swap_near_twin(k, exc.args[1], prev):
                            continue
                        self.status[k] = MARGIN
                        try:
                            self._border_add(k)
                            deg_pins.clear()
                        except _Degenerate:
                            self.status[k] = prev
                            self.g[k] = 0.0
                            self._sweep(k, "pivot", frozen=(c, *frozen, *pinned))
                            continue
                    if len(exc.args) > 1:
                        # exact duplicate of a margin key: g_k = 0 with its bound is valid KKT;
                        # it stays where it is and its gradient moves with its twin's (0)
                        pinned[k] = exc.args[1]
                        continue
                    # k's bordered column is (numerically) dependent on the margin set's: a
                    # degenerate pivot moves its mass into the box until a margin key leaves
                    self.g[k] = 0.0
                    self._sweep(k, "pivot", frozen=(c, *frozen, *pinned))
                    continue
            if mode == "pivot" and kind in ("S_to_R", "S_to_E"):
                # a margin key left: c may now take its place in a well-posed margin system
                prev = self.status[c]
                self.status[c] = MARGIN
                try:
                    self._border_add(c)
                except _Degenerate:
                    self.status[c] = prev
                else:
                    self.g[c] = 0.0
                    return events
            if self._updates == 0 and self.S:
                # just refactorised: re-solve the margin system so drift does not accumulate
                self._resolve_margin()


    # ------------------------------------------------------------------ operations
    def settle(self, c: int) -> int:
        """Bring a PENDING slot to KKT (admission or initialisation)."""
        live = self.live()
        settled = live[(self.status[live] != PENDING) & (live != c)]
        if settled.size == 0:
            # first key of the solve: rho is free; choose it so that g_c = 0
            sup = live[self.alpha[live] != 0.0]
            self.rho = float(self.kd[c] - 2.0 * (self.K[c, sup] @ self.alpha[sup]))
            self.g[c] = 0.0
            self.status[c] = RESERVE  # provisional, replaced below
            self._classify_settled(c, prefer_margin=True)
            return 0
        sup = live[self.alpha[live] != 0.0]
        self.g[c] = self.rho - self.kd[c] + 2.0 * (self.K[c, sup] @ self.alpha[sup])
        self.status[c] = RESERVE if self.alpha[c] == 0.0 else ERROR  # outside S while it moves
        return self._sweep(c, "settle")

    def initialise(self) -> int:
        """Solve from scratch by settling every pending key from the feasible start 1/n."""
        live = self.live()
        self.alpha[live] = 1.0 / live.size
        self.S = []
        self.Rinv = np.zeros((1, 1))
        events = 0
        for c in live:
            events += self.settle(int(c))
        self.solved = True
        if self.S:
            self.refactor()
        self.polish()
        self._risky = True  # the first solve ends with an exact gradient
        return events

    def admit_slot(self, c: int) -> int:
        self.alpha[c] = 0.0
        ev = self.settle(c)
        return ev

    def remove_slot(self, c: int) -> int:
        """Decrement ``alpha_c`` to 0 by the reverse C&P path, then drop the slot."""
        ev = 0
        if self.status[c] == MARGIN:
            self._border_remove(c)
            self.status[c] = ERROR  # treated as a fixed coefficient while it is swept
        if self.alpha[c] > 0.0:
            self.g[c] = 0.0
            ev = self._sweep(c, "remove")
        self.alpha[c] = 0.0
        self.status[c] = DEAD
        return ev

    # ------------------------------------------------------------------ exact fallback

    def maintained_violation(self) -> float:
        """Largest KKT violation read from the maintained gradient (O(n); no kernel products)."""
        n = self.n_slots
        st = self.status[:n]
        if (st == PENDING).any():
            return float("inf")
        a = self.alpha[:n]  # dead slots hold alpha 0
        g = self.g[:n]
        sgn = (st == ERROR).astype(np.float64)
        sgn -= st == RESERVE
        v = max(abs(a.sum() - 1.0), -a.min(initial=0.0), (a - self.C).max(initial=0.0),
                (sgn * g).max(initial=0.0))  # error: g <= 0, reserve: g >= 0
        if self.S:
            v = max(v, np.abs(g[self.S]).max())
        return float(v)

    # ------------------------------------------------------------------ diagnostics
    def margin_residual(self) -> float:
        """Exact ``max |g_S|`` (O(|S| n)): the path sets the maintained ``g_S`` to 0 at every
        event, which would hide an inaccurate margin solve from :meth:`maintained_violation`."""
        if not self.S:
            return 0.0
        n = self.n_slots
        S = self.S
        gS = self.rho - self.kd[S] + 2.0 * (self.K[S, :n] @ self.alpha[:n])
        return float(np.abs(gS).max())

    def kkt_residual(self) -> dict:
        """KKT violations recomputed from scratch (not from the maintained g)."""
        live = self.live()
        a = self.alpha[live]
        st = self.status[live]
        sup = live[a != 0.0]
        g = self.rho - self.kd[live] + 2.0 * (self.K[np.ix_(live, sup)] @ self.alpha[sup])
        out = {
            "sum": float(abs(a.sum() - 1.0)),
            "box": float(max(0.0, -a.min(initial=0.0), (a - self.C).max(initial=0.0))),
            "margin_gradient": float(np.abs(g[st == MARGIN]).max(initial=0.0)),
            "error_gradient": float(np.maximum(g[st == ERROR], 0.0).max(initial=0.0)),
            "reserve_gradient": float(np.maximum(-g[st == RESERVE], 0.0).max(initial=0.0)),
        }
        if self.S:
            M = self._bordered()
            # diagnostic only: ||M Rinv - I|| grows with cond(M) even when the solution is exact
            out["inverse"] = float(np.abs(M @ self.Rinv - np.eye(M.shape[0])).max())
        else:
            out["inverse"] = 0.0
        out["max"] = max(v for k, v in out.items() if k != "inverse")
        return out

    def partition_counts(self) -> dict:
        st = self.status[: self.n_slots]
        counts = np.bincount(st[st >= 0], minlength=4)
        return {"margin": int(counts[MARGIN]), "error": int(counts[ERROR]), "reserve": int(counts[RESERVE])}

    def snapshot(self) -> dict:
        """Everything an operation may change, for bit-for-bit rollback (K/X are append-only)."""
        n = self.n_slots
        return {
            "alpha": self.alpha[:n].copy(),
            "g": self.g[:n].copy(),
            "status": self.status[:n].copy(),
            "n_slots": n,
            "S": list(self.S),
            "Rinv": self.Rinv.copy(),
            "rho": self.rho,
            "solved": self.solved,
            "_updates": self._updates,
        }

    def restore(self, snap: dict) -> None:
        n = snap["n_slots"]
        self.alpha[:n] = snap["alpha"]
        self.g[:n] = snap["g"]
        self.status[:n] = snap["status"]
        self.status[n : self.n_slots] = DEAD
        self.alpha[n : self.n_slots] = 0.0
        self.n_slots = n
        self.S = list(snap["S"])
        self.Rinv = snap["Rinv"].copy()
        self.rho = snap["rho"]
        self.solved = snap["solved"]
        self._updates = snap["_updates"]


