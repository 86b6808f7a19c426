"""The public support-vector gate: stable token ids, validation, certificates and receipts.

>>> from sv_core import Gate, calibrate_C
>>> g = Gate(C=calibrate_C(nu=0.4, n0=20), sigma=2.0)
>>> ids = g.admit(np.random.default_rng(0).normal(size=(20, 3)))
>>> receipt = g.forget(ids[0], verify=True)

Every public method of :class:`Gate` is here; the state behind it is one
:class:`sv_core._gate_state.GateState` (the maintained solver, token ids, the exact-completion
record), and the deletion work is :mod:`sv_core._gate_forget`.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from sv_core import _gate_forget

# the guard/fallback constants and STATE_KKT_TOL are re-exported from here for callers
from sv_core._gate_exact import JITTER_SCALE, KKT_GUARD, TIGHTEN_AT, VERIFY_KKT, VERIFY_SCORE_TOL  # noqa: F401
from sv_core._gate_state import STATE_KKT_TOL, GateState  # noqa: F401
from sv_core.calibrate import warmup_size
from sv_core.certified_core import load_certified
from sv_core.errors import GateError, InvalidKeysError, InvalidParameterError, PathError, UnknownTokenError
from sv_core.kernels import rbf_kernel
from sv_core.receipts import Certificate, Receipt
from sv_core.solver import ERROR, MARGIN, RESERVE, STATUS_NAMES, MaintainedSVDD
from sv_core.validation import as_keys, check_params, check_token_id

#: first-solve methods of :class:`Gate` (``cold_solve``)
COLD_SOLVES = ("auto", "certified", "path")
#: with ``cold_solve="auto"`` a first solve of at least this many keys uses the certified solve
#: (below it settling keys one by one is as fast; measured by ``python -m sv_core.bench.solve --gate``)
CERTIFIED_MIN_KEYS = 16


class WarmupError(GateError):
    """The gate has fewer than ``ceil(1/C) + 2`` keys: it is not solved and has no gate score."""


class Gate:
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
        solve (:func:`sv_core.solve`: SMO, margin system, KKT on the recomputed gradient), loaded
        *deferred* (the kernel, bordered inverse and gradient are built by the first C&P step),
        or by settling the keys one by one on the C&P path. "auto" uses the certified solve from
        ``CERTIFIED_MIN_KEYS`` keys. If the certified solve cannot certify, the path is taken
        (``cold_solve_log`` says so).

    Attributes
    ----------
    ids : (n,) int array, live token ids in admission order.
    alpha : (n,) float array, coefficients aligned with ``ids`` (uniform ``1/n`` in warm-up).
    rho : float, offset (``nan`` in warm-up).
    fallbacks, fallback_log, tightenings, cold_solve_log : how operations completed.
    """

    def __init__(self, C: float, sigma: float, refactor_every: int = 64, cold_solve: str = "auto"):
        self.C, self.sigma = check_params(C, sigma)
        self.refactor_every = int(refactor_every)
        if cold_solve not in COLD_SOLVES:
            raise InvalidParameterError(f"cold_solve must be one of {COLD_SOLVES}, got {cold_solve!r}")
        self.cold_solve = cold_solve
        self._state = GateState(self.C, self.sigma, self.refactor_every)

    # ------------------------------------------------------------------ properties
    @property
    def fallbacks(self) -> int:
        """Operations completed by the exact fallback (fresh refit, maintained state rebuilt)."""
        return self._state.exact.fallbacks

    @property
    def fallback_log(self) -> list[dict]:
        """One ``{"op", "reason"}`` dict per fallback taken, in order."""
        return self._state.exact.log

    @property
    def tightenings(self) -> int:
        """Operations whose end state was tightened by a warm SMO polish."""
        return self._state.exact.tightenings

    @property
    def cold_solve_log(self) -> list[dict]:
        """One ``{"method", "keys", "kkt_violation", "fallback_reason"}`` dict per first solve."""
        return self._state.cold_solve_log

    @property
    def _core(self) -> MaintainedSVDD | None:
        """The solver as stored (None before the first key; possibly deferred)."""
        return self._state.core

    @property
    def _solver(self) -> MaintainedSVDD:
        """The maintained solver with everything a C&P step needs built (diagnostics)."""
        return self._state.solver()

    @property
    def dim(self) -> int | None:
        return self._state.dim

    @property
    def n(self) -> int:
        return self._state.n

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
        return self._state.solved

    @property
    def ids(self) -> np.ndarray:
        return self._state.ids()

    @property
    def keys(self) -> np.ndarray:
        """(n, d) live keys aligned with ``ids``."""
        if self._state.core is None:
            return np.zeros((0, 0))
        return self._state.keys_of(self._state.live_slots())

    @property
    def alpha(self) -> np.ndarray:
        return self._state.alpha()

    @property
    def rho(self) -> float:
        return float(self._state.stored().rho) if self.gated else float("nan")

    def partition(self) -> dict[str, list[int]]:
        """Token ids of the margin (0<a<C), error (a=C) and reserve (a=0) sets."""
        out: dict[str, list[int]] = {"margin": [], "error": [], "reserve": []}
        if not self.gated:
            return out
        st = self._state
        slots = st.live_slots()
        status = st.stored().status[slots]
        for code in (MARGIN, ERROR, RESERVE):
            out[STATUS_NAMES[code]] = [st.id_of_slot[s] for s in slots[status == code].tolist()]
        return out

    def status_of(self, token_id: int) -> str:
        """``"margin" | "error" | "reserve" | "warmup"`` for a live id."""
        slot = self._state.slot(token_id)
        return STATUS_NAMES[int(self._state.stored().status[slot])] if self.gated else "warmup"

    def support_ids(self) -> np.ndarray:
        p = self.partition()
        return np.asarray(sorted(p["margin"] + p["error"]), dtype=np.int64)

    # ------------------------------------------------------------------ admit
    def admit(self, X) -> np.ndarray:
        """Admit one key ``(d,)`` or many ``(n, d)`` by C&P increments.

        Returns the new stable token ids, shape (n,). Below ``warmup_size`` keys the keys are
        stored unsolved; the first admission that reaches it solves the gate (``cold_solve``):
        by the certified solve, loaded deferred (memory O(n d) here until a C&P step), or by
        settling the keys one by one from the feasible start ``alpha = 1/n``. If the maintained
        path cannot complete (or its KKT residual guard trips) the admission completes by the
        exact fallback (``fallbacks`` is incremented). On any error the gate is unchanged.
        """
        A = as_keys(X, self.dim)
        if A.shape[0] == 0:
            return np.zeros(0, dtype=np.int64)
        st = self._state
        if st.solved:
            st.solver()  # admitting into a solved gate is a C&P step: build what it needs
        saved = st.save()
        try:
            core, slots, new_ids = st.append(A)
            if not core.solved:
                if st.n >= self.warmup_size:
                    self._first_solve(core)
            else:
                def step() -> int:
                    ev = 0
                    for s in slots.tolist():
                        ev += core.admit_slot(s)
                    core.finish()
                    return ev

                st.exact.guarded(core, "admit", step)
        except BaseException:
            st.rollback(saved)
            raise
        return new_ids

    def _first_solve(self, core: MaintainedSVDD) -> None:
        """The certified solve loaded deferred, accepted when its certificate (KKT on the exactly
        recomputed gradient) is within ``TIGHTEN_AT``, else the maintained state is built and its
        guard decides (tightening or the exact fallback); keys settled one by one on the path
        when ``cold_solve`` asks for it or the solve cannot certify."""
        n = self.n
        entry: dict = {"method": "path", "keys": n, "kkt_violation": None, "fallback_reason": None}
        log, exact = self._state.cold_solve_log, self._state.exact
        if self.cold_solve == "certified" or (self.cold_solve == "auto" and n >= CERTIFIED_MIN_KEYS):
            try:
                cert = load_certified(core)
            except PathError as exc:  # not certified (core untouched): settle one by one instead
                entry["fallback_reason"] = str(exc)
            else:
                entry.update(method="certified", kkt_violation=cert.kkt_violation)
                log.append(entry)
                if not cert.kkt_violation <= TIGHTEN_AT:
                    exact.guarded(core, "initialise", lambda: 0)
                return
        log.append(entry)
        exact.guarded(core, "initialise", core.initialise)

    # ------------------------------------------------------------------ scores and readout
    def score(self, P) -> np.ndarray:
        """Gate score ``s(x) = 2 sum_i a_i k(x, x_i) - rho`` for probes P (m, d) -> (m,)."""
        if not self.gated:
            raise WarmupError(
                f"the gate has {self.n} keys (< ceil(1/C)+2 = {self.warmup_size}); it is not solved "
                "and has no gate score"
            )
        return self._state.scores(as_keys(P, self.dim))

    def weights(self, Q) -> np.ndarray:
        """Normalised readout weights ``a_i k(q, x_i) / sum_j a_j k(q, x_j)``, (m, n) aligned with ids."""
        Q = as_keys(Q, self.dim)
        if self.n == 0:
            raise GateError("the gate holds no keys")
        W = rbf_kernel(Q, self.keys, self.sigma) * self.alpha[None, :]
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

    def kkt_residual(self) -> dict:
        """KKT violations recomputed from scratch: sum, box, margin/error/reserve gradients, inverse."""
        if not self.gated:
            raise WarmupError("the gate is in warm-up; no KKT state")
        return self._state.stored().kkt_residual()

    # ------------------------------------------------------------------ eviction and deletion
    def evict_reserve(self, probes=None, max_evict: int | None = None) -> Certificate:
        """Evict certified-inert (alpha = 0) keys without re-solving (Proposition 1).

        The certificate lists the evicted ids and the *measured* max change of gate score and
        readout weights on the probes (default: every key before eviction). Nothing is built:
        no coefficient changes. In warm-up nothing is evicted and the certificate says
        ``issued=False``.
        """
        if not self.gated:
            return Certificate(issued=False, reason="warm-up: the gate is not solved", evicted=[],
                               n_before=self.n, n_after=self.n, C=self.C, sigma=self.sigma)
        st = self._state
        slots = st.live_slots()
        res = slots[st.stored().status[slots] == RESERVE]
        if max_evict is not None:
            res = res[: max(int(max_evict), 0)]
        P = self.keys if probes is None else as_keys(probes, self.dim)
        s_before, W_before = self.score(P), self.weights(P)
        n_before = self.n
        evicted = st.evict(res)
        st.compact()
        s_after, W_after = self.score(P), self.weights(P)
        return Certificate(
            issued=True, reason="reserve keys (alpha = 0) of the current solved fixed-C state",
            evicted=[int(i) for i in evicted], n_before=n_before, n_after=self.n, C=self.C, sigma=self.sigma,
            max_abs_score_change=float(np.abs(s_after - s_before).max(initial=0.0)),
            max_abs_weight_change=float(np.abs(W_after - W_before[:, ~np.isin(slots, res)]).max(initial=0.0)),
            n_probes=int(P.shape[0]),
        )

    def _forget_slot(self, tid: int, slot: int) -> Receipt:
        """Delete one live token: C&P decrement under the guard, receipt (no compaction)."""
        return _gate_forget.forget_slot(self._state, tid, slot)

    def forget(self, token_id: int, verify: bool = False, probe_seed: int = 0) -> Receipt:
        """Delete a token by the C&P decremental path; returns a JSON-serialisable receipt.

        Preflight (no state change on failure): the id must be a live integer id, and
        ``(n-1) C >= 1``. If the maintained path cannot complete, or its KKT residual guard trips,
        the deletion completes by the exact fallback (fresh refit of the retained keys, state
        rebuilt from it) and ``receipt.fallback`` is True. ``verify=True`` compares the result
        with an independent :func:`refit` on retained, removed and jittered probes; if that
        comparison cannot be made or fails its tolerances after the fallback, a
        :class:`VerificationError` is raised and the gate is restored bit-for-bit.
        """
        st = self._state
        slot = st.slot(token_id)
        tid = int(token_id)
        _gate_forget.preflight(st, 1, f"token {tid}")
        removed_key = st.keys_of([slot]) if verify else None
        saved = st.save() if verify else None  # (the deletion itself restores the solver on error)
        receipt = self._forget_slot(tid, slot)
        if saved is not None and self.gated:
            try:
                _gate_forget.verify_or_fallback(st, receipt, removed_key, probe_seed)
            except BaseException:
                st.rollback(saved)
                raise
        st.compact()
        return receipt

    def forget_many(self, token_ids: Iterable[int], verify: bool = False) -> list[Receipt]:
        """Forget several tokens; all-or-nothing (the gate is restored if any deletion fails).

        ``verify=True`` compares the state after the last deletion with one independent same-C
        :func:`refit` of the retained keys (probes: retained, removed and jittered keys). That one
        comparison verifies every deletion of the call, so each receipt carries it, with
        ``verification["batch_tokens"]`` naming the tokens it covers; the intermediate states
        (after some but not all of the deletions) are not refit. ``fallback`` is set on the last
        receipt when the verification took the exact fallback.
        """
        try:
            token_ids = list(token_ids)
        except TypeError as exc:
            raise UnknownTokenError(f"token ids must be an iterable of integers, got {token_ids!r}") from exc
        tids = [check_token_id(t) for t in token_ids]
        if len(set(tids)) != len(tids):
            raise UnknownTokenError("token ids to forget contain repeats")
        if not tids:
            return []
        st = self._state
        slots = [st.slot(t) for t in tids]
        _gate_forget.preflight(st, len(tids), f"{len(tids)} tokens")
        removed = st.keys_of(slots) if verify else None
        saved = st.save()
        try:
            out = [self._forget_slot(t, s) for t, s in zip(tids, slots)]
            if verify and self.gated:
                _gate_forget.verify_or_fallback(st, out[-1], removed, 0)
                ver = out[-1].verification or {}
                for r in out:
                    r.verification = {**ver, "batch_tokens": list(tids)}
        except BaseException:
            st.rollback(saved)
            raise
        st.compact()
        return out

    def verify_against_refit(self, removed=None, seed: int = 0) -> dict:
        """Max |gate score difference| between this state and an independent :func:`refit`
        (retained, jittered and ``removed`` probes), alpha deviation, partition match, KKT."""
        return _gate_forget.refit_comparison(self._state, removed, seed)

    # ------------------------------------------------------------------ serialisation
    def to_state(self) -> dict:
        """Arrays and scalars that reproduce this gate exactly (``np.savez``-able)."""
        return self._state.to_dict()

    @classmethod
    def from_state(cls, state: dict) -> Gate:
        """Rebuild a gate from :meth:`to_state`, validating everything first.

        Checks shapes, dtypes, finiteness, the C and sigma ranges, unique integer ids disjoint
        from the forgotten ones, the margin set, and for a solved state ``sum(alpha) = 1``, the
        box, the partition and the KKT residual (``<= STATE_KKT_TOL``, recomputed from scratch).
        Raises :class:`InvalidStateError` (one line saying what is wrong).
        """
        st = GateState.from_dict(state)
        g = cls(st.C, st.sigma, st.refactor_every)
        g._state = st
        return g

    @classmethod
    def from_solution(cls, X, alpha, C: float, sigma: float, refactor_every: int = 64) -> Gate:
        """A solved gate over keys ``X`` from a given solution ``alpha`` of the same fixed-C
        problem (e.g. the independent :func:`refit`'s), without solving it again.

        The partition is read off ``alpha`` (0 reserve, C error, otherwise margin; bit-identical
        keys consolidated), the margin system is re-solved on it (``rho`` and the margin
        coefficients exact for these keys) and the KKT guard is checked; if ``alpha`` does not
        solve the problem to the guard (``<= 1e-9``), the gate is solved by the maintained path
        instead. Token ids are ``0..n-1`` in row order. Below the warm-up size the keys are just
        admitted (nothing is solved). The checked state is held deferred, as a first solve is
        (its kernel and bordered inverse are built again by the first C&P step).
        """
        g = cls(C, sigma, refactor_every)
        A = as_keys(X)
        a = np.asarray(alpha, dtype=np.float64).reshape(-1)
        if a.shape != (A.shape[0],) or not np.isfinite(a).all():
            raise InvalidKeysError(f"alpha must be a finite array of shape ({A.shape[0]},), got {a.shape}")
        st = None if A.shape[0] < g.warmup_size else GateState.from_solution(A, a, g.C, g.sigma, g.refactor_every)
        if st is None:
            g.admit(A)
        else:
            g._state = st
        return g

    def __repr__(self) -> str:
        p = {k: len(v) for k, v in self.partition().items()}
        return f"Gate(C={self.C:.6g}, sigma={self.sigma:g}, n={self.n}, gated={self.gated}, partition={p})"
