"""Future-safe streaming memory: a bounded hot :class:`~sv_core.Gate` plus a cold tier.

``StreamingGate`` keeps every live token. The *hot* tier is a plain fixed-C ``Gate`` (exact
C&P increments and decrements); reserve keys evicted from it move to the *cold* tier (keys only,
``alpha = 0``). After every admission or deletion each cold key ``j`` is checked against

    g_j = rho - K_jj + 2 sum_hot alpha_i k(x_j, x_i)        (SPEC §1 gradient; >= 0 on reserve)

and any cold key with ``g_j < -READMIT_TOL`` re-enters the hot gate by a C&P increment, repeated
until none does. Invariant: hot alpha extended by zeros on the cold tier satisfies the fixed-C
KKT conditions over *every* live token, hence (unique optimum) the gate score and readout equal
a fresh full-history solve (:func:`sv_core.refit` over all live keys).

Safe screening (most cold keys are never touched). Write ``g_j = rho - 1 + 2 <phi(x_j), w>``
with ``w = sum_i alpha_i phi(x_i)`` (RBF: ``K_jj = ||phi(x_j)|| = 1``, ``0 < k <= 1``). Between a
state at time t0 and a later one (both solved, sum alpha = 1; every token hot at either time
counts, alpha = 0 while not hot, so admissions, re-admissions, evictions and deletions of hot
tokens -- whose alpha goes to 0 -- are all covered):

    g_j(t) - g_j(t0) = (rho(t) - rho(t0)) + 2 sum_i (alpha_i(t) - alpha_i(t0)) k(x_j, x_i)
        (a) >= (rho(t) - rho(t0)) - 2 sum_i (alpha_i(t) - alpha_i(t0))^-      (0 < k <= 1)
        (b) >= (rho(t) - rho(t0)) - 2 ||w(t) - w(t0)||                       (Cauchy-Schwarz)

Both drift terms are subadditive over operations, so two global counters accumulate per
operation: ``A += sum_i (Delta alpha_i)^-`` and ``B += ||Delta w|| = sqrt(Delta alpha^T K
Delta alpha)`` (K over the changed keys only). Each cold key stores its last exact ``g_j(t0)``,
``rho(t0)``, ``A(t0)``, ``B(t0)``; while ``g_j(t0) + rho(t) - rho(t0) - 2 min(A - A(t0),
B - B(t0)) >= SCREEN_MARGIN`` it provably still has ``g_j > 0`` and is skipped, otherwise it is
recomputed exactly. (With sum Delta alpha = 0, (a) equals ``|Delta alpha|_1``: half the
two-sided ``|Delta rho| + 2 sum |Delta alpha|`` and signed in Delta rho; (b) is about half of
(a) again on ICU-like streams because mass moves between nearby keys.) Rounding: the counters
are monotone sums, ``||Delta w||^2`` is inflated far above its rounding error, and
``SCREEN_MARGIN`` absorbs the rest.

Warm-up: below ``ceil(1/C) + 2`` live keys nothing is solved and nothing is evicted. An optional
``hot_budget`` may evict *non-reserve* keys (oldest first, by a C&P decrement) into a pinned part
of the cold tier that is excluded from re-admission: an **uncertified** policy; the certificate
then reports ``future_safe = False`` until every pinned token is forgotten.
"""
from __future__ import annotations

import copy
import math

import numpy as np

from .errors import (
    GateError,
    InfeasibleError,
    InvalidKeysError,
    InvalidParameterError,
    InvalidStateError,
    UnknownTokenError,
)
from .gate import Gate, WarmupError
from .kernels import rbf_kernel
from .streaming_state import ArrayColdStore, ColdStore

try:  # shared validation (sv_core.validation); older trees kept these in gate.py
    from .validation import as_keys, check_token_id
    from .validation import check_params as _check_params
except ImportError:  # pragma: no cover
    from .gate import _check_params, as_keys

    def check_token_id(token_id) -> int:
        if isinstance(token_id, (bool, np.bool_)) or not isinstance(token_id, (int, np.integer)):
            raise UnknownTokenError(f"token id must be an integer, got {token_id!r}")
        return int(token_id)


#: a cold key re-enters the hot gate when its exact gradient is below ``-READMIT_TOL``
READMIT_TOL = 1e-12
#: a cold key is skipped only while its lower bound on ``g_j`` is at least this (absorbs rounding)
SCREEN_MARGIN = 1e-9
#: full-history KKT residual up to which the certificate calls the state future-safe
KKT_TOL = 1e-9
STATE_FORMAT = "sv_core.StreamingGate/1"
COVERS = ("the current state after any sequence of admissions, reserve evictions and deletions: "
          "hot alpha extended by zeros satisfies fixed-C KKT over every live token (residual "
          "recomputed), so scores/readout equal the full-history solve at the same C")
DOES_NOT_COVER = ("tokens evicted by the uncertified hot budget (pinned); a changed C or sigma; "
                  "the choice of rho inside its KKT interval when the margin set is empty "
                  "(midpoint of the hot interval, not of the full-history one); alpha itself when "
                  "keys are duplicated (not unique; scores are); forgotten tokens (gone, as in a "
                  "fresh solve without them)")


def alpha_change(ids_b, a_b, keys_b, ids_a, a_a, keys_a, sigma: float) -> tuple[float, float]:
    """Screening increments of one operation between two solved hot states.

    Returns ``(sum_i (Delta alpha_i)^-, ||Delta w||)`` over the union of ids (absent = 0), with
    ``Delta w = sum_i Delta alpha_i phi(x_i)`` in the RBF feature space, ``||Delta w||^2 =
    Delta alpha^T K Delta alpha`` (K over the changed keys). The quadratic form is inflated by
    ``1e-12 (sum |Delta alpha|)^2``, far above its fp64 rounding error, so the returned norm is
    never below the exact one.
    """
    ids_b = np.asarray(ids_b, np.int64); ids_a = np.asarray(ids_a, np.int64)
    u = np.union1d(ids_b, ids_a)
    d = np.zeros(u.size)
    pb, pa = np.searchsorted(u, ids_b), np.searchsorted(u, ids_a)
    d[pb] -= a_b
    d[pa] += a_a
    nz = np.flatnonzero(d)
    if nz.size == 0:
        return 0.0, 0.0
    keys = np.zeros((u.size, np.shape(keys_a)[1] if np.size(keys_a) else np.shape(keys_b)[1]))
    if ids_b.size:
        keys[pb] = keys_b
    if ids_a.size:
        keys[pa] = keys_a
    dn = d[nz]
    q = float(dn @ (rbf_kernel(keys[nz], keys[nz], sigma) @ dn))
    l1 = float(np.abs(dn).sum())
    return float(np.maximum(-dn, 0.0).sum()), math.sqrt(max(q, 0.0) + 1e-12 * l1 * l1)


# ---------------------------------------------------------------------- the streaming gate
class StreamingGate:
    """Bounded hot ``Gate`` + cold tier with a full-history (future-safe) certificate.

    Parameters
    ----------
    C, sigma : the fixed box and RBF bandwidth (as for :class:`Gate`).
    hot_budget : optional hard cap on the hot size (>= ceil(1/C) + 2); exceeding the reserve
        set is an uncertified policy (see module docstring).
    screen : use the safe screening bound (False: exact check of every cold key, for testing).
    store : a :class:`ColdStore` (default :class:`ArrayColdStore`).
    """

    def __init__(self, C: float, sigma: float, hot_budget: int | None = None, screen: bool = True,
                 store: ColdStore | None = None, refactor_every: int = 64):
        self.C, self.sigma = _check_params(C, sigma)
        if hot_budget is not None:
            warm = Gate(self.C, 1.0).warmup_size
            ok = isinstance(hot_budget, (int, np.integer)) and not isinstance(hot_budget, (bool, np.bool_))
            if not ok or int(hot_budget) < warm:
                raise InvalidParameterError(
                    f"hot_budget must be an integer >= ceil(1/C)+2 = {warm}, got {hot_budget!r}")
            hot_budget = int(hot_budget)
        self.hot_budget = hot_budget
        self.screen = bool(screen)
        self._hot = Gate(self.C, self.sigma, refactor_every)
        self._h2s: dict[int, int] = {}
        self._s2h: dict[int, int] = {}
        self._store = store if store is not None else ArrayColdStore()
        if len(self._store):
            raise InvalidParameterError("the cold store must be empty when a StreamingGate is created")
        self._cid = np.zeros(0, np.int64)     # cold ids, ascending (same set as the store)
        self._cg0 = np.zeros(0)               # last exact g_j
        self._crho0 = np.zeros(0)             # rho at that time
        self._cA0 = np.zeros(0)               # A at that time
        self._cB0 = np.zeros(0)               # B at that time
        self._cpin = np.zeros(0, bool)        # pinned by the (uncertified) hot budget
        self._A = 0.0                         # sum over operations of sum_i (Delta alpha_i)^-
        self._B = 0.0                         # sum over operations of ||Delta w|| (feature space)
        self._next_id = 0
        self._forgotten: set[int] = set()
        self._dim: int | None = None
        self._journal: list | None = None     # cold-store changes of the running operation
        self.stats = {"readmissions": 0, "readmission_rounds": 0, "exact_checks": 0,
                      "screened": 0, "uncertified_evictions": 0, "evicted": 0}

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
        return self._hot.n + self._cid.size

    @property
    def n_hot(self) -> int:
        return self._hot.n

    @property
    def n_cold(self) -> int:
        return int(self._cid.size)

    @property
    def hot_gate(self) -> Gate:
        """The hot :class:`Gate` (read-only use; its ids are internal, see ``hot_ids``)."""
        return self._hot

    def _hot_sids(self) -> np.ndarray:
        return np.asarray([self._h2s[int(h)] for h in self._hot.ids], dtype=np.int64)

    @property
    def hot_ids(self) -> np.ndarray:
        return np.sort(self._hot_sids())

    @property
    def cold_ids(self) -> np.ndarray:
        return self._cid.copy()

    @property
    def ids(self) -> np.ndarray:
        return np.sort(np.concatenate([self._hot_sids(), self._cid]))

    def _full(self, hot_vals: np.ndarray, cold_vals) -> np.ndarray:
        sids = np.concatenate([self._hot_sids(), self._cid])
        order = np.argsort(sids, kind="stable")
        cold = np.broadcast_to(cold_vals, (self._cid.size,) + hot_vals.shape[1:])
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
        cold = self._store.get(self._cid) if self._cid.size else np.zeros((0, self._dim))
        sids = np.concatenate([self._hot_sids(), self._cid])
        return np.concatenate([self._hot.keys.reshape(-1, self._dim), cold])[np.argsort(sids, kind="stable")]

    def tier_of(self, token_id) -> str:
        """``"hot" | "cold" | "pinned"`` for a live id."""
        tid = self._check_id(token_id)
        if tid in self._s2h:
            return "hot"
        return "pinned" if self._cpin[np.searchsorted(self._cid, tid)] else "cold"

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

    # ------------------------------------------------------------------ internals
    def _check_id(self, token_id) -> int:
        tid = check_token_id(token_id)
        if tid in self._forgotten:
            raise UnknownTokenError(f"token {tid} was already forgotten")
        if tid in self._s2h:
            return tid
        p = np.searchsorted(self._cid, tid)
        if p < self._cid.size and self._cid[p] == tid:
            return tid
        raise UnknownTokenError(f"token {tid} is not live in the streaming gate ({self.n} live)")

    def _hot_alpha_by_hid(self):
        return self._hot.ids, (self._hot.alpha if self._hot.gated else np.zeros(self._hot.n))

    def _bound(self, sel=slice(None)) -> np.ndarray:
        """Certified lower bound on the current ``g_j`` of cold keys (module docstring)."""
        drift = np.minimum(self._A - self._cA0[sel], self._B - self._cB0[sel])
        return self._cg0[sel] + (self._hot.rho - self._crho0[sel]) - 2.0 * drift

    def _exact_g(self, keys: np.ndarray) -> np.ndarray:
        """Exact ``g_j`` of keys against the current hot state (K_jj = 1 for the RBF kernel)."""
        a = self._hot.alpha
        sup = a != 0.0
        Xs = self._hot.keys[sup]
        if keys.shape[0] == 0:
            return np.zeros(0)
        return self._hot.rho - 1.0 + 2.0 * (rbf_kernel(keys, Xs, self.sigma) @ a[sup])

    def _account(self, before) -> None:
        """Add this step's coefficient change to the screening counters ``A`` and ``B``."""
        ids_b, a_b, keys_b, gated_b = before
        if gated_b and self._hot.gated:
            ids_a, a_a = self._hot_alpha_by_hid()
            neg, dw = alpha_change(ids_b, a_b, keys_b, ids_a, a_a, self._hot.keys, self.sigma)
            self._A += neg
            self._B += dw

    def _mark(self):
        ids, a = self._hot_alpha_by_hid()
        return ids, a, self._hot.keys, self._hot.gated

    def _cold_add(self, sids, keys, g0, pinned: bool) -> None:
        sids = np.asarray(sids, np.int64)
        self._store.add(sids, keys)
        if self._journal is not None:
            self._journal.append(("add", sids.copy(), None))
        allids = np.concatenate([self._cid, sids])
        order = np.argsort(allids, kind="stable")
        self._cid = allids[order]
        self._cg0 = np.concatenate([self._cg0, g0])[order]
        self._crho0 = np.concatenate([self._crho0, np.full(sids.size, self._hot.rho)])[order]
        self._cA0 = np.concatenate([self._cA0, np.full(sids.size, self._A)])[order]
        self._cB0 = np.concatenate([self._cB0, np.full(sids.size, self._B)])[order]
        self._cpin = np.concatenate([self._cpin, np.full(sids.size, pinned)])[order]

    def _cold_remove(self, sids) -> np.ndarray:
        sids = np.asarray(sids, np.int64)
        keys = self._store.remove(sids)
        if self._journal is not None:
            self._journal.append(("remove", sids.copy(), keys.copy()))
        keep = ~np.isin(self._cid, sids)
        for name in ("_cid", "_cg0", "_crho0", "_cA0", "_cB0", "_cpin"):
            setattr(self, name, getattr(self, name)[keep])
        return keys

    def _hot_admit(self, sids, keys) -> None:
        hids = self._hot.admit(keys)
        for h, s in zip(hids, sids):
            self._h2s[int(h)] = int(s)
            self._s2h[int(s)] = int(h)

    def _settle_cold(self) -> list[int]:
        """Re-admission check: move every cold key with ``g_j < 0`` back into the hot gate."""
        readmitted: list[int] = []
        while self._hot.gated and self._cid.size:
            free = ~self._cpin
            if self.screen:
                cand = free & ~(self._bound() >= SCREEN_MARGIN)
            else:
                cand = free
            n_c = int(cand.sum())
            self.stats["exact_checks"] += n_c
            self.stats["screened"] += int(free.sum()) - n_c
            if n_c == 0:
                break
            idx = np.flatnonzero(cand)
            g = self._exact_g(self._store.get(self._cid[idx]))
            self._cg0[idx] = g
            self._crho0[idx] = self._hot.rho
            self._cA0[idx] = self._A
            self._cB0[idx] = self._B
            bad = idx[g < -READMIT_TOL]
            if bad.size == 0:
                break
            bad = bad[np.argsort(g[g < -READMIT_TOL], kind="stable")]  # most violated first
            sids = self._cid[bad].copy()
            before = self._mark()
            keys = self._cold_remove(sids)
            self._hot_admit(sids, keys)
            self._account(before)
            readmitted += [int(s) for s in sids]
            self.stats["readmissions"] += int(sids.size)
            self.stats["readmission_rounds"] += 1
        return readmitted

    def _save(self) -> dict:
        # the hot gate's own state (restored by Gate.from_state: ids, alpha, status, rho bit-for-bit);
        # a solved hot tier below the warm-up size may be refused by Gate.from_state, so that
        # (small) gate is deep-copied instead
        small = self._hot.gated and self._hot.n < self._hot.warmup_size
        return {"hot": copy.deepcopy(self._hot) if small else self._hot.to_state(),
                "h2s": dict(self._h2s), "s2h": dict(self._s2h),
                "cold": (self._cid.copy(), self._cg0.copy(), self._crho0.copy(), self._cA0.copy(),
                         self._cB0.copy(), self._cpin.copy()),
                "A": self._A, "B": self._B, "next_id": self._next_id, "forgotten": set(self._forgotten),
                "dim": self._dim, "stats": dict(self.stats)}

    def _restore(self, s: dict, journal: list) -> None:
        """Roll back after a failure in the middle of an operation (store contents included)."""
        for kind, sids, keys in reversed(journal):
            if kind == "add":
                self._store.remove(sids)
            else:
                self._store.add(sids, keys)
        self._hot = s["hot"] if isinstance(s["hot"], Gate) else Gate.from_state(s["hot"])
        self._h2s, self._s2h = s["h2s"], s["s2h"]
        self._cid, self._cg0, self._crho0, self._cA0, self._cB0, self._cpin = s["cold"]
        self._A, self._B, self._next_id, self._forgotten = s["A"], s["B"], s["next_id"], s["forgotten"]
        self._dim, self.stats = s["dim"], s["stats"]

    def _transact(self, fn):
        saved = self._save()
        self._journal = []
        try:
            return fn()
        except BaseException:
            journal, self._journal = self._journal, None
            self._restore(saved, journal)
            raise
        finally:
            self._journal = None

    # ------------------------------------------------------------------ operations
    def admit(self, X) -> np.ndarray:
        """Admit keys ``(d,)`` or ``(n, d)`` (C&P increments on the hot tier, then the
        re-admission check). Returns new stable stream ids. On any error nothing changes."""
        A = as_keys(X, self._dim)
        if A.shape[0] == 0:
            return np.zeros(0, np.int64)

        def op():
            if self._dim is None:
                self._dim = int(A.shape[1])
            sids = np.arange(self._next_id, self._next_id + A.shape[0], dtype=np.int64)
            self._next_id += A.shape[0]
            before = self._mark()
            self._hot_admit(sids, A)
            self._account(before)
            self._settle_cold()
            return sids

        return self._transact(op)

    def evict_reserve(self) -> dict:
        """Move the hot tier's reserve keys (alpha = 0) to the cold tier. Then, with a hot
        budget, evict beyond the reserve set (uncertified). Returns a JSON-able certificate."""
        if not self._hot.gated:
            return {"issued": False, "future_safe": False, "evicted": [], "budget_evicted": [],
                    "reason": f"warm-up: {self.n} < ceil(1/C)+2 = {self.warmup_size} keys; "
                              "the gate is not solved and nothing is evicted",
                    "n_hot": self.n_hot, "n_cold": self.n_cold}

        def op():
            evicted: list[int] = []
            forced: list[int] = []
            max_change = 0.0
            for _ in range(16):
                before = self._mark()
                ev, mc = self._evict_reserve_once()
                self._account(before)  # zero in exact arithmetic (Proposition 1); kept for safety
                self._settle_cold()
                evicted += ev
                max_change = max(max_change, mc)
                if self.hot_budget is None or self._hot.n <= self.hot_budget:
                    break
                forced += self._force_evict(self._hot.n - self.hot_budget)
                self._settle_cold()
            self.stats["evicted"] += len(evicted)
            cert = self.certificate(exact=False)
            cert.update(issued=True, evicted=evicted, budget_evicted=forced,
                        max_abs_score_change=max_change)
            return cert

        return self._transact(op)

    def _evict_reserve_once(self):
        hot = self._hot
        ids_b, keys_b = hot.ids, hot.keys
        if not hot.partition()["reserve"]:
            return [], 0.0
        gcert = hot.evict_reserve()
        ev_h = np.asarray(gcert.evicted, dtype=np.int64)
        if ev_h.size == 0:
            return [], float(gcert.max_abs_score_change or 0.0)
        keys = keys_b[np.searchsorted(ids_b, ev_h)] if np.all(np.diff(ids_b) > 0) else \
            keys_b[[int(np.flatnonzero(ids_b == h)[0]) for h in ev_h]]
        sids = np.asarray([self._h2s.pop(int(h)) for h in ev_h], dtype=np.int64)
        for s in sids:
            del self._s2h[int(s)]
        self._cold_add(sids, keys, self._exact_g(keys), pinned=False)
        return sorted(int(s) for s in sids), float(gcert.max_abs_score_change or 0.0)

    def _force_evict(self, k: int) -> list[int]:
        """Uncertified: drive the ``k`` oldest hot keys to 0 (C&P decrement), pin them cold."""
        out = []
        for s in self.hot_ids[:k]:
            if (self._hot.n - 1) * self.C < 1.0 - 1e-12:
                break
            h = self._s2h.pop(int(s))
            key = self._hot.keys[np.flatnonzero(self._hot.ids == h)[0]][None, :]
            before = self._mark()
            self._hot.forget(h)
            del self._h2s[h]
            self._account(before)
            self._cold_add([int(s)], key, np.zeros(1), pinned=True)
            out.append(int(s))
        self.stats["uncertified_evictions"] += len(out)
        return out

    def forget(self, token_id) -> dict:
        """Delete a live token. Hot: C&P decrement on the hot gate (padded from the cold tier if
        the hot gate alone would become infeasible), then the re-admission check. Cold: removed
        directly (alpha = 0). Typed errors leave the state unchanged. Returns a receipt dict."""
        tid = self._check_id(token_id)
        if self._hot.gated and (self.n - 1) * self.C < 1.0 - 1e-12:
            raise InfeasibleError(
                f"forgetting token {tid} would leave n={self.n - 1} live keys with C={self.C:.6g}: "
                f"(n-1)*C = {(self.n - 1) * self.C:.6g} < 1 (the fixed-C problem is infeasible)")

        def op():
            tier = self.tier_of(tid)
            hot_receipt = None
            padded: list[int] = []
            if tier == "hot":
                if self._hot.gated and (self._hot.n - 1) * self.C < 1.0 - 1e-12:
                    need = math.ceil((1.0 - 1e-12) / self.C - (self._hot.n - 1))
                    padded = self._pad(need)
                h = self._s2h[tid]
                before = self._mark()
                hot_receipt = self._hot.forget(h).to_dict()
                hot_receipt["hot_token_id"], hot_receipt["token_id"] = h, tid  # stream id outside
                del self._s2h[tid], self._h2s[h]
                self._account(before)
            else:
                self._cold_remove([tid])
            self._forgotten.add(tid)
            readmitted = self._settle_cold()
            return {"token_id": tid, "tier": tier, "padded_from_cold": padded,
                    "readmitted": readmitted, "n_after": self.n, "n_hot_after": self.n_hot,
                    "hot_receipt": hot_receipt}

        return self._transact(op)

    def _pad(self, need: int) -> list[int]:
        """Bring ``need`` cold keys (unpinned, smallest g first) into the hot gate; with
        ``g_j >= 0`` they enter as reserve and change nothing."""
        order = np.lexsort((self._cg0, self._cpin))
        sids = self._cid[order[:need]].copy()
        before = self._mark()
        keys = self._cold_remove(sids)
        self._hot_admit(sids, keys)
        self._account(before)
        return [int(s) for s in sids]

    # ------------------------------------------------------------------ certificate
    def certificate(self, exact: bool = True) -> dict:
        """Full-history certificate. ``exact=True`` recomputes every cold gradient (cold x hot
        support kernel product) instead of relying on the screening bound."""
        hot = self._hot
        scr = self.stats["screened"] + self.stats["exact_checks"]
        out = {
            "C": self.C, "sigma": self.sigma, "gated": hot.gated,
            "n_live": self.n, "n_hot": self.n_hot, "n_cold": self.n_cold,
            "n_pinned": int(self._cpin.sum()),
            "hot_fraction": self.n_hot / self.n if self.n else 0.0,
            "readmissions": self.stats["readmissions"],
            "readmission_rounds": self.stats["readmission_rounds"],
            "uncertified_evictions": self.stats["uncertified_evictions"],
            "hot_fallbacks": int(getattr(hot, "fallbacks", 0)),
            "screening": {"exact_checks": self.stats["exact_checks"],
                          "screened": self.stats["screened"],
                          "fraction_screened": self.stats["screened"] / scr if scr else 0.0,
                          "enabled": self.screen},
            "kkt_tol": KKT_TOL,
        }
        if not hot.gated:
            out.update(future_safe=False, kkt_residual=None, margin_empty=None,
                       reason="warm-up: the gate is not solved; no certificate")
            return out
        kkt_hot = float(hot.kkt_residual()["max"])
        free = ~self._cpin
        if exact:
            g_free = np.concatenate([self._exact_g(self._store.get(self._cid[free]))] +
                                    ([] if free.any() else [np.zeros(0)]))
            cold_res = float(np.maximum(-g_free, 0.0).max(initial=0.0))
            pin_g = self._exact_g(self._store.get(self._cid[~free])) if (~free).any() else np.zeros(0)
            pin_res = float(np.maximum(-pin_g, 0.0).max(initial=0.0))
        else:
            bound = self._bound()
            cold_res = float(np.maximum(-bound[free], 0.0).max(initial=0.0))
            pin_res = None
        part = {k: len(v) for k, v in hot.partition().items()}
        kkt = max(kkt_hot, cold_res)
        safe = kkt <= KKT_TOL and not (~free).any()
        if (~free).any():
            reason = (f"UNCERTIFIED: the hot budget evicted {int((~free).sum())} live non-reserve "
                      "token(s) (pinned cold); scores are the optimum over hot + certified cold, "
                      "not over the full history")
        elif kkt > KKT_TOL:
            reason = f"full-history KKT residual {kkt:.3g} exceeds {KKT_TOL:g}"
        else:
            reason = ("hot alpha extended by zeros on the cold tier satisfies the fixed-C KKT "
                      "conditions over every live token: equals the full-history solve")
        out.update(covers=COVERS, does_not_cover=DOES_NOT_COVER)
        out.update(future_safe=bool(safe), reason=reason, margin_empty=part["margin"] == 0,
                   hot_partition=part, exact=bool(exact),
                   kkt_residual={"hot": kkt_hot, "cold": cold_res, "pinned": pin_res, "max": kkt})
        return out

    # ------------------------------------------------------------------ serialisation
    def to_state(self) -> dict:
        """Flat dict of arrays and scalars (``np.savez``-able) holding both tiers exactly."""
        st = {
            "format": STATE_FORMAT, "C": self.C, "sigma": self.sigma,
            "hot_budget": -1 if self.hot_budget is None else self.hot_budget,
            "screen": self.screen, "next_id": self._next_id, "A": self._A, "B": self._B,
            "dim": -1 if self._dim is None else self._dim,
            "forgotten": np.asarray(sorted(self._forgotten), dtype=np.int64),
            "hot_stream_ids": self._hot_sids(),
            "cold_ids": self._cid.copy(),
            "cold_keys": self._store.get(self._cid) if self._cid.size else np.zeros((0, self._dim or 0)),
            "cold_g0": self._cg0.copy(), "cold_rho0": self._crho0.copy(), "cold_A0": self._cA0.copy(),
            "cold_B0": self._cB0.copy(),
            "cold_pinned": self._cpin.copy(),
            "stats": np.asarray([self.stats[k] for k in sorted(self.stats)], dtype=np.int64),
        }
        for k, v in self._hot.to_state().items():
            st["hot/" + k] = v
        return st

    @classmethod
    def from_state(cls, state: dict, store: ColdStore | None = None, verify: bool = True) -> StreamingGate:
        """Rebuild from :meth:`to_state` (validated; :class:`InvalidStateError` on a malformed or
        inconsistent state, e.g. a cold key that violates KKT)."""
        from .streaming_state import load_state

        return load_state(cls, state, store, verify)

    def __repr__(self) -> str:
        return (f"StreamingGate(C={self.C:.6g}, sigma={self.sigma:g}, n={self.n}, hot={self.n_hot}, "
                f"cold={self.n_cold}, gated={self.gated})")


__all__ = ["StreamingGate", "ColdStore", "ArrayColdStore", "InvalidStateError", "alpha_change",
           "READMIT_TOL", "SCREEN_MARGIN", "KKT_TOL", "WarmupError", "GateError"]
