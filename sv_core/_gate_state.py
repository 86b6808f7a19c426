"""The solver state behind :class:`sv_core.Gate`: the maintained solver, token ids, the record of
how operations completed, and the state's serialisation.

:class:`GateState` holds the maintained C&P solver (:class:`sv_core.solver.MaintainedSVDD`,
created *deferred* with the first key: its kernel, bordered inverse and gradient are built by
:meth:`GateState.solver` when a C&P step first needs them), the stable token ids of its slots,
the forgotten ids, the :class:`sv_core._gate_exact.ExactCompletion` record and the first-solve
log. :meth:`GateState.save`/:meth:`GateState.rollback` undo an operation bit for bit;
:meth:`GateState.to_dict`, :meth:`GateState.from_dict` and :meth:`GateState.from_solution`
implement :meth:`sv_core.Gate.to_state`, ``from_state`` and ``from_solution``.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from sv_core._blas import single_thread
from sv_core._gate_exact import KKT_GUARD, ExactCompletion, consolidate_repeats
from sv_core.calibrate import warmup_size
from sv_core.errors import (
    GateError,
    InfeasibleError,
    InvalidKeysError,
    InvalidParameterError,
    InvalidStateError,
    PathError,
    UnknownTokenError,
)
from sv_core.kernels import rbf_kernel
from sv_core.solver import DEAD, ERROR, MARGIN, RESERVE, MaintainedSVDD
from sv_core.validation import check_token_id, load_state

#: ``from_state`` accepts a solved state whose recomputed KKT residual is at most this
STATE_KKT_TOL = 1e-8


class GateState:
    """Solver, token ids and operation record of one gate (see the module docstring).

    Token ids are stable integers (``next_id`` is the next one); ``slot_of`` maps each live id
    to its solver slot and ``id_of_slot`` every slot to its id; ``forgotten`` holds the deleted
    ids (never reused).
    """

    def __init__(self, C: float, sigma: float, refactor_every: int):
        self.C, self.sigma, self.refactor_every = C, sigma, int(refactor_every)
        self.core: MaintainedSVDD | None = None
        self.slot_of: dict[int, int] = {}
        self.id_of_slot: list[int] = []
        self.next_id = 0
        self.forgotten: set[int] = set()
        self.exact = ExactCompletion()
        #: one ``{"method", "keys", "kkt_violation", "fallback_reason"}`` dict per first solve
        self.cold_solve_log: list[dict] = []
        self._dropped: list[tuple[int, int]] = []  # (id, slot) deleted since the last compaction

    # ------------------------------------------------------------------ reading (nothing is built)
    @property
    def dim(self) -> int | None:
        return None if self.core is None else self.core.dim

    @property
    def n(self) -> int:
        return len(self.slot_of)

    @property
    def solved(self) -> bool:
        return self.core is not None and self.core.solved

    def stored(self) -> MaintainedSVDD:
        """The solver as stored, possibly deferred: keys, coefficients, statuses and rho."""
        if self.core is None:
            raise GateError("the gate holds no keys")
        return self.core

    def solver(self) -> MaintainedSVDD:
        """The solver with everything a C&P step needs built (a deferred solve is materialised)."""
        core = self.stored()
        core.materialise()
        return core

    def live_slots(self) -> np.ndarray:
        return np.zeros(0, dtype=np.int64) if self.core is None else self.core.live()

    def ids(self) -> np.ndarray:
        return np.asarray([self.id_of_slot[s] for s in self.live_slots()], dtype=np.int64)

    def slot(self, token_id) -> int:
        """The slot of a live token id (typed errors for bad, forgotten or unknown ids)."""
        tid = check_token_id(token_id)
        if tid in self.forgotten:
            raise UnknownTokenError(f"token {tid} was already forgotten")
        if tid not in self.slot_of:
            raise UnknownTokenError(f"token {tid} is not in the gate (live ids: {self.n})")
        return self.slot_of[tid]

    def keys_of(self, slots) -> np.ndarray:
        return self.stored().X[slots].copy()

    def scores(self, P: np.ndarray) -> np.ndarray:
        """``2 sum_i a_i k(p, x_i) - rho`` over the support, (m,) for probes P (m, d)."""
        core = self.stored()
        slots = self.live_slots()
        sup = slots[core.alpha[slots] != 0.0]
        return 2.0 * rbf_kernel(P, core.X[sup], self.sigma) @ core.alpha[sup] - core.rho

    def alpha(self) -> np.ndarray:
        slots = self.live_slots()
        if not self.solved:
            return np.full(slots.size, 1.0 / max(slots.size, 1)) if slots.size else np.zeros(0)
        return self.stored().alpha[slots].copy()

    # ------------------------------------------------------------------ changing
    def append(self, A: np.ndarray) -> tuple[MaintainedSVDD, np.ndarray, np.ndarray]:
        """Store keys (the solver is created deferred with the first ones); returns the solver,
        their slots and their new token ids."""
        if self.core is None:
            self.core = MaintainedSVDD(self.C, self.sigma, A.shape[1], self.refactor_every, deferred=True)
        slots = self.core.append(A)
        new_ids = np.arange(self.next_id, self.next_id + A.shape[0], dtype=np.int64)
        self.next_id += A.shape[0]
        ids = new_ids.tolist()
        self.slot_of.update(zip(ids, slots.tolist()))
        self.id_of_slot.extend(ids)
        return self.core, slots, new_ids

    def drop(self, tid: int) -> None:
        """A deletion of ``tid`` completed: the id is no longer live and never comes back."""
        self._dropped.append((tid, self.slot_of.pop(tid)))
        self.forgotten.add(tid)

    def evict(self, slots: np.ndarray) -> list[int]:
        """Evict reserve slots (alpha = 0: no coefficient changes); returns their ids."""
        core = self.stored()
        evicted = [self.id_of_slot[s] for s in slots]
        core.status[slots] = DEAD
        core.alpha[slots] = 0.0
        for i in evicted:
            del self.slot_of[i]
        return evicted

    def compact(self) -> None:
        """Drop dead slots once they outnumber the live ones (and 64): ids keep their meaning."""
        core = self.core
        if core is None:
            return
        dead = core.n_slots - self.n
        if dead > 64 and dead > self.n:
            old_to_new = core.compact()
            new_ids = [-1] * core.n_slots
            for old, new in enumerate(old_to_new.tolist()):
                if new >= 0:
                    new_ids[new] = self.id_of_slot[old]
            self.id_of_slot = new_ids
            self.slot_of = {i: s for s, i in enumerate(new_ids)}
            self._dropped.clear()  # no rollback spans a compaction

    def save(self) -> tuple:
        """Everything an operation may change, for :meth:`rollback` (O(n) arrays, no id copies)."""
        snap = self.core.snapshot() if self.core is not None else None
        return (self.core, snap, len(self.id_of_slot), self.next_id, len(self._dropped), self.exact.mark(),
                len(self.cold_solve_log))

    def rollback(self, saved: tuple) -> None:
        """Undo everything since :meth:`save` (a solver created since is discarded)."""
        core, snap, n_ids, self.next_id, n_dropped, mark, n_cold = saved
        if core is not None:
            core.restore(snap)
        self.core = core
        for i in self.id_of_slot[n_ids:]:
            self.slot_of.pop(i, None)
        del self.id_of_slot[n_ids:]
        for tid, slot in self._dropped[n_dropped:]:
            self.slot_of[tid] = slot
            self.forgotten.discard(tid)
        del self._dropped[n_dropped:]
        self.exact.reset(mark)
        del self.cold_solve_log[n_cold:]

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """Implementation of :meth:`sv_core.Gate.to_state` (see its docstring)."""
        slots = self.live_slots()
        core = self.core
        return {
            "C": self.C,
            "sigma": self.sigma,
            "refactor_every": self.refactor_every,
            "keys": core.X[slots].copy() if core is not None else np.zeros((0, 0)),
            "ids": self.ids(),
            "alpha": core.alpha[slots].copy() if core is not None else np.zeros(0),
            "status": core.status[slots].copy() if core is not None else np.zeros(0, np.int8),
            "margin_ids": np.asarray([self.id_of_slot[s] for s in core.S], dtype=np.int64)
            if core is not None else np.zeros(0, np.int64),
            "rho": float(core.rho) if core is not None else 0.0,
            "solved": bool(core.solved) if core is not None else False,
            "next_id": self.next_id,
            "forgotten": np.asarray(sorted(self.forgotten), dtype=np.int64),
            "fallbacks": int(self.exact.fallbacks),
        }

    @classmethod
    def from_dict(cls, state: dict) -> GateState:
        """Implementation of :meth:`sv_core.Gate.from_state` (see its docstring): the maintained
        state is built here (eagerly), so a solved state is checked against its KKT residual."""
        try:
            st = load_state(state, warmup_size)
        except (InvalidKeysError, InvalidParameterError) as exc:
            raise InvalidStateError(f"invalid gate state: {exc}") from exc
        g = cls(st["C"], st["sigma"], st["refactor_every"])
        g.next_id = st["next_id"]
        g.forgotten = set(st["forgotten"])
        g.exact.fallbacks = st["fallbacks"]
        keys, ids = st["keys"], st["ids"]
        if keys.shape[1]:
            g.core = MaintainedSVDD(g.C, g.sigma, keys.shape[1], g.refactor_every)
        if keys.shape[0] == 0:
            return g
        core = g.core
        assert core is not None
        try:
            slots = core.append(keys)  # the kernel is built and checked finite
        except InvalidKeysError as exc:
            raise InvalidStateError(f"invalid gate state: {exc}") from exc
        core.alpha[slots] = st["alpha"]
        core.status[slots] = st["status"]
        core.rho = st["rho"]
        core.solved = st["solved"]
        g.id_of_slot = [int(i) for i in ids]
        g.slot_of = {int(i): s for s, i in enumerate(ids)}
        core.S = [g.slot_of[int(i)] for i in st["margin_ids"]]
        if core.solved:
            try:
                if core.S:
                    core.refactor()
            except PathError as exc:
                raise InvalidStateError(f"invalid gate state: {exc}") from exc
            core.recompute_g()
            v = core.kkt_residual()["max"]
            if not v <= STATE_KKT_TOL:
                raise InvalidStateError(
                    f"invalid gate state: KKT residual {v:.3g} > {STATE_KKT_TOL:g} (alpha, rho or "
                    "partition do not solve the fixed-C problem for these keys, C and sigma)"
                )
        return g

    @classmethod
    def from_solution(cls, A: np.ndarray, a: np.ndarray, C: float, sigma: float,
                      refactor_every: int) -> GateState | None:
        """The solved state of :meth:`sv_core.Gate.from_solution` (see its docstring) for n >=
        warm-up keys ``A`` and a finite ``a`` (n,); None when ``a`` does not solve the problem
        to the guard (the caller then solves by the maintained path)."""
        n = A.shape[0]
        if n * C < 1.0 - 1e-12:
            raise InfeasibleError(f"n*C = {n * C:.6g} < 1: the fixed-C problem is infeasible")
        core = MaintainedSVDD(C, sigma, A.shape[1], refactor_every)
        slots = core.append(A)  # the kernel is built and checked finite
        a = np.clip(a, 0.0, C)
        status = np.where(a <= 0.0, RESERVE, np.where(a >= C, ERROR, MARGIN)).astype(np.int8)
        a, status = consolidate_repeats(A, a, status, C)
        f = 2.0 * (core.K[:n, :n] @ a)  # a dense mat-vec: no (n, |support|) copy
        mar = status == MARGIN
        rho = float(np.mean(core.kd[:n][mar] - f[mar])) if mar.any() else 0.0
        try:
            with single_thread(n):
                core.load_solution(slots, a, status, rho)
                core.polish()
                core.recompute_g()
            ok = core.guard_residual() <= KKT_GUARD
        except PathError:
            ok = False
        if not ok:
            return None
        core.defer()  # checked: held as a first solve is, the kernel rebuilt by the first C&P step
        g = cls(C, sigma, refactor_every)
        g.core = core
        g.next_id = n
        g.id_of_slot = list(range(n))
        g.slot_of = {i: i for i in range(n)}
        return g
