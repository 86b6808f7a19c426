"""The operations of :class:`sv_core.StreamingGate` (mixin): admission, reserve eviction,
deletion, the re-admission check and the all-or-nothing transaction around each of them.

Every operation runs in :meth:`StreamingOps._transact`: changes to the id maps, the cold tier
and the forgotten set append undo steps to a journal; the hot gate is saved (``to_state``) before
its first change. A failure anywhere replays the journal backwards, restores the hot gate and
the scalars, and clears the kernel cache, so the gate is exactly as before.
"""
from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from sv_core.errors import InfeasibleError, UnknownTokenError
from sv_core.gate import Gate
from sv_core.streaming.cert import build_certificate
from sv_core.streaming.screen import READMIT_TOL, SCREEN_MARGIN, HotView, step_bound
from sv_core.validation import as_keys, check_token_id

if TYPE_CHECKING:
    from sv_core.streaming.cache import KernelCache
    from sv_core.streaming.cold import ColdTier

#: the budget is rebased (every tau shifted) once it exceeds this, to keep tau's rounding small
REBASE_AT = 1.0


class StreamingOps:
    """Operations of :class:`sv_core.StreamingGate` (state set up by its constructor)."""

    # the host's state (set in StreamingGate.__init__ / from_state), declared for type checking
    C: float
    sigma: float
    screen: bool
    direct_cold: bool
    hot_budget: int | None
    stats: dict[str, int]
    _hot: Gate
    _view: HotView
    _h2s: dict[int, int]
    _s2h: dict[int, int]
    _cold: ColdTier
    _cache: KernelCache
    _b: float
    _next_id: int
    _forgotten: set[int]
    _dim: int | None
    _journal: list | None
    _hot_saved: tuple[str, Any] | None
    if TYPE_CHECKING:  # read-only properties of the host
        @property
        def n(self) -> int: ...
        @property
        def n_hot(self) -> int: ...
        @property
        def n_cold(self) -> int: ...
        @property
        def warmup_size(self) -> int: ...
        @property
        def hot_ids(self) -> np.ndarray: ...

    def _check_id(self, token_id) -> int:
        tid = check_token_id(token_id)
        if tid in self._forgotten:
            raise UnknownTokenError(f"token {tid} was already forgotten")
        if tid in self._s2h or tid in self._cold:
            return tid
        raise UnknownTokenError(f"token {tid} is not live in the streaming gate ({self.n} live)")

    def _undo(self, fn) -> None:
        if self._journal is not None:
            self._journal.append(fn)

    def _hot_change(self) -> None:
        """Call before changing the hot gate: keep a restorable copy once per operation."""
        if self._hot_saved is None:
            hot = self._hot
            # a solved hot tier below the warm-up size is refused by Gate.from_state: keep the object
            small = hot.gated and hot.n < hot.warmup_size
            self._hot_saved = ("gate", copy.deepcopy(hot)) if small else ("state", hot.to_state())

    def _account(self, before: HotView) -> None:
        """Refresh the hot view and add this step's drift bound to the screening budget."""
        self._view = after = HotView(self._hot)
        if before.gated and after.gated:
            neg, dw = step_bound(before, after, self.C, self.sigma)
            self._b += min(neg, dw)

    def _map(self, hids, sids) -> None:
        pairs = [(int(h), int(s)) for h, s in zip(hids, sids)]
        for h, s in pairs:
            self._h2s[h] = s
            self._s2h[s] = h

        def undo():
            for h, s in pairs:
                self._h2s.pop(h, None)
                self._s2h.pop(s, None)
        self._undo(undo)

    def _unmap(self, h: int) -> int:
        s = self._h2s.pop(h)
        del self._s2h[s]

        def undo():
            self._h2s[h], self._s2h[s] = s, h
        self._undo(undo)
        return s

    def _hot_admit(self, sids, keys) -> None:
        self._hot_change()
        before = self._view
        self._map(self._hot.admit(keys), sids)
        self._account(before)

    def _cold_g(self, sids, keys_of) -> np.ndarray:
        """Exact ``g`` of (future) cold keys against the hot state: through the kernel cache,
        or directly (a fresh kernel row) in the unscreened reference mode."""
        if not self.screen:
            return self._view.exact_g(keys_of(sids))
        return self._cache.g(self._view, sids, keys_of)

    def _cold_remove(self, sids) -> np.ndarray:
        self._cache.drop(sids)
        return self._cold.remove(sids)

    def _cold_add(self, sids, keys, g) -> None:
        self._cold.add(sids, keys, np.asarray(g) - self._view.rho + 2.0 * self._b)

    def _settle_cold(self) -> list[int]:
        """Re-admission check: move every cold key with ``g_j < -READMIT_TOL`` into the hot gate."""
        readmitted: list[int] = []
        cold = self._cold
        while self._hot.gated and cold.n_free:
            view = self._view
            if self.screen:
                pos = cold.candidates(SCREEN_MARGIN - view.rho + 2.0 * self._b)
            else:
                pos = cold.free_positions()
            n_c = int(pos.size)
            self.stats["exact_checks"] += n_c
            self.stats["screened"] += cold.n_free - n_c
            if n_c == 0:
                break
            sids = cold.sids_at(pos)
            g = self._cold_g(sids, cold.store.get)
            cold.set_tau(pos, g - view.rho + 2.0 * self._b)
            cold.refresh_min()
            bad = np.flatnonzero(g < -READMIT_TOL)
            if bad.size == 0:
                break
            bad = bad[np.argsort(g[bad], kind="stable")]  # most violated first
            back = sids[bad]
            self._hot_admit(back, self._cold_remove(back))
            readmitted += back.tolist()
            self.stats["readmissions"] += int(back.size)
            self.stats["readmission_rounds"] += 1
        return readmitted

    def _transact(self, fn):
        if self._b > REBASE_AT:  # between operations: keep tau and the budget small
            self._cold.shift_tau(2.0 * self._b)
            self._b = 0.0
        self._cold.maybe_compact()
        saved = (self._b, self._next_id, self._dim, dict(self.stats), self._view, self._cold.min_tau,
                 self._hot)
        self._journal, self._hot_saved = [], None
        self._cold.journal = self._journal
        try:
            return fn()
        except BaseException:
            journal, hot_saved = self._journal, self._hot_saved
            self._journal = self._cold.journal = None
            for undo in reversed(journal):
                undo()
            self._cache.reset()  # ids of the failed operation may be reused for other keys
            (self._b, self._next_id, self._dim, self.stats, self._view, self._cold.min_tau,
             self._hot) = saved
            if hot_saved is not None:
                kind, obj = hot_saved
                self._hot = obj if kind == "gate" else Gate.from_state(obj)
            raise
        finally:
            self._journal = self._cold.journal = None
            self._hot_saved = None

    # ------------------------------------------------------------------ operations
    def admit(self, X) -> np.ndarray:
        """Admit keys ``(d,)`` or ``(n, d)``: inert keys go to the cold tier, the others enter
        the hot tier by C&P increments; then the re-admission check. Returns new stable stream
        ids. On any error nothing changes."""
        A = as_keys(X, self._dim)
        if A.shape[0] == 0:
            return np.zeros(0, np.int64)

        def op():
            if self._dim is None:
                self._dim = int(A.shape[1])
            sids = np.arange(self._next_id, self._next_id + A.shape[0], dtype=np.int64)
            self._next_id += A.shape[0]
            hot = np.ones(A.shape[0], bool)
            if self.direct_cold and self._hot.gated:
                g = self._cold_g(sids, lambda ids: A[ids - sids[0]])
                hot = ~(g >= SCREEN_MARGIN)
                self._cache.drop(sids[hot])
                if not hot.all():
                    self._cold_add(sids[~hot], A[~hot], g[~hot])
                    self.stats["admitted_cold"] += int((~hot).sum())
            if hot.any():
                self._hot_admit(sids[hot], A[hot])
            self._settle_cold()
            return sids

        return self._transact(op)

    def evict_reserve(self) -> dict:
        """Move the hot tier's reserve keys (alpha = 0) to the cold tier. Then, with a hot
        budget, evict beyond the reserve set (uncertified). Returns a JSON-able certificate
        (hot KKT as guarded by the hot gate, cold by the screening records; see
        :meth:`certificate` for a recomputed one)."""
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
                ev, mc = self._evict_reserve_once()
                self._settle_cold()
                evicted += ev
                max_change = max(max_change, mc)
                if self.hot_budget is None or self._hot.n <= self.hot_budget:
                    break
                forced += self._force_evict(self._hot.n - self.hot_budget)
                self._settle_cold()
            self.stats["evicted"] += len(evicted)
            cert = self._certificate(exact=False, recompute_hot=False)
            cert.update(issued=True, evicted=evicted, budget_evicted=forced,
                        max_abs_score_change=max_change)
            return cert

        return self._transact(op)

    def _evict_reserve_once(self):
        view = self._view
        res = view.alpha == 0.0
        if not res.any():
            return [], 0.0
        self._hot_change()
        gcert = self._hot.evict_reserve(probes=view.keys[res])  # probes: the evicted keys
        ev_h = np.asarray(gcert.evicted, dtype=np.int64)
        if ev_h.size == 0:
            return [], float(gcert.max_abs_score_change or 0.0)
        keys = view.keys[np.searchsorted(view.ids, ev_h)] if np.all(np.diff(view.ids) > 0) else \
            view.keys[[int(np.flatnonzero(view.ids == h)[0]) for h in ev_h]]
        sids = np.asarray([self._unmap(int(h)) for h in ev_h], dtype=np.int64)
        self._account(view)  # zero in exact arithmetic (Proposition 1); kept for safety
        order = np.argsort(sids)
        sids, keys = sids[order], keys[order]
        self._cold_add(sids, keys, self._cold_g(sids, lambda ids: keys[np.searchsorted(sids, ids)]))
        return sids.tolist(), float(gcert.max_abs_score_change or 0.0)

    def _force_evict(self, k: int) -> list[int]:
        """Uncertified: drive the ``k`` oldest hot keys to 0 (C&P decrement), pin them cold."""
        out = []
        for s in self.hot_ids[:k]:
            if (self._hot.n - 1) * self.C < 1.0 - 1e-12:
                break
            h = self._s2h[int(s)]
            view = self._view
            key = view.keys[np.flatnonzero(view.ids == h)[0]][None, :]
            self._hot_change()
            self._hot.forget(h)
            self._unmap(h)
            self._account(view)
            self._cold.add([int(s)], key, None, pinned=True)
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
                self._hot_change()
                before = self._view
                hot_receipt = self._hot.forget(h).to_dict()
                hot_receipt["hot_token_id"], hot_receipt["token_id"] = h, tid  # stream id outside
                self._unmap(h)
                self._account(before)
            else:
                self._cold_remove([tid])
            self._forgotten.add(tid)
            self._undo(lambda: self._forgotten.discard(tid))
            readmitted = self._settle_cold()
            return {"token_id": tid, "tier": tier, "padded_from_cold": padded,
                    "readmitted": readmitted, "n_after": self.n, "n_hot_after": self.n_hot,
                    "hot_receipt": hot_receipt}

        return self._transact(op)

    def _pad(self, need: int) -> list[int]:
        """Bring ``need`` cold keys (unpinned, smallest bound first) into the hot gate; with
        ``g_j >= 0`` they enter as reserve and change nothing."""
        sids = self._cold.smallest_free(need)
        self._hot_admit(sids, self._cold_remove(sids))
        return sids.tolist()

    def _certificate(self, exact: bool, recompute_hot: bool) -> dict:
        return build_certificate(self, self._hot, self._view, self._cold, self._b, exact, recompute_hot)
