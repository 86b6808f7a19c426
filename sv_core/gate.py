"""The public support-vector gate: stable token ids, validation, certificates and receipts.

>>> from sv_core import Gate, calibrate_C
>>> g = Gate(C=calibrate_C(nu=0.4, n0=20), sigma=2.0)
>>> ids = g.admit(np.random.default_rng(0).normal(size=(20, 3)))
>>> receipt = g.forget(ids[0], verify=True)
"""
from __future__ import annotations

import math
import time
from typing import Iterable

import numpy as np

from .calibrate import warmup_size
from .errors import (
    GateError,
    InfeasibleError,
    InvalidKeysError,
    InvalidParameterError,
    PathError,
    UnknownTokenError,
)
from .kernels import rbf_kernel
from .receipts import Certificate, Receipt
from .solver import DEAD, ERROR, MARGIN, PENDING, RESERVE, MaintainedSVDD

#: probes are jittered with Gaussian noise of this scale in ``verify`` (SPEC §3 deletion audit)
JITTER_SCALE = 0.1


class WarmupError(GateError):
    """The gate has fewer than ``ceil(1/C) + 2`` keys: it is not solved and has no gate score."""


def _check_params(C, sigma) -> tuple[float, float]:
    try:
        C = float(C)
        sigma = float(sigma)
    except (TypeError, ValueError) as exc:
        raise InvalidParameterError(f"C and sigma must be numbers, got C={C!r}, sigma={sigma!r}") from exc
    if not math.isfinite(C) or not (0.0 < C <= 1.0):
        raise InvalidParameterError(f"C must be in (0, 1], got {C!r} (use calibrate_C(nu, n0))")
    if not math.isfinite(sigma) or sigma <= 0.0:
        raise InvalidParameterError(f"sigma must be a finite positive bandwidth, got {sigma!r}")
    return C, sigma


def as_keys(X, dim: int | None = None) -> np.ndarray:
    """Validate keys: finite float array of shape (n, d) (a single (d,) key is promoted)."""
    try:
        A = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidKeysError(f"keys must be numeric, got {type(X).__name__}") from exc
    if A.ndim == 1:
        A = A[None, :]
    if A.ndim != 2 or A.shape[1] == 0:
        raise InvalidKeysError(f"keys must have shape (n, d) or (d,), got {np.shape(X)}")
    if dim is not None and A.shape[1] != dim:
        raise InvalidKeysError(f"keys must have dimension {dim}, got {A.shape[1]}")
    if not np.all(np.isfinite(A)):
        bad = int((~np.isfinite(A)).any(axis=1).sum())
        raise InvalidKeysError(f"{bad} key(s) contain NaN or inf; nothing was admitted")
    return A


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

    Attributes
    ----------
    ids : (n,) int array, live token ids in admission order.
    alpha : (n,) float array, coefficients aligned with ``ids`` (uniform ``1/n`` in warm-up).
    rho : float, offset (``nan`` in warm-up).
    """

    def __init__(self, C: float, sigma: float, refactor_every: int = 64):
        self.C, self.sigma = _check_params(C, sigma)
        self.refactor_every = int(refactor_every)
        self._core: MaintainedSVDD | None = None
        self._slot_of: dict[int, int] = {}
        self._id_of_slot: list[int] = []
        self._next_id = 0
        self._forgotten: set[int] = set()

    # ------------------------------------------------------------------ properties
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
        return self._core.X[self._live_slots()].copy()

    @property
    def alpha(self) -> np.ndarray:
        slots = self._live_slots()
        if not self.gated:
            return np.full(slots.size, 1.0 / max(slots.size, 1)) if slots.size else np.zeros(0)
        return self._core.alpha[slots].copy()

    @property
    def rho(self) -> float:
        return float(self._core.rho) if self.gated else float("nan")

    def partition(self) -> dict[str, list[int]]:
        """Token ids of the margin (0<a<C), error (a=C) and reserve (a=0) sets."""
        out = {"margin": [], "error": [], "reserve": []}
        if not self.gated:
            return out
        names = {MARGIN: "margin", ERROR: "error", RESERVE: "reserve"}
        for s in self._live_slots():
            out[names[int(self._core.status[s])]].append(self._id_of_slot[s])
        return out

    def status_of(self, token_id: int) -> str:
        """``"margin" | "error" | "reserve" | "warmup"`` for a live id."""
        slot = self._slot(token_id)
        if not self.gated:
            return "warmup"
        return {MARGIN: "margin", ERROR: "error", RESERVE: "reserve"}[int(self._core.status[slot])]

    def support_ids(self) -> np.ndarray:
        p = self.partition()
        return np.asarray(sorted(p["margin"] + p["error"]), dtype=np.int64)

    # ------------------------------------------------------------------ admit
    def admit(self, X) -> np.ndarray:
        """Admit one key ``(d,)`` or many ``(n, d)`` by C&P increments.

        Returns the new stable token ids, shape (n,). Below ``warmup_size`` keys the keys are
        stored unsolved; the first admission that reaches it solves the gate from the feasible
        start ``alpha = 1/n`` with the same event loop. On any error the gate is unchanged.
        """
        A = as_keys(X, self.dim)
        if self._core is None:
            self._core = MaintainedSVDD(self.C, self.sigma, A.shape[1], self.refactor_every)
        core = self._core
        snap = core.snapshot()
        ids_before = (dict(self._slot_of), list(self._id_of_slot), self._next_id)
        try:
            slots = core.append(A)
            new_ids = np.arange(self._next_id, self._next_id + A.shape[0], dtype=np.int64)
            self._next_id += A.shape[0]
            for s, i in zip(slots, new_ids):
                self._slot_of[int(i)] = int(s)
                self._id_of_slot.append(int(i))
            if not core.solved:
                if self.n >= self.warmup_size:
                    core.initialise()
            else:
                for s in slots:
                    core.admit_slot(int(s))
                core.polish()
        except BaseException:
            core.restore(snap)
            self._slot_of, self._id_of_slot, self._next_id = ids_before
            raise
        return new_ids

    # ------------------------------------------------------------------ scores and readout
    def score(self, P) -> np.ndarray:
        """Gate score ``s(x) = 2 sum_i a_i k(x, x_i) - rho`` for probes P (m, d) -> (m,)."""
        if not self.gated:
            raise WarmupError(
                f"the gate has {self.n} keys (< ceil(1/C)+2 = {self.warmup_size}); it is not solved "
                "and has no gate score"
            )
        P = as_keys(P, self.dim)
        core = self._core
        slots = self._live_slots()
        sup = slots[core.alpha[slots] != 0.0]
        return 2.0 * rbf_kernel(P, core.X[sup], self.sigma) @ core.alpha[sup] - core.rho

    def weights(self, Q) -> np.ndarray:
        """Normalised readout weights ``a_i k(q, x_i) / sum_j a_j k(q, x_j)``, (m, n) aligned with ids."""
        Q = as_keys(Q, self.dim)
        slots = self._live_slots()
        if slots.size == 0:
            raise GateError("the gate holds no keys")
        W = rbf_kernel(Q, self._core.X[slots], self.sigma) * self.alpha[None, :]
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
        core = self._core
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

    # ------------------------------------------------------------------ forget
    def _slot(self, token_id) -> int:
        try:
            tid = int(token_id)
        except (TypeError, ValueError) as exc:
            raise UnknownTokenError(f"token id must be an integer, got {token_id!r}") from exc
        if tid in self._forgotten:
            raise UnknownTokenError(f"token {tid} was already forgotten")
        if tid not in self._slot_of:
            raise UnknownTokenError(f"token {tid} is not in the gate (live ids: {self.n})")
        return self._slot_of[tid]

    def forget(self, token_id: int, verify: bool = False, probe_seed: int = 0) -> Receipt:
        """Delete a token by the C&P decremental path; returns a JSON-serialisable receipt.

        Preflight (no state change on failure): the id must be live, and ``(n-1) C >= 1``.
        If the path cannot complete a :class:`PathError` is raised and the gate is restored
        bit-for-bit. ``verify=True`` compares the result with an independent :func:`refit`
        on retained, removed and jittered probes and records the KKT residual.
        """
        slot = self._slot(token_id)
        tid = int(token_id)
        core = self._core
        n_before = self.n
        if core.solved and (n_before - 1) * self.C < 1.0 - 1e-12:
            raise InfeasibleError(
                f"forgetting token {tid} would leave n={n_before - 1} keys with C={self.C:.6g}: "
                f"(n-1)*C = {(n_before - 1) * self.C:.6g} < 1 (the fixed-C problem is infeasible)"
            )
        gated_before = self.gated
        status_before = self.status_of(tid)
        alpha_before = float(core.alpha[slot]) if gated_before else float("nan")
        part_before = core.partition_counts() if gated_before else None
        removed_key = core.X[slot].copy()
        snap = core.snapshot()
        t0 = time.perf_counter()
        try:
            if core.solved:
                was_reserve = core.status[slot] == RESERVE
                events = core.remove_slot(slot)
                # a reserve removal changes no coefficient (Proposition 1); only with S empty
                # does it move rho, whose KKT interval (and so its midpoint) it bounds
                if not was_reserve or not core.S:
                    core.polish()
            else:
                events = 0
                core.status[slot] = DEAD
        except BaseException:
            core.restore(snap)
            raise
        elapsed = time.perf_counter() - t0
        del self._slot_of[tid]
        self._forgotten.add(tid)
        receipt = Receipt(
            token_id=tid,
            C=self.C,
            sigma=self.sigma,
            n_before=n_before,
            n_after=self.n,
            status_before=status_before,
            alpha_before=alpha_before,
            partition_before=part_before,
            partition_after=core.partition_counts() if self.gated else None,
            path_events=int(events),
            elapsed_s=elapsed,
            certified=bool(gated_before and self.gated),
        )
        if verify and self.gated:
            receipt.verification = self.verify_against_refit(removed=removed_key[None, :], seed=probe_seed)
        self._maybe_compact()
        return receipt

    def forget_many(self, token_ids: Iterable[int], verify: bool = False) -> list[Receipt]:
        """Forget several tokens; all-or-nothing (the gate is restored if any deletion fails)."""
        token_ids = [int(t) for t in token_ids]
        if len(set(token_ids)) != len(token_ids):
            raise UnknownTokenError("token ids to forget contain repeats")
        for t in token_ids:
            self._slot(t)
        if self._core.solved and (self.n - len(token_ids)) * self.C < 1.0 - 1e-12:
            raise InfeasibleError(
                f"forgetting {len(token_ids)} tokens would leave (n-k)*C = "
                f"{(self.n - len(token_ids)) * self.C:.6g} < 1"
            )
        state = self.to_state()
        try:
            out = [self.forget(t) for t in token_ids]
        except BaseException:
            restored = Gate.from_state(state)
            self.__dict__.update(restored.__dict__)
            raise
        if verify and self.gated:
            out[-1].verification = self.verify_against_refit(removed=None)
        return out

    def verify_against_refit(self, removed=None, seed: int = 0) -> dict:
        """Max |gate score difference| between this state and an independent :func:`refit`."""
        from .refit import refit

        X = self.keys
        a_ref, rho_ref = refit(X, C=self.C, sigma=self.sigma)
        rng = np.random.default_rng(seed)
        probes = {"retained": X, "jittered": X + JITTER_SCALE * rng.standard_normal(X.shape)}
        if removed is not None and len(removed):
            probes["removed"] = np.asarray(removed, dtype=np.float64)
        dev = {}
        for name, P in probes.items():
            s_ref = 2.0 * rbf_kernel(P, X, self.sigma) @ a_ref - rho_ref
            dev[name] = float(np.abs(self.score(P) - s_ref).max())
        tol = 1e-9 * self.C
        part_ref = np.where(a_ref <= tol, RESERVE, np.where(a_ref >= self.C - tol, ERROR, MARGIN))
        part_here = self._core.status[self._live_slots()]
        return {
            "max_abs_score_dev": max(dev.values()),
            "score_dev_by_probe": dev,
            "max_abs_alpha_dev": float(np.abs(self.alpha - a_ref).max()),
            "partition_match": bool(np.array_equal(part_ref, part_here)),
            "kkt_residual": self.kkt_residual()["max"],
        }

    def kkt_residual(self) -> dict:
        """KKT violations recomputed from scratch: sum, box, margin/error/reserve gradients, inverse."""
        if not self.gated:
            raise WarmupError("the gate is in warm-up; no KKT state")
        return self._core.kkt_residual()

    def _maybe_compact(self) -> None:
        core = self._core
        dead = core.n_slots - self.n
        if dead > 64 and dead > self.n:
            old_to_new = core.compact()
            new_ids = [None] * core.n_slots
            for old, new in enumerate(old_to_new):
                if new >= 0:
                    new_ids[new] = self._id_of_slot[old]
            self._id_of_slot = new_ids
            self._slot_of = {i: s for s, i in enumerate(new_ids)}

    # ------------------------------------------------------------------ serialisation
    def to_state(self) -> dict:
        """Arrays and scalars that reproduce this gate exactly (``np.savez``-able)."""
        slots = self._live_slots()
        core = self._core
        return {
            "C": self.C,
            "sigma": self.sigma,
            "refactor_every": self.refactor_every,
            "keys": core.X[slots].copy() if core is not None else np.zeros((0, 0)),
            "ids": self.ids,
            "alpha": core.alpha[slots].copy() if core is not None else np.zeros(0),
            "status": core.status[slots].copy() if core is not None else np.zeros(0, np.int8),
            "margin_ids": np.asarray([self._id_of_slot[s] for s in core.S], dtype=np.int64)
            if core is not None else np.zeros(0, np.int64),
            "rho": float(core.rho) if core is not None else 0.0,
            "solved": bool(core.solved) if core is not None else False,
            "next_id": self._next_id,
            "forgotten": np.asarray(sorted(self._forgotten), dtype=np.int64),
        }

    @classmethod
    def from_state(cls, state: dict) -> "Gate":
        g = cls(float(state["C"]), float(state["sigma"]), int(state.get("refactor_every", 64)))
        keys = np.asarray(state["keys"], dtype=np.float64)
        ids = np.asarray(state["ids"], dtype=np.int64)
        g._next_id = int(state["next_id"])
        g._forgotten = set(int(i) for i in np.asarray(state["forgotten"]).ravel())
        if keys.size == 0:
            return g
        core = MaintainedSVDD(g.C, g.sigma, keys.shape[1], g.refactor_every)
        core.append(keys)
        core.alpha[: ids.size] = np.asarray(state["alpha"], dtype=np.float64)
        core.status[: ids.size] = np.asarray(state["status"], dtype=np.int8)
        core.rho = float(state["rho"])
        core.solved = bool(state["solved"])
        g._core = core
        g._id_of_slot = [int(i) for i in ids]
        g._slot_of = {int(i): s for s, i in enumerate(ids)}
        core.S = [g._slot_of[int(i)] for i in np.asarray(state["margin_ids"]).ravel()]
        if core.solved:
            if core.S:
                core.refactor()
            core.recompute_g()
        return g

    def __repr__(self) -> str:
        p = {k: len(v) for k, v in self.partition().items()}
        return f"Gate(C={self.C:.6g}, sigma={self.sigma:g}, n={self.n}, gated={self.gated}, partition={p})"
