"""The maintained fp64 Cauwenberghs-Poggio (C&P) solver of the fixed-C SVDD dual.

Problem (SPEC §1)::

    min_a  a^T K a - diag(K)^T a    s.t.  sum(a) = 1,  0 <= a_i <= C

State: keys, coefficients ``alpha``, offset ``rho``, gradient ``g_i = rho - K_ii + 2 (K a)_i``,
the partition margin ``S`` (0 < a < C, g = 0), error ``E`` (a = C, g <= 0), reserve ``R``
(a = 0, g >= 0), and ``Rinv = M^{-1}`` for the bordered matrix ``M = [[0, 1^T], [1, 2 K_SS]]``.
One event loop (:meth:`MaintainedSVDD._sweep_events`) moves one coefficient while every other key
keeps its KKT conditions: admission, initialisation and deletion are built on it. Storage and the
margin set: :mod:`sv_core._state`; ``Rinv`` algebra: :mod:`sv_core._bordered`; duplicate keys and
the empty-margin rho sweep: :mod:`sv_core._degenerate`; the compiled fast path of simple events:
:mod:`sv_core._fastpath`. Slots are internal positions; :class:`sv_core.Gate` maps token ids to
slots. docs/GATE.md.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator

import numpy as np

from sv_core import _fastpath
from sv_core._bordered import rho_midpoint  # noqa: F401  (re-exported)
from sv_core._degenerate import DegenerateMixin
from sv_core._state import (  # noqa: F401  (re-exported: the solver's public constants)
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
    STATUS_NAMES,
    STATUS_SIGN,
    Degenerate,
    FloatArray,
)
from sv_core.errors import PathError

_INF = math.inf


class MaintainedSVDD(DegenerateMixin):
    """Slot-based maintained C&P state (fp64). Not thread-safe.

    Parameters
    ----------
    C : float, the fixed box.
    sigma : float, RBF bandwidth.
    dim : int, key dimension.
    refactor_every : int, refactorise ``Rinv`` after this many low-rank updates.

    ``Rinv`` is kept by rank-one border updates (a key enters S) and Schur downdates (a key leaves
    S), with a full refactorisation every ``refactor_every`` updates and whenever a conditioning guard
    trips. The gradient is updated incrementally along the path and by every margin re-solve
    (``O(|S| n)``); it is recomputed exactly every ``G_REFRESH`` operations, after any degenerate
    handling, and whenever the gate's KKT guard reads a residual above ``1e-12``.

    Fast path: the simple events of a top-level deletion or admission (no duplicate, no zero-length
    step, no refactorisation due, a well-conditioned margin system) run in the compiled loop of
    :mod:`sv_core._fastpath` (C, ``sv_core/_cpfast.c``), which hands over to the reference loop at the
    first event that is not simple; ``FORGETFUL_SOLVER=reference`` runs the reference alone, and the
    tests run both.
    """

    #: run the simple events of top-level sweeps in the compiled loop (:mod:`sv_core._fastpath`);
    #: False on a solver (or ``FORGETFUL_SOLVER=reference``) runs the NumPy reference throughout
    use_fast = _fastpath.fast_path_available()

    # ------------------------------------------------------------------ the event loop
    def _sweep(self, c: int, mode: str, max_events: int | None = None, frozen: Iterable[int] = ()) -> int:
        """See :meth:`_sweep_events` (this wrapper silences 0/0 in the vectorised ratio tests).

        A top-level deletion or admission first runs in the compiled loop, which hands over to the
        reference loop at the first event that is not simple."""
        frozen = tuple(frozen)
        resume = None
        if self.use_fast and self._S and not frozen and max_events is None and mode in ("remove", "settle"):
            events, resume = _fastpath.fast_sweep(self, c, mode)
            if resume is None:
                return events
        with np.errstate(divide="ignore", invalid="ignore"):
            return self._sweep_events(c, mode, max_events, frozen, resume)

    def _sweep_events(self, c: int, mode: str, max_events: int | None = None,
                      frozen: tuple[int, ...] = (),
                      resume: tuple[str, int, float, float, int] | None = None) -> int:
        """Move ``alpha_c`` keeping KKT on every other settled key.

        mode ``"settle"``: stop when ``g_c = 0`` (c joins S) or ``alpha_c`` hits its bound.
        mode ``"remove"``: stop when ``alpha_c = 0``.
        mode ``"pivot"``: degenerate entry of c (``g_c = 0`` at a bound, its bordered Schur
        complement ~0, so ``g_c`` does not move with ``alpha_c``): move ``alpha_c`` into the box
        until a margin key leaves S and c can take its place, or ``alpha_c`` reaches the other
        bound. ``frozen`` slots (an enclosing sweep's moving key) take no gradient events.
        ``resume = (kind, k, t, s, events)`` continues a sweep the compiled loop began: the step
        of event ``kind`` (``"search"``: none) was applied and its post-step handling is done here.
        Returns the number of path events. Raises :class:`PathError` if it cannot complete.

        It serves admission ("settle": a new key enters with ``alpha_c = 0``; if ``g_c < 0`` it is
        increased until ``g_c`` reaches 0 (margin) or ``alpha_c`` reaches C (error)); initialisation (the
        first keys start *pending* at ``alpha = 1/n`` and are settled one by one, moving ``alpha_c`` up or
        down until its own KKT condition holds); deletion ("remove": ``alpha_c`` is driven to 0 whatever
        ``g_c`` does). When the margin set is empty no coefficient can move without breaking
        ``sum(a) = 1``; the loop then sweeps ``rho`` instead (every ``g`` moves at rate 1) until an error
        or reserve key reaches ``g = 0`` and joins the margin set, so a decrement completes when S empties
        mid-path. The event search is vectorised over all slots with per-sweep sign vectors, the margin
        and gradient rates come from the cached bordered rows ``[1; 2 K[S, :]]`` (one ``|S| x n``
        mat-vec per event), and the ratio test over the few margin keys runs on Python floats.
        """
        C = self.C
        eps = self.RATE_EPS
        n = self.n_slots
        g = self.g
        alpha = self.alpha
        status = self.status
        events = 0
        if max_events is None:
            max_events = 20 * max(n, 1) + 200
        zero_steps = 0
        pinned: dict[int, int] = {}  # exact duplicates of margin keys: g pinned at 0 with their twin
        swapped: set[int] = set()  # keys involved in a near-twin swap during this sweep
        deg_pins: set[int] = set()  # numerically degenerate entrants, held at their bound until S changes
        K2c = self.K[c, :n] * 2.0  # c's gradient rates get 2 K[c, :] (n is fixed within a sweep)
        # per-sweep sign vectors of the error/reserve ratio test: ssgn = s * sign (0 on margin,
        # pending, dead and excluded slots), nsgn = -sign; rebuilt when `dirty`, else kept by
        # in-place updates at simple events
        ssgn = nsgn = K2c
        s_cached = 0.0
        dirty = True
        if resume is not None and resume[0] == "search":  # handed over before any step
            events = resume[4]
            resume = None
        pending = resume
        while True:
            if pending is not None:
                # the compiled loop applied this event's step; statuses are still those it
                # searched with, so the sign vectors are rebuilt exactly as the search would have
                kind, k, t, s, events = pending
                pending = None
                sgn = STATUS_SIGN.take(status[:n], mode="wrap")
                nsgn = -sgn
                ssgn = sgn
                ssgn *= s
                ssgn[c] = 0.0
                s_cached, dirty = s, False
            else:
                if events > max_events:
                    raise PathError(f"C&P path did not terminate within {max_events} events")
                if mode == "remove":
                    s = -1.0
                    if alpha[c] <= 0.0:
                        alpha[c] = 0.0
                        return events
                elif mode == "pivot":
                    self._risky = True
                    s = 1.0 if status[c] == RESERVE else -1.0
                    if not self._S:
                        g[c] = 0.0
                        status[c] = MARGIN
                        self._border_add(c)
                        return events
                else:
                    gc = float(g[c])
                    if gc < 0.0 and alpha[c] < C:
                        s = 1.0
                    elif gc > 0.0 and alpha[c] > 0.0:
                        s = -1.0
                    else:
                        self._classify_settled(c)
                        return events

                if not self._S:
                    done, ev = self._empty_margin_step(c, mode, s)
                    events += ev
                    dirty = True
                    if done:
                        return events
                    continue

                # rates: beta (margin coefficients incl. rho) and gamma (gradients), from the cached
                # bordered rows B = [1; 2 K[S, :n]]
                # (nb = -beta: the sign is folded into its uses, exactly)
                S, B = self.margin_rows()
                nb = self.Rinv @ B[:, c]
                if not self._risky and (nb[nb.argmax()] > RISKY_RATE or nb[nb.argmin()] < -RISKY_RATE):
                    # an ill-conditioned margin system: incremental gradient updates lose digits
                    self._risky = True
                gam_all = nb @ B
                np.subtract(K2c, gam_all, out=gam_all)
                # c reaches its bound
                ac = float(alpha[c])
                best_t = (C - ac) if s > 0 else ac
                kind, k = "c_bound", c
                # c's gradient reaches 0 (settle only)
                if mode == "settle":
                    rate = float(gam_all[c]) * s
                    gc = float(g[c])
                    if (gc < 0 and rate > eps) or (gc > 0 and rate < -eps):
                        t = -gc / rate
                        if t < best_t:
                            best_t, kind = t, "c_g"
                # margin keys reach 0 or C (few keys: Python floats, first minimum wins)
                rl = nb[1:].tolist()
                al = alpha[S].tolist()
                bt, bj = _INF, -1
                ns = -s
                for j, r in enumerate(rl):
                    r *= ns  # beta_j * s
                    if r < -eps:
                        t = al[j] / -r
                    elif r > eps:
                        t = (C - al[j]) / r
                    else:
                        continue
                    if t < bt:
                        bt, bj = t, j
                if bt < best_t:
                    best_t = max(bt, 0.0)
                    kind, k = ("S_to_R" if rl[bj] * ns < 0 else "S_to_E"), int(S[bj])
                # error / reserve keys' gradients reach 0: with sign = +1 (error), -1 (reserve), 0
                # (margin, pending, dead), a key's gradient approaches 0 iff s * sign * rate > eps,
                # after t = max(-sign g, 0) / (s sign rate)
                for k_, tw in list(pinned.items()):
                    if status[tw] != MARGIN or status[k_] == MARGIN:
                        del pinned[k_]
                        dirty = True
                if dirty or s != s_cached:
                    sgn = STATUS_SIGN.take(status[:n], mode="wrap")
                    nsgn = -sgn
                    ssgn = sgn
                    ssgn *= s
                    ssgn[[c, *frozen, *deg_pins, *pinned]] = 0.0
                    s_cached, dirty = s, False
                den = gam_all * ssgn
                num = g[:n] * nsgn
                np.maximum(num, 0.0, out=num)
                t_o = np.where(den > eps, num / den, _INF)
                j = int(t_o.argmin())
                tj = float(t_o[j])
                if tj < best_t:
                    best_t = tj
                    kind, k = ("E_to_S" if status[j] == ERROR else "R_to_S"), j
                if not math.isfinite(best_t):
                    raise PathError("no finite C&P step")
                t = float(best_t)
                zero_steps = zero_steps + 1 if t == 0.0 else 0
                if zero_steps > 2 * len(self._S) + 50:
                    raise PathError("C&P path is cycling on degenerate (zero-length) steps")
                d = s * t
                alpha[c] += d
                alpha[S] -= nb[1:] * d
                self.rho -= float(nb[0]) * d
                gam_all *= d
                g[:n] += gam_all  # (dead slots carry meaningless g; never read)
                g[S] = 0.0
                for k_ in pinned:
                    g[k_] = 0.0
                events += 1
            if kind == "c_bound":
                alpha[c] = C if s > 0 else 0.0
                if mode == "remove":
                    return events
                if mode == "pivot":
                    status[c] = ERROR if s > 0 else RESERVE
                    g[c] = 0.0
                    return events
                self._classify_settled(c)
                return events
            if kind == "c_g":
                g[c] = 0.0
                self._join_margin_or_yield(c)
                return events
            if kind in ("S_to_R", "S_to_E"):
                if deg_pins:
                    deg_pins.clear()
                    dirty = True
                to_e = kind == "S_to_E"
                alpha[k] = C if to_e else 0.0
                g[k] = 0.0
                status[k] = ERROR if to_e else RESERVE
                self._border_remove(k)
                if not dirty:
                    sk = 1.0 if to_e else -1.0
                    ssgn[k] = 0.0 if k in frozen else s * sk
                    nsgn[k] = -sk
            else:  # E_to_S / R_to_S
                g[k] = 0.0
                prev = int(status[k])
                status[k] = MARGIN
                dirty = True
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
                        status[k] = prev
                        if mode != "pivot":
                            self._sweep(k, "pivot", frozen=(c, *frozen, *pinned))
                        else:
                            deg_pins.add(k)
                        continue
                    if not deg_pins:
                        # a simple entry: k's sign is now 0
                        ssgn[k] = 0.0
                        nsgn[k] = 0.0
                        dirty = False
                    deg_pins.clear()
                except Degenerate as exc:
                    status[k] = prev
                    if len(exc.args) > 2:
                        swapped.add(k)
                        swapped.add(exc.args[1])
                        if self._swap_near_twin(k, exc.args[1], prev):
                            continue
                        status[k] = MARGIN
                        try:
                            self._border_add(k)
                            deg_pins.clear()
                        except Degenerate:
                            status[k] = prev
                            g[k] = 0.0
                            self._sweep(k, "pivot", frozen=(c, *frozen, *pinned))
                            continue
                    if len(exc.args) > 1:
                        # exact duplicate of a margin key: g_k = 0 with its bound is valid KKT;
                        # it stays where it is and its gradient moves with its twin's (0)
                        pinned[k] = exc.args[1]
                        continue
                    # k's bordered column is (numerically) dependent on the margin set's: a
                    # degenerate pivot moves its mass into the box until a margin key leaves
                    g[k] = 0.0
                    self._sweep(k, "pivot", frozen=(c, *frozen, *pinned))
                    continue
            if mode == "pivot" and kind in ("S_to_R", "S_to_E"):
                # a margin key left: c may now take its place in a well-posed margin system
                prev = int(status[c])
                status[c] = MARGIN
                dirty = True
                try:
                    self._border_add(c)
                except Degenerate:
                    status[c] = prev
                else:
                    g[c] = 0.0
                    return events
            if self._updates == 0 and self._S:
                # just refactorised: re-solve the margin system so drift does not accumulate
                self._resolve_margin()

    # ------------------------------------------------------------------ operations
    def settle(self, c: int) -> int:
        """Bring a PENDING slot to KKT (admission or initialisation)."""
        n = self.n_slots
        if not self.solved:
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
        # dead slots hold alpha 0, so the full row product is the sum over the support
        self.g[c] = self.rho - self.kd[c] + 2.0 * float(self.K[c, :n] @ self.alpha[:n])
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
        if self._S:
            self.refactor()
        self.polish()
        self._risky = True  # the first solve ends with an exact gradient
        return events

    def admit_slot(self, c: int) -> int:
        self.alpha[c] = 0.0
        return self.settle(c)

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


@contextlib.contextmanager
def reference_loop() -> Iterator[None]:
    """Within the block every solver runs the NumPy reference loop only (for interleaved
    fast-vs-reference timings and tests; not thread-safe: it flips a class attribute)."""
    old = MaintainedSVDD.use_fast
    MaintainedSVDD.use_fast = False
    try:
        yield
    finally:
        MaintainedSVDD.use_fast = old
