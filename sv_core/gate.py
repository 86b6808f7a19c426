"""The public support-vector gate: stable token ids, validation, certificates and receipts.

>>> from sv_core import Gate, calibrate_C
>>> g = Gate(C=calibrate_C(nu=0.4, n0=20), sigma=2.0)
>>> ids = g.admit(np.random.default_rng(0).normal(size=(20, 3)))
>>> receipt = g.forget(ids[0], verify=True)
"""
from __future__ import annotations

import numpy as np

from sv_core import _gate_state

# the guard/fallback constants and STATE_KKT_TOL are re-exported from here for callers
from sv_core._gate_exact import (  # noqa: F401
    JITTER_SCALE,
    KKT_GUARD,
    TIGHTEN_AT,
    VERIFY_KKT,
    VERIFY_SCORE_TOL,
    ExactCompletionMixin,
)
from sv_core._gate_forget import ForgetMixin
from sv_core._gate_state import STATE_KKT_TOL  # noqa: F401
from sv_core.calibrate import warmup_size
from sv_core.certified_core import load_certified
from sv_core.errors import (
    GateError,
    InvalidKeysError,
    InvalidParameterError,  # noqa: F401  (re-exported for callers that import it from here)
    PathError,
)
from sv_core.kernels import rbf_kernel
from sv_core.receipts import Certificate
from sv_core.solver import DEAD, ERROR, MARGIN, RESERVE, MaintainedSVDD
from sv_core.validation import as_keys, check_params

_check_params = check_params  # backward-compatible private alias


#: first-solve methods of :class:`Gate` (``cold_solve``)
COLD_SOLVES = ("auto", "certified", "path")
#: with ``cold_solve="auto"`` a first solve of at least this many keys uses the certified solve
#: (below it settling keys one by one is as fast; measured by ``python -m sv_core.bench.solve --gate``)
CERTIFIED_MIN_KEYS = 16


class WarmupError(GateError):
    """The gate has fewer than ``ceil(1/C) + 2`` keys: it is not solved and has no gate score."""


class Gate(ForgetMixin, ExactCompletionMixin):
    """Fixed-C SVDD gate with an exact maintained fp64 C&P solver.

    Parameters
    ----------
    C : float in (0, 1]
        The box, fixed for the gate's lifetime (see :func:`sv_core.calibrate_C`).
    sigma : float > 0
        RBF bandwidth, ``k(a, b) = exp(-||a - b||^2 / sigma^2)``.
    refactor_every : int
        Low-rank updates between full refactorisations of the bordered inverse.
    cold_solve : "auto" | "certified" | "path"
        How the first solve (the admission that reaches ``warmup_size``) is done: by the certified
        solve (:func:`sv_core.solve`: SMO, margin system, KKT on the recomputed gradient) and the
        maintained state loaded from it, or by settling the keys one by one on the C&P path.
        "auto" uses the certified solve from ``CERTIFIED_MIN_KEYS`` keys. If the certified solve
        cannot certify, the path is taken (``cold_solve_log`` says so).

    Attributes
    ----------
    ids : (n,) int array, live token ids in admission order.
    alpha : (n,) float array, coefficients aligned with ``ids`` (uniform ``1/n`` in warm-up).
    rho : float, offset (``nan`` in warm-up).
    """

    def __init__(self, C: float, sigma: float, refactor_every: int = 64, cold_solve: str = "auto"):
        self.C, self.sigma = _check_params(C, sigma)
        self.refactor_every = int(refactor_every)
        if cold_solve not in COLD_SOLVES:
            raise InvalidParameterError(f"cold_solve must be one of {COLD_SOLVES}, got {cold_solve!r}")
        self.cold_solve = cold_solve
        #: one ``{"method", "keys", "kkt_violation", "fallback_reason"}`` dict per first solve
        self.cold_solve_log: list[dict] = []
        self._core: MaintainedSVDD | None = None
        self._slot_of: dict[int, int] = {}
        self._id_of_slot: list[int] = []
        self._next_id = 0
        self._forgotten: set[int] = set()
        #: operations completed by the exact fallback (fresh refit, maintained state rebuilt)
        self.fallbacks = 0
        #: one ``{"op", "reason"}`` dict per fallback taken, in order
        self.fallback_log: list[dict] = []
        #: operations whose end state was tightened by a warm SMO polish (see ``_tighten``)
        self.tightenings = 0

    # ------------------------------------------------------------------ properties
    @property
    def _solver(self) -> MaintainedSVDD:
        """The maintained solver (exists once a key was admitted), with everything a C&P step
        needs built (a deferred first solve is materialised here)."""
        core = self._core
        if core is None:
            raise GateError("the gate holds no keys")
        core.materialise()
        return core

    @property
    def _stored(self) -> MaintainedSVDD:
        """The solver as stored, possibly deferred: keys, coefficients, statuses and rho (what
        scores, readout, partition, eviction and serialisation read; nothing is built)."""
        core = self._core
        if core is None:
            raise GateError("the gate holds no keys")
        return core

    @property
    def dim(self) -> int | None:
        return None if self._core is None else self._core.dim

    @property
    def n(self) -> int:
        return len(self._slot_of)

    @property
    def warmup_size(self) -> int:
        """Keys needed before the gate is solved: ``ceil(1/C) + 2``."""
        return warmup_size(self.C)

    @property
    def gated(self) -> bool:
        """True once the gate has been solved.

        The gate is first solved when it holds ``warmup_size = ceil(1/C) + 2`` keys; from then on
        the maintained state stays solved (deletions keep ``n C >= 1`` by preflight, and reserve
        eviction keeps the support, which carries all the mass).
        """
        return self._core is not None and self._core.solved

    def _live_slots(self) -> np.ndarray:
        if self._core is None:
            return np.zeros(0, dtype=np.int64)
        return self._core.live()

    @property
    def ids(self) -> np.ndarray:
        slots = self._live_slots()
        return np.asarray([self._id_of_slot[s] for s in slots], dtype=np.int64)

    @property
    def keys(self) -> np.ndarray:
        """(n, d) live keys aligned with ``ids``."""
        if self._core is None:
            return np.zeros((0, 0))
        return self._stored.X[self._live_slots()].copy()

    @property
    def alpha(self) -> np.ndarray:
        slots = self._live_slots()
        if not self.gated:
            return np.full(slots.size, 1.0 / max(slots.size, 1)) if slots.size else np.zeros(0)
        return self._stored.alpha[slots].copy()

    @property
    def rho(self) -> float:
        return float(self._stored.rho) if self.gated else float("nan")

    def partition(self) -> dict[str, list[int]]:
        """Token ids of the margin (0<a<C), error (a=C) and reserve (a=0) sets."""
        out: dict[str, list[int]] = {"margin": [], "error": [], "reserve": []}
        if not self.gated:
            return out
        names = {MARGIN: "margin", ERROR: "error", RESERVE: "reserve"}
        for s in self._live_slots():
            out[names[int(self._stored.status[s])]].append(self._id_of_slot[s])
        return out

    def status_of(self, token_id: int) -> str:
        """``"margin" | "error" | "reserve" | "warmup"`` for a live id."""
        slot = self._slot(token_id)
        if not self.gated:
            return "warmup"
        return {MARGIN: "margin", ERROR: "error", RESERVE: "reserve"}[int(self._stored.status[slot])]

    def support_ids(self) -> np.ndarray:
        p = self.partition()
        return np.asarray(sorted(p["margin"] + p["error"]), dtype=np.int64)

    # ------------------------------------------------------------------ admit
    def admit(self, X) -> np.ndarray:
        """Admit one key ``(d,)`` or many ``(n, d)`` by C&P increments.

        Returns the new stable token ids, shape (n,). Below ``warmup_size`` keys the keys are
        stored unsolved; the first admission that reaches it solves the gate (``cold_solve``):
        by the certified solve, whose solution is loaded *deferred* (the kernel, bordered
        inverse and gradient are built when a C&P step first needs them: memory O(n d) until
        then), or by settling the keys one by one from the feasible start ``alpha = 1/n``. If
        the maintained path cannot complete (or its KKT residual guard trips) the admission
        completes by the exact fallback (``fallbacks`` is incremented). On any error the gate is
        unchanged.
        """
        A = as_keys(X, self.dim)
        if A.shape[0] == 0:
            return np.zeros(0, dtype=np.int64)
        if self._core is None:
            core = MaintainedSVDD(self.C, self.sigma, A.shape[1], self.refactor_every, deferred=True)
        else:
            core = self._core
            if core.solved:
                core.materialise()  # admitting into a solved gate is a C&P step
        snap = core.snapshot()
        ids_before = (len(self._id_of_slot), self._next_id, self.fallbacks, len(self.fallback_log),
                      len(self.cold_solve_log))
        new_ids = np.arange(self._next_id, self._next_id + A.shape[0], dtype=np.int64)
        try:
            slots = core.append(A)
            self._core = core
            self._next_id += A.shape[0]
            ids_list = new_ids.tolist()
            self._slot_of.update(zip(ids_list, slots.tolist()))
            self._id_of_slot.extend(ids_list)
            if not core.solved:
                if self.n >= self.warmup_size:
                    self._first_solve(core)
            else:
                def step():
                    ev = 0
                    for s in slots:
                        ev += core.admit_slot(int(s))
                    core.finish()
                    return ev

                self._guarded("admit", step)
        except BaseException:
            core.restore(snap)
            n_ids, self._next_id, self.fallbacks, n_log, n_cold = ids_before
            for i in new_ids:
                self._slot_of.pop(int(i), None)
            del self._id_of_slot[n_ids:]
            del self.fallback_log[n_log:]
            del self.cold_solve_log[n_cold:]
            if self._core is core and snap["n_slots"] == 0 and not self._slot_of:
                self._core = None if ids_before[0] == 0 else core
            raise
        return new_ids

    def _first_solve(self, core: MaintainedSVDD) -> None:
        """The first solve (see ``cold_solve``): the certified solve loaded deferred, accepted
        when its certificate (KKT on the exactly recomputed gradient) is within ``TIGHTEN_AT``;
        otherwise the maintained state is built and its guard decides (tightening or the exact
        fallback), or, when the solve cannot certify, the keys are settled one by one."""
        n = self.n
        entry: dict = {"method": "path", "keys": n, "kkt_violation": None, "fallback_reason": None}
        if self.cold_solve == "certified" or (self.cold_solve == "auto" and n >= CERTIFIED_MIN_KEYS):
            try:
                cert = load_certified(core)
            except PathError as exc:  # not certified (core untouched): settle one by one instead
                entry["fallback_reason"] = str(exc)
            else:
                entry.update(method="certified", kkt_violation=cert.kkt_violation)
                self.cold_solve_log.append(entry)
                if not cert.kkt_violation <= TIGHTEN_AT:
                    core.materialise()
                    self._guarded("initialise", lambda: 0)
                return
        self.cold_solve_log.append(entry)
        core.materialise()
        self._guarded("initialise", core.initialise)

    # ------------------------------------------------------------------ scores and readout
    def score(self, P) -> np.ndarray:
        """Gate score ``s(x) = 2 sum_i a_i k(x, x_i) - rho`` for probes P (m, d) -> (m,)."""
        if not self.gated:
            raise WarmupError(
                f"the gate has {self.n} keys (< ceil(1/C)+2 = {self.warmup_size}); it is not solved "
                "and has no gate score"
            )
        P = as_keys(P, self.dim)
        core = self._stored
        slots = self._live_slots()
        sup = slots[core.alpha[slots] != 0.0]
        return 2.0 * rbf_kernel(P, core.X[sup], self.sigma) @ core.alpha[sup] - core.rho

    def weights(self, Q) -> np.ndarray:
        """Normalised readout weights ``a_i k(q, x_i) / sum_j a_j k(q, x_j)``, (m, n) aligned with ids."""
        Q = as_keys(Q, self.dim)
        slots = self._live_slots()
        if slots.size == 0:
            raise GateError("the gate holds no keys")
        W = rbf_kernel(Q, self._stored.X[slots], self.sigma) * self.alpha[None, :]
        den = W.sum(axis=1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            return W / den

    def readout(self, Q, V) -> np.ndarray:
        """Normalised readout ``o(q) = sum a_i k(q,x_i) v_i / sum a_i k(q,x_i)``.

        Q : (m, d) or (d,) queries; V : (n,) or (n, d_v) values aligned with ``ids``.
        Returns (m,) or (m, d_v). Ungated (uniform RBF) in warm-up.
        """
        V = np.asarray(V, dtype=np.float64)
        if V.shape[0] != self.n:
            raise InvalidKeysError(f"V has {V.shape[0]} rows but the gate holds {self.n} keys")
        return self.weights(Q) @ V

    # ------------------------------------------------------------------ eviction
    def evict_reserve(self, probes=None, max_evict: int | None = None) -> Certificate:
        """Evict certified-inert (alpha = 0) keys without re-solving (Proposition 1).

        The certificate
        lists the evicted ids and the *measured* max change of gate score and readout weights on
        the probes (default: every key before eviction). In warm-up nothing is evicted and the
        certificate says ``issued=False``.
        """
        if not self.gated:
            return Certificate(issued=False, reason="warm-up: the gate is not solved", evicted=[],
                               n_before=self.n, n_after=self.n, C=self.C, sigma=self.sigma)
        core = self._stored
        slots = self._live_slots()
        res = slots[core.status[slots] == RESERVE]
        if max_evict is not None:
            res = res[: max(int(max_evict), 0)]
        P = core.X[slots].copy() if probes is None else as_keys(probes, self.dim)
        s_before = self.score(P)
        W_before = self.weights(P)
        keep_cols = ~np.isin(slots, res)
        evicted = [self._id_of_slot[s] for s in res]
        n_before = self.n
        for s in res:
            core.status[s] = DEAD
            core.alpha[s] = 0.0
            del self._slot_of[self._id_of_slot[s]]
        self._maybe_compact()
        s_after = self.score(P)
        W_after = self.weights(P)
        return Certificate(
            issued=True,
            reason="reserve keys (alpha = 0) of the current solved fixed-C state",
            evicted=[int(i) for i in evicted],
            n_before=n_before,
            n_after=self.n,
            C=self.C,
            sigma=self.sigma,
            max_abs_score_change=float(np.abs(s_after - s_before).max(initial=0.0)),
            max_abs_weight_change=float(np.abs(W_after - W_before[:, keep_cols]).max(initial=0.0)),
            n_probes=int(P.shape[0]),
        )

    def kkt_residual(self) -> dict:
        """KKT violations recomputed from scratch: sum, box, margin/error/reserve gradients, inverse."""
        if not self.gated:
            raise WarmupError("the gate is in warm-up; no KKT state")
        return self._stored.kkt_residual()

    def _maybe_compact(self) -> None:
        core = self._stored
        dead = core.n_slots - self.n
        if dead > 64 and dead > self.n:
            old_to_new = core.compact()
            new_ids = [-1] * core.n_slots
            for old, new in enumerate(old_to_new.tolist()):
                if new >= 0:
                    new_ids[new] = self._id_of_slot[old]
            self._id_of_slot = new_ids
            self._slot_of = {i: s for s, i in enumerate(new_ids)}

    # ------------------------------------------------------------------ serialisation (sv_core._gate_state)
    def to_state(self) -> dict:
        """Arrays and scalars that reproduce this gate exactly (``np.savez``-able)."""
        return _gate_state.to_state(self)

    @classmethod
    def from_state(cls, state: dict) -> Gate:
        """Rebuild a gate from :meth:`to_state`, validating everything first.

        Checks shapes, dtypes, finiteness, the C and sigma ranges, unique integer ids disjoint
        from the forgotten ones, the margin set, and for a solved state ``sum(alpha) = 1``, the
        box, the partition and the KKT residual (``<= STATE_KKT_TOL``, recomputed from scratch).
        Raises :class:`InvalidStateError` (one line saying what is wrong).
        """
        return _gate_state.from_state(cls, state)

    @classmethod
    def from_solution(cls, X, alpha, C: float, sigma: float, refactor_every: int = 64) -> Gate:
        """A solved gate over keys ``X`` from a given solution ``alpha`` of the same fixed-C
        problem (e.g. the independent :func:`refit`'s), without solving it again.

        The partition is read off ``alpha`` (0 reserve, C error, otherwise margin; bit-identical
        keys consolidated), the margin system is re-solved on it (``rho`` and the margin
        coefficients exact for these keys) and the KKT guard is checked; if ``alpha`` does not
        solve the problem to the guard (``<= 1e-9``), the gate is solved by the maintained path
        instead. Token ids are ``0..n-1`` in row order. Below the warm-up size the keys are just
        admitted (nothing is solved).
        """
        return _gate_state.from_solution(cls, X, alpha, C, sigma, refactor_every)

    def __repr__(self) -> str:
        p = {k: len(v) for k, v in self.partition().items()}
        return f"Gate(C={self.C:.6g}, sigma={self.sigma:g}, n={self.n}, gated={self.gated}, partition={p})"
