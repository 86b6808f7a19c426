"""Edge cases of the maintained C&P event loop (mixin of :class:`MaintainedSVDD`).

With the margin set empty no coefficient can move without breaking ``sum(a) = 1``:
:meth:`DegenerateMixin._empty_margin_step` sweeps rho instead until a key joins S.

Near-duplicate keys make the bordered margin system (near-)singular. The event loop treats
them consistently:

* an exact duplicate (bit-equal key) of a margin key reaching the margin hands its coefficient to
  that twin (identical kernel rows: no gradient changes);
* a near-twin (feature distance^2 <= ``NEAR_TWIN_TOL``) reaching the margin swaps with its twin
  in one step, accepted only if the re-solved margin system stays in the box (else it joins);
* a key whose bordered Schur complement is ~0, or whose entry rate contradicts the side it
  entered from (a zero-length cycle), is entered by a *degenerate pivot*: its coefficient moves
  into the box along the null direction until a margin key leaves and it can take its place;
* where the path still cannot proceed, :class:`sv_core.Gate` completes the operation by the exact
  fallback: :meth:`DegenerateMixin.load_solution` rebuilds the state from a fresh refit.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sv_core._bordered import BorderedMixin
from sv_core._state import DEAD, ERROR, MARGIN, RESERVE, SNAP_TOL, Degenerate, FloatArray
from sv_core.errors import PathError


class DegenerateMixin(BorderedMixin):
    """The event loop's edge cases: the empty-margin rho sweep, twin hand-over, near-twin swap,
    degenerate-pivot checks and state rebuilds."""

    #: the one C&P event loop, defined by :class:`sv_core.solver.MaintainedSVDD` (the pivots and
    #: hand-overs below re-enter it): ``_sweep(c, mode, max_events=None, frozen=()) -> events``
    _sweep: Callable[..., int]

    def _empty_margin_step(self, c: int, mode: str, s: float) -> tuple[bool, int]:
        """One event with the margin set empty: sweep rho (every g moves at rate 1) until an
        error/reserve key (or, settling, c itself) reaches g = 0. Returns (done, events)."""
        live = self.live()
        others = live[(self.status[live] != MARGIN) & (live != c)]
        ost = self.status[others]
        cand_t: list[float] = []
        cand_k: list[int] = []
        if s > 0:  # increase rho: error keys (g <= 0) and c's own g approach 0
            pool = others[ost == ERROR]
            if pool.size:
                j = int(np.argmax(self.g[pool]))
                cand_t.append(max(0.0, -float(self.g[pool[j]]))); cand_k.append(int(pool[j]))
            if mode == "settle":
                cand_t.append(max(0.0, -float(self.g[c]))); cand_k.append(c)
        else:  # decrease rho: reserve keys (g >= 0) approach 0
            pool = others[ost == RESERVE]
            if pool.size:
                j = int(np.argmin(self.g[pool]))
                cand_t.append(max(0.0, float(self.g[pool[j]]))); cand_k.append(int(pool[j]))
            if mode == "settle":
                cand_t.append(max(0.0, float(self.g[c]))); cand_k.append(c)
        if not cand_t and mode == "remove" and self.alpha[c] <= SNAP_TOL * self.C:
            # the remaining keys already carry the mass (rounding residue only)
            self.alpha[c] = 0.0
            return True, 0
        if not cand_t:
            raise PathError(
                "margin set is empty and no error/reserve key can enter it; "
                "the problem would become infeasible"
            )
        j = int(np.argmin(cand_t))
        t, k = cand_t[j], cand_k[j]
        delta = s * t
        self.rho += delta
        self.g[live] += delta
        if k == c:
            self.g[c] = 0.0
            self._classify_settled(c, prefer_margin=True)
            return True, 1
        self.g[k] = 0.0
        self.status[k] = MARGIN
        self._border_add(k)  # S is empty here, so this cannot be degenerate
        return False, 1

    def _enters_consistently(self, c: int, k: int, s: float, prev: int) -> bool:
        """After k joined S at a zero-length step: does its coefficient move into the box?"""
        _, B = self.margin_rows()
        rate = -float(self.Rinv[-1] @ B[:, c]) * s  # k is the last margin key
        return rate > 0.0 if prev == RESERVE else rate < 0.0

    def _swap_near_twin(self, k: int, j: int, prev: int) -> bool:
        """Key k (at its bound, status ``prev``) reaches ``g_k = 0`` beside its near-twin j in S.

        Along the exact path the pair's gradient difference changes at first order in their
        distance while moving mass between them changes it only at second order, so the mass
        moves at a rate ~ 1/distance^2 until j reaches the bound k left: a step of length
        ~distance^2. It is taken in one go: k joins S, j takes k's bound (0 from the reserve set,
        C from the error set; total mass is unchanged), and the margin system is re-solved on
        the new partition (which is well conditioned: j has left it).
        """
        self._risky = True
        n = self.n_slots
        saved = (list(self.S), self.Rinv.copy(), self._updates, float(self.alpha[j]), self.rho,
                 self.g[:n].copy())
        self._border_remove(j)
        self.status[j] = prev
        new = 0.0 if prev == RESERVE else self.C
        self.g[:n] += 2.0 * (new - self.alpha[j]) * self.K[j, :n]  # keep g consistent with alpha
        self.alpha[j] = new
        self.status[k] = MARGIN
        try:
            self._border_add(k)
            self.refactor()
            ok = self._resolve_margin()
        except Degenerate:
            ok = False
        if ok:
            return True
        # the swap is not consistent here (its re-solve leaves the box): undo it; the caller
        # lets k join beside its twin instead
        S_saved, self.Rinv, self._updates, self.alpha[j], self.rho, g = saved
        self.S = S_saved
        self.g[:n] = g
        self.status[j] = MARGIN
        self.status[k] = prev
        return False

    def _classify_settled(self, c: int, prefer_margin: bool = False) -> None:
        a = self.alpha[c]
        if a <= 0.0:
            self.alpha[c] = 0.0
            self.status[c] = RESERVE
        elif a >= self.C:
            self.alpha[c] = self.C
            self.status[c] = ERROR
        else:
            # strictly inside the box: must be a margin key
            self._join_margin_or_yield(c)

    def _join_margin_or_yield(self, c: int) -> None:
        """Put c (g_c = 0, alpha_c inside the box) in S; if it duplicates margin keys, hand its
        coefficient to them instead (drive alpha_c to 0 along the path; g_c stays 0)."""
        try:
            self.status[c] = MARGIN
            self._border_add(c)
        except Degenerate as exc:
            twin = exc.args[1] if len(exc.args) > 1 else None
            if twin is not None:
                # exact duplicate: K columns are identical, so moving mass between the two keys
                # changes no gradient; the twin takes what fits under C, c keeps the rest
                total = self.alpha[c] + self.alpha[twin]
                a_c, a_t = self.alpha[c], self.alpha[twin]
                self._risky = True
                if total <= self.C:
                    self.alpha[twin] = total
                    self.alpha[c] = 0.0
                    self.status[c] = RESERVE
                else:
                    self.alpha[twin] = self.C
                    self.alpha[c] = total - self.C
                    self.status[twin] = ERROR
                    self.g[twin] = 0.0
                    self.S[self.S.index(twin)] = int(c)  # same row of M: Rinv is unchanged
                    self._s_changed()
                    self.status[c] = MARGIN
                n = self.n_slots
                # identical keys: identical kernel rows, so this changes g only at rounding level
                self.g[:n] += 2.0 * ((self.alpha[c] - a_c) * self.K[c, :n]
                                     + (self.alpha[twin] - a_t) * self.K[twin, :n])
                self.g[c] = 0.0
                return
            self.status[c] = ERROR  # fixed while it is swept
            self._sweep(c, "remove")
            self.alpha[c] = 0.0
            self.status[c] = RESERVE

    def load_solution(self, slots: np.ndarray, alpha: FloatArray, status: np.ndarray, rho: float) -> None:
        """Replace the maintained state by a given solution of the live keys (exact fallback).

        ``slots`` are the live slots, ``alpha``/``status`` aligned with them (from the refit
        oracle). The margin set, the bordered inverse and the gradient are rebuilt from scratch.
        """
        self.load_deferred(slots, alpha, status, rho)
        self.materialise()

    def load_deferred(self, slots: np.ndarray, alpha: FloatArray, status: np.ndarray, rho: float) -> None:
        """Set a solution of the live keys (as :meth:`load_solution`) but leave the kernel, the
        bordered inverse and the gradient to :meth:`materialise` (O(n) work and memory here)."""
        slots = np.asarray(slots, dtype=np.int64)
        n = self.n_slots
        dead = np.ones(n, dtype=bool)
        dead[slots] = False
        self.alpha[:n] = 0.0
        self.alpha[slots] = alpha
        self.status[:n][dead] = DEAD
        self.status[slots] = np.asarray(status, dtype=np.int8)
        self.S = [int(s) for s in slots[np.asarray(status) == MARGIN]]
        self.rho = float(rho)
        self.solved = True
        self.Rinv = np.zeros((1, 1))
        self.deferred = True

    def materialise(self) -> None:
        """Build what a C&P step needs and a deferred state lacks: the missing kernel rows, then
        (solved) the bordered inverse of the margin set and the exact gradient, exactly as
        :meth:`load_solution` of the same solution would. No-op when nothing is deferred."""
        if not self.deferred:
            return
        self._build_kernel()
        if self.solved:
            if self.S:
                self.refactor()
            self.recompute_g()
        self.deferred = False
