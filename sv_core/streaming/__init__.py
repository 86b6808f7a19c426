"""Future-safe streaming memory: a bounded hot :class:`~sv_core.Gate` plus a cold tier.

``StreamingGate`` keeps every live token. The *hot* tier is a plain fixed-C ``Gate`` (exact C&P
increments and decrements); the *cold* tier holds keys with ``alpha = 0`` whose gradient

    g_j = rho - K_jj + 2 sum_hot alpha_i k(x_j, x_i)        (SPEC §1; >= 0 keeps them inert)

is certified non-negative. Invariant after every operation: hot alpha extended by zeros on the
cold tier satisfies the fixed-C KKT conditions over *every* live token, hence (unique optimum)
scores and readout equal a fresh full-history solve (:func:`sv_core.refit` over all live keys).
Admission, reserve eviction and re-admission: :class:`StreamingGate`. Layout:
:mod:`sv_core.streaming.store` (key stores), :mod:`sv_core.streaming.cold` (screening records),
:mod:`sv_core.streaming.screen` (bounds), :mod:`sv_core.streaming.cache` (kernel rows kept for
re-checks), :mod:`sv_core.streaming.ops` (the operations and their transaction),
:mod:`sv_core.streaming.cert` (certificate), :mod:`sv_core.streaming.state` (saved form), this
module (the public class: views, scores, serialisation). docs/STREAMING.md.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from sv_core.errors import GateError, InvalidKeysError, InvalidParameterError, InvalidStateError
from sv_core.gate import Gate, WarmupError
from sv_core.streaming.cache import MAX_ENTRIES, KernelCache
from sv_core.streaming.cert import COVERS, DOES_NOT_COVER  # noqa: F401  (re-exported)
from sv_core.streaming.cold import ColdTier
from sv_core.streaming.ops import StreamingOps
from sv_core.streaming.screen import KKT_TOL, READMIT_TOL, SCREEN_MARGIN, HotView, alpha_change
from sv_core.streaming.state import STATE_FORMAT, STATS_SAVED, parse_state, verify_cold
from sv_core.streaming.store import ArrayColdStore, ColdStore
from sv_core.validation import as_keys, check_params


class StreamingGate(StreamingOps):
    """Bounded hot ``Gate`` + cold tier with a full-history (future-safe) certificate.

    Parameters
    ----------
    C, sigma : the fixed box and RBF bandwidth (as for :class:`Gate`).
    hot_budget : optional hard cap on the hot size (>= ceil(1/C) + 2); exceeding the reserve
        set is an uncertified policy (below).
    screen : use the safe screening bound (False: exact check of every cold key after every
        operation, the slow reference).
    store : a :class:`ColdStore` (default :class:`ArrayColdStore`).
    direct_cold : send an arriving key that is inert against the hot state straight to the cold
        tier (False: every key enters the hot gate first, as in the first release).
    cache_entries : cap on kernel values kept for re-checks (:mod:`sv_core.streaming.cache`;
        0 disables the cache).

    * Admission: a new key whose exact ``g`` against the current hot state is ``>= SCREEN_MARGIN``
      is inert as it arrives (it would enter the hot gate as reserve and change nothing): it goes
      straight to the cold tier (``direct_cold``, one kernel row against the hot support). Other keys
      enter the hot gate by C&P increments.
    * Reserve eviction moves hot keys with ``alpha = 0`` to the cold tier (Proposition 1).
    * Re-admission: after any operation that changed the hot coefficients, every cold key whose
      certified lower bound on ``g_j`` (:mod:`sv_core.streaming.screen`: one global budget, O(1) per
      operation) fell below ``SCREEN_MARGIN`` is recomputed exactly in one vectorised block; keys
      with ``g_j < -READMIT_TOL`` re-enter the hot gate by a C&P increment, until none does.

    Warm-up: below ``ceil(1/C) + 2`` live keys nothing is solved and nothing is cold. An optional
    ``hot_budget`` may evict *non-reserve* keys (oldest first, by a C&P decrement) into a pinned part
    of the cold tier that is excluded from re-admission: an **uncertified** policy; the certificate
    then reports ``future_safe = False`` until every pinned token is forgotten.
    """

    def __init__(self, C: float, sigma: float, hot_budget: int | None = None, screen: bool = True,
                 store: ColdStore | None = None, refactor_every: int = 64, direct_cold: bool = True,
                 cache_entries: int = MAX_ENTRIES):
        self.C, self.sigma = check_params(C, sigma)
        if hot_budget is not None:
            warm = Gate(self.C, 1.0).warmup_size
            ok = isinstance(hot_budget, (int, np.integer)) and not isinstance(hot_budget, (bool, np.bool_))
            if not ok or int(hot_budget) < warm:
                raise InvalidParameterError(
                    f"hot_budget must be an integer >= ceil(1/C)+2 = {warm}, got {hot_budget!r}")
            hot_budget = int(hot_budget)
        ok = isinstance(cache_entries, (int, np.integer)) and not isinstance(cache_entries, (bool, np.bool_))
        if not ok or int(cache_entries) < 0:
            raise InvalidParameterError(f"cache_entries must be a non-negative integer, got {cache_entries!r}")
        self.hot_budget = hot_budget
        self.screen = bool(screen)
        self.direct_cold = bool(direct_cold)
        self._hot = Gate(self.C, self.sigma, refactor_every)
        self._view = HotView(self._hot)
        self._h2s: dict[int, int] = {}
        self._s2h: dict[int, int] = {}
        store = store if store is not None else ArrayColdStore()
        if len(store):
            raise InvalidParameterError("the cold store must be empty when a StreamingGate is created")
        self._cold = ColdTier(store)
        self._cache = KernelCache(self.sigma, cache_entries)
        self._b = 0.0                      # screening budget (streaming_screen)
        self._next_id = 0
        self._forgotten: set[int] = set()
        self._dim: int | None = None
        self._journal: list | None = None  # undo steps of the running operation
        self._hot_saved: tuple[str, Any] | None = None  # the hot gate before the running operation's first change
        self.stats = {k: 0 for k in STATS_SAVED}
        self.stats["admitted_cold"] = 0

    # ------------------------------------------------------------------ views
    @property
    def gated(self) -> bool:
        return self._hot.gated

    @property
    def warmup_size(self) -> int:
        return self._hot.warmup_size

    @property
    def dim(self) -> int | None:
        return self._dim

    @property
    def n(self) -> int:
        return self._hot.n + len(self._cold)

    @property
    def n_hot(self) -> int:
        return self._hot.n

    @property
    def n_cold(self) -> int:
        return len(self._cold)

    @property
    def hot_gate(self) -> Gate:
        """The hot :class:`Gate` (read-only use; its ids are internal, see ``hot_ids``)."""
        return self._hot

    @property
    def cold_store(self) -> ColdStore:
        """The store holding the cold keys (read-only use)."""
        return self._cold.store

    def _hot_sids(self) -> np.ndarray:
        return np.asarray([self._h2s[int(h)] for h in self._view.ids], dtype=np.int64)

    @property
    def hot_ids(self) -> np.ndarray:
        return np.sort(self._hot_sids())

    @property
    def cold_ids(self) -> np.ndarray:
        return self._cold.ids()

    @property
    def ids(self) -> np.ndarray:
        return np.sort(np.concatenate([self._hot_sids(), self._cold.ids()]))

    def _full(self, hot_vals: np.ndarray, cold_vals) -> np.ndarray:
        cid = self._cold.ids()
        order = np.argsort(np.concatenate([self._hot_sids(), cid]), kind="stable")
        cold = np.broadcast_to(cold_vals, (cid.size,) + hot_vals.shape[1:])
        return np.concatenate([hot_vals, cold])[order]

    @property
    def alpha(self) -> np.ndarray:
        """Coefficients aligned with ``ids`` (cold = 0; uniform 1/n in warm-up)."""
        return self._full(self._hot.alpha, 0.0)

    @property
    def rho(self) -> float:
        return self._hot.rho

    @property
    def keys(self) -> np.ndarray:
        """(n, d) live keys aligned with ``ids`` (reads the cold store)."""
        if self._dim is None:
            return np.zeros((0, 0))
        cid = self._cold.ids()
        cold = self._cold.store.get(cid) if cid.size else np.zeros((0, self._dim))
        sids = np.concatenate([self._hot_sids(), cid])
        return np.concatenate([self._view.keys.reshape(-1, self._dim), cold])[np.argsort(sids, kind="stable")]

    def tier_of(self, token_id) -> str:
        """``"hot" | "cold" | "pinned"`` for a live id."""
        tid = self._check_id(token_id)
        if tid in self._s2h:
            return "hot"
        return "pinned" if self._cold.pinned(tid) else "cold"

    # ------------------------------------------------------------------ scores and readout
    def score(self, P) -> np.ndarray:
        """Gate score ``2 sum alpha_i k(x, x_i) - rho`` from the hot tier (= full history)."""
        return self._hot.score(P)

    def weights(self, Q) -> np.ndarray:
        """Normalised readout weights (m, n) aligned with ``ids`` (cold columns are 0)."""
        W = self._hot.weights(Q)
        return self._full(W.T, 0.0).T if W.size else W

    def readout(self, Q, V) -> np.ndarray:
        """Readout from the hot tier. ``V`` rows aligned with ``ids`` (all live tokens) or with
        ``hot_ids`` (the two coincide when the cold tier is empty)."""
        V = np.asarray(V, dtype=np.float64)
        hs = self._hot_sids()
        if V.ndim >= 1 and V.shape[0] == self.n:
            Vh = V[np.searchsorted(self.ids, hs)]
        elif V.ndim >= 1 and V.shape[0] == hs.size:
            Vh = V[np.searchsorted(np.sort(hs), hs)]
        else:
            raise InvalidKeysError(f"V has {V.shape[0] if V.ndim else 0} rows; expected {self.n} "
                                   f"(aligned with ids) or {hs.size} (aligned with hot_ids)")
        return self._hot.readout(Q, Vh)

    # ------------------------------------------------------------------ certificate
    def certificate(self, exact: bool = True) -> dict:
        """Full-history certificate. The hot KKT residual is recomputed from the hot keys;
        ``exact=True`` also recomputes every cold gradient (cold x hot-support kernel product)
        instead of relying on the screening records."""
        return self._certificate(exact, recompute_hot=True)

    # ------------------------------------------------------------------ serialisation
    def to_state(self) -> dict:
        """Flat dict of arrays and scalars (``np.savez``-able) holding both tiers exactly."""
        cold = self._cold
        cid = cold.ids()
        tau, pin = cold.records(cid)
        rho = self._view.rho if self._hot.gated else 0.0
        g0 = np.where(pin, 0.0, tau + rho - 2.0 * self._b)  # each key's current lower bound
        st = {
            "format": STATE_FORMAT, "C": self.C, "sigma": self.sigma,
            "hot_budget": -1 if self.hot_budget is None else self.hot_budget,
            "screen": self.screen, "next_id": self._next_id, "A": self._b, "B": self._b,
            "dim": -1 if self._dim is None else self._dim,
            "forgotten": np.asarray(sorted(self._forgotten), dtype=np.int64),
            "hot_stream_ids": self._hot_sids(),
            "cold_ids": cid,
            "cold_keys": cold.store.get(cid) if cid.size else np.zeros((0, self._dim or 0)),
            "cold_g0": g0, "cold_rho0": np.full(cid.size, rho), "cold_A0": np.full(cid.size, self._b),
            "cold_B0": np.full(cid.size, self._b), "cold_pinned": pin,
            "stats": np.asarray([self.stats[k] for k in STATS_SAVED], dtype=np.int64),
            "direct_cold": self.direct_cold, "stats_admitted_cold": self.stats["admitted_cold"],
        }
        for k, v in self._hot.to_state().items():
            st["hot/" + k] = v
        return st

    @classmethod
    def from_state(cls, state: dict, store: ColdStore | None = None, verify: bool = True) -> StreamingGate:
        """Rebuild from :meth:`to_state` (validated; :class:`InvalidStateError` on a malformed or
        inconsistent state, e.g. a cold key that violates KKT). States written by the first
        release load unchanged."""
        p = parse_state(state)
        g = verify_cold(p) if verify and p.hot.gated else None
        sg = cls(p.C, p.sigma, hot_budget=p.hot_budget, screen=p.screen, store=store,
                 direct_cold=p.direct_cold)
        sg._hot = p.hot
        sg._view = HotView(p.hot)
        sg._h2s = {int(h): int(s) for h, s in zip(sg._view.ids, p.hot_sids)}
        sg._s2h = {s: h for h, s in sg._h2s.items()}
        sg._next_id, sg._dim = p.next_id, p.dim
        sg._forgotten = set(p.forgotten.tolist())
        sg.stats = dict(p.stats)
        free = ~p.cold_pinned
        lower = p.cold_lower.copy()
        if g is not None:
            lower[free] = g  # exact at load time: the tightest record
        rho = sg._view.rho if p.hot.gated else 0.0
        if free.any():
            sg._cold.add(p.cold_ids[free], p.cold_keys[free], lower[free] - rho)
        if (~free).any():
            sg._cold.add(p.cold_ids[~free], p.cold_keys[~free], None, pinned=True)
        return sg

    @classmethod
    def from_solution(cls, X, alpha, C: float, sigma: float, **kwargs) -> StreamingGate:
        """A streaming gate over keys ``X`` (ids ``0..n-1`` in row order) from a full-history
        solution ``alpha`` of the same fixed-C problem (e.g. an independent batch solver's),
        without streaming the keys one by one.

        The keys with ``alpha > 0`` (padded with zero-coefficient keys to the warm-up size) form
        the hot gate (:meth:`Gate.from_solution`: margin system re-solved, KKT guard checked);
        every other key goes cold with its exact gradient, and any that violates KKT against
        the hot state re-enters it by the usual re-admission check, so the result is the
        full-history optimum even if ``alpha`` was only approximately optimal. ``kwargs`` are
        passed to the constructor. Below the warm-up size the keys are just admitted.
        """
        A = as_keys(X)
        n = A.shape[0]
        a = np.asarray(alpha, dtype=np.float64).reshape(-1)
        if a.shape != (n,) or not np.isfinite(a).all():
            raise InvalidKeysError(f"alpha must be a finite array of shape ({n},), got {a.shape}")
        sg = cls(C, sigma, **kwargs)
        if n < sg.warmup_size or n == 0:
            sg.admit(A)
            return sg
        hot_idx = np.flatnonzero(a > 0.0)
        if hot_idx.size < sg.warmup_size:
            pad = np.flatnonzero(a <= 0.0)[: sg.warmup_size - hot_idx.size]
            hot_idx = np.sort(np.concatenate([hot_idx, pad]))
        hot = Gate.from_solution(A[hot_idx], a[hot_idx], sg.C, sg.sigma)
        sg._hot, sg._view = hot, HotView(hot)
        sg._h2s = {int(h): int(s) for h, s in zip(sg._view.ids, hot_idx)}
        sg._s2h = {s: h for h, s in sg._h2s.items()}
        sg._next_id, sg._dim = n, int(A.shape[1])
        cold_idx = np.setdiff1d(np.arange(n, dtype=np.int64), hot_idx)
        if cold_idx.size:
            sg._cold_add(cold_idx, A[cold_idx], sg._cold_g(cold_idx, lambda ids: A[ids]))
        sg._transact(sg._settle_cold)
        return sg

    def __repr__(self) -> str:
        return (f"StreamingGate(C={self.C:.6g}, sigma={self.sigma:g}, n={self.n}, hot={self.n_hot}, "
                f"cold={self.n_cold}, gated={self.gated})")


__all__ = ["StreamingGate", "ColdStore", "ArrayColdStore", "InvalidStateError", "alpha_change",
           "READMIT_TOL", "SCREEN_MARGIN", "KKT_TOL", "WarmupError", "GateError"]
