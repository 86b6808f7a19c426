"""The cold tier of :class:`sv_core.StreamingGate`: the keys (in a :class:`ColdStore`) and one
screening record per key, with O(1) work per operation unless the budget forces a rescreen.

Per key: its stream id, ``tau`` (``g_j >= tau_j + rho - 2 b``, see :mod:`sv_core.streaming.screen`)
and a *pinned* flag (evicted by the uncertified hot budget: never screened, never re-admitted).
Records sit in append-only arrays addressed through an id -> position map; a removal leaves a
dead slot (``tau = +inf``) that a compaction between operations reclaims once dead slots
outnumber live ones. ``min_tau`` is a lower bound on every free key's ``tau``, so a budget level
below it needs no scan; a scan (one vectorised comparison over the arrays) runs only when the
level passes it, and ends by recomputing the exact minimum.

Every change made while ``journal`` is a list appends its undo there; the owner replays them in
reverse to roll an operation back (positions are stable within an operation).
"""
from __future__ import annotations

import numpy as np

from sv_core.errors import UnknownTokenError
from sv_core.streaming.store import ColdStore

#: records are compacted only once the arrays hold more than this many slots
COMPACT_MIN = 1024


class ColdTier:
    """Cold keys (in ``store``) with their screening records."""

    def __init__(self, store: ColdStore):
        self.store = store
        self._sid = np.zeros(16, np.int64)
        self._tau = np.full(16, np.inf)
        self._pin = np.zeros(16, bool)
        self._used = 0
        self._pos: dict[int, int] = {}
        self.n_pinned = 0
        #: lower bound on ``tau`` over live free keys (+inf when there is none)
        self.min_tau = np.inf
        self.journal: list | None = None

    # ------------------------------------------------------------------ views
    def __len__(self) -> int:
        return len(self._pos)

    @property
    def n_free(self) -> int:
        return len(self._pos) - self.n_pinned

    def __contains__(self, sid: int) -> bool:
        return int(sid) in self._pos

    def pinned(self, sid: int) -> bool:
        return bool(self._pin[self._pos[int(sid)]])

    def _live(self) -> np.ndarray:
        return np.fromiter(self._pos.values(), dtype=np.int64, count=len(self._pos))

    def ids(self, which: str = "all") -> np.ndarray:
        """Live ids ascending; ``which`` = "all" | "free" | "pinned"."""
        p = self._live()
        if which != "all":
            p = p[~self._pin[p]] if which == "free" else p[self._pin[p]]
        return np.sort(self._sid[p])

    def records(self, sids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(tau, pinned)`` aligned with ``sids`` (tau = +inf for pinned keys)."""
        p = self.positions(sids)
        return self._tau[p].copy(), self._pin[p].copy()

    def positions(self, sids) -> np.ndarray:
        pos = self._pos
        lst = np.asarray(sids, dtype=np.int64).ravel().tolist()
        try:
            return np.fromiter((pos[s] for s in lst), dtype=np.int64, count=len(lst))
        except KeyError as exc:
            raise UnknownTokenError(f"token {exc.args[0]} is not in the cold tier") from exc

    # ------------------------------------------------------------------ changes
    def _grow(self, m: int) -> None:
        if self._used + m <= self._sid.size:
            return
        cap = max(16, 2 * (self._used + m))
        for name, fill in (("_sid", 0), ("_tau", np.inf), ("_pin", False)):
            old = getattr(self, name)
            new = np.full(cap, fill, dtype=old.dtype)
            new[:self._used] = old[:self._used]
            setattr(self, name, new)

    def add(self, sids, keys, tau, pinned: bool = False) -> None:
        """Store new cold keys with their records (``tau`` ignored for pinned keys)."""
        sids = np.asarray(sids, dtype=np.int64).ravel()
        if sids.size == 0:
            return
        self.store.add(sids, keys)
        self._grow(sids.size)
        lo, hi = self._used, self._used + sids.size
        self._sid[lo:hi] = sids
        t = np.full(sids.size, np.inf) if pinned else np.asarray(tau, dtype=np.float64).ravel()
        self._tau[lo:hi] = t
        self._pin[lo:hi] = pinned
        self._used = hi
        self._pos.update(zip(sids.tolist(), range(lo, hi)))
        if pinned:
            self.n_pinned += sids.size
        else:
            self.min_tau = min(self.min_tau, float(t.min()))
        if self.journal is not None:
            self.journal.append(lambda: self._undo_add(sids))

    def _undo_add(self, sids: np.ndarray) -> None:
        p = self.positions(sids)
        self.store.remove(sids)
        self.n_pinned -= int(self._pin[p].sum())
        self._kill(p, sids)

    def _kill(self, p: np.ndarray, sids: np.ndarray) -> None:
        self._tau[p] = np.inf
        self._pin[p] = False
        for s in sids.tolist():
            del self._pos[s]

    def remove(self, sids) -> np.ndarray:
        """Delete cold keys; returns their keys aligned with ``sids``."""
        sids = np.asarray(sids, dtype=np.int64).ravel()
        p = self.positions(sids)
        if np.unique(p).size != p.size:
            raise UnknownTokenError("a cold token is removed twice")
        keys = np.array(self.store.remove(sids), dtype=np.float64, copy=True)
        tau, pin = self._tau[p].copy(), self._pin[p].copy()
        self.n_pinned -= int(pin.sum())
        self._kill(p, sids)
        if self.journal is not None:
            self.journal.append(lambda: self._undo_remove(sids, p, keys, tau, pin))
        return keys

    def _undo_remove(self, sids, p, keys, tau, pin) -> None:
        self.store.add(sids, keys)
        self._sid[p], self._tau[p], self._pin[p] = sids, tau, pin
        self._pos.update(zip(sids.tolist(), p.tolist()))
        self.n_pinned += int(pin.sum())

    def set_tau(self, p: np.ndarray, tau: np.ndarray) -> None:
        if self.journal is not None:
            old = self._tau[p].copy()
            self.journal.append(lambda: self._tau.__setitem__(p, old))
        self._tau[p] = tau

    # ------------------------------------------------------------------ screening
    def candidates(self, level: float) -> np.ndarray:
        """Positions of free keys with ``tau < level`` (no scan while ``level <= min_tau``)."""
        if not level > self.min_tau:
            return np.zeros(0, np.int64)
        t = self._tau[:self._used]
        pos = np.flatnonzero(t < level)
        if pos.size == 0:  # the scan was paid: keep the exact minimum
            self.min_tau = float(t.min(initial=np.inf))
        return pos

    def free_positions(self) -> np.ndarray:
        p = self._live()
        return np.sort(p[~self._pin[p]])

    def sids_at(self, p: np.ndarray) -> np.ndarray:
        return self._sid[p].copy()

    def refresh_min(self) -> None:
        """Exact minimum of ``tau`` over free keys (dead and pinned slots hold +inf)."""
        self.min_tau = float(self._tau[:self._used].min(initial=np.inf))

    def smallest_free(self, k: int) -> np.ndarray:
        """Ids of the ``k`` free keys with the smallest ``tau`` (pinned keys after them)."""
        p = self._live()
        order = np.lexsort((self._tau[p], self._pin[p]))
        return self._sid[p[order[:k]]].copy()

    # ------------------------------------------------------------------ housekeeping (between operations)
    def shift_tau(self, delta: float) -> None:
        """``tau -= delta`` for every key (the budget was rebased by ``delta / 2``)."""
        self._tau[:self._used] -= delta
        self.min_tau -= delta

    def maybe_compact(self) -> None:
        if self._used <= COMPACT_MIN or 2 * len(self._pos) > self._used:
            return
        p = np.sort(self._live())
        n = p.size
        for name in ("_sid", "_tau", "_pin"):
            arr = getattr(self, name)
            arr[:n] = arr[p]
        self._tau[n:self._used] = np.inf
        self._pin[n:self._used] = False
        self._used = n
        self._pos = dict(zip(self._sid[:n].tolist(), range(n)))
