"""Kernel rows of cold keys against the hot support, kept between re-checks (a pure cache).

An exact re-check of a cold key is ``g_j = rho - 1 + 2 sum_i alpha_i k(x_j, x_i)`` over the hot
support; computing the kernel row costs a distance and an ``exp`` per support key, a matrix-vector
product over a stored row is several times cheaper. :class:`KernelCache` keeps the rows of cold
keys (stream ids) against *columns* (hot ids of keys that were in the hot support). A key that
joins the support gets its column computed once for every stored row; a column whose key left
the support stays with coefficient 0 until columns are compacted. The values are the same
``rbf_kernel`` numbers an uncached re-check would compute, so results are exact either way.

Memory is capped at ``max_entries`` floats: rows that do not fit are computed on the fly. The
owner calls :meth:`reset` when it rolls an operation back (hot and stream ids may then be reused
for other keys) and :meth:`drop` when a cold key leaves the cold tier.
"""
from __future__ import annotations

import numpy as np

from sv_core.kernels import rbf_kernel, rbf_matvec

#: default cap on stored kernel values (float64): 2**24 values = 128 MiB
MAX_ENTRIES = 2 ** 24
#: when at least this fraction of the stored rows is re-checked, :meth:`KernelCache.g` multiplies
#: the whole row buffer (contiguous) instead of gathering the rows asked for
FULL_PASS_FRACTION = 0.35


def _grow_map(m: np.ndarray, need: int) -> np.ndarray:
    """An id -> index map (-1 = absent) long enough for ids < ``need``."""
    if need <= m.size:
        return m
    out = np.full(max(64, 2 * need), -1, dtype=np.int64)
    out[:m.size] = m
    return out


class KernelCache:
    """Rows: cold stream ids; columns: hot ids; values ``k(x_row, x_col)``."""

    def __init__(self, sigma: float, max_entries: int = MAX_ENTRIES):
        self.sigma = float(sigma)
        self.max_entries = max(int(max_entries), 0)
        self.reset()

    def reset(self) -> None:
        self._R = np.zeros((0, 0))
        self._rkeys = np.zeros((0, 0))
        self._row_of = np.zeros(0, np.int64)   # stream id -> row (-1: not stored)
        self._rsid = np.zeros(0, np.int64)     # row -> stream id (-1: free)
        self._free: list[int] = []
        self._nrow = 0
        self._ckeys = np.zeros((0, 0))
        self._col_of = np.zeros(0, np.int64)   # hot id -> column (-1: none)
        self._chid = np.zeros(0, np.int64)     # column -> hot id
        self._ncol = 0
        self._view = None
        self._acol = None

    @property
    def n_rows(self) -> int:
        return self._nrow - len(self._free)

    # ------------------------------------------------------------------ columns
    def _sync(self, view):
        """Coefficients aligned with the columns for ``view`` (new support keys get columns);
        None when the columns do not fit under the cap (the cache is then bypassed)."""
        if self._view is view:
            return self._acol
        sup = np.flatnonzero(view.alpha != 0.0)
        hids = view.ids[sup]
        self._col_of = _grow_map(self._col_of, int(hids.max(initial=-1)) + 1)
        cols = self._col_of[hids]
        if (cols < 0).any():
            stale = self._ncol - int((cols >= 0).sum())
            if stale > max(32, (self._ncol - stale) // 4):  # stale columns cost every re-check
                self._compact_columns(hids[cols >= 0])
            new = np.flatnonzero(self._col_of[hids] < 0)
            self._add_columns(hids[new], view.keys[sup[new]])
            cols = self._col_of[hids]
        if (cols < 0).any():
            self._view, self._acol = view, None
            return None
        a = np.zeros(self._ncol)
        a[cols] = view.alpha[sup]
        self._view, self._acol = view, a
        return a

    def _add_columns(self, hids: np.ndarray, keys: np.ndarray) -> None:
        n0, m = self._ncol, hids.size
        d = keys.shape[1]
        if self._ckeys.shape[0] < n0 + m or self._ckeys.shape[1] != d:
            cap = max(16, n0 + m + (n0 + m) // 4)
            if cap > self.max_entries:
                return
            if self._R.shape[0] * cap > self.max_entries:
                self._clear_rows()
            ck, chid = np.zeros((cap, d)), np.full(cap, -1, dtype=np.int64)
            R = np.zeros((self._R.shape[0], cap))
            if n0:
                ck[:n0], chid[:n0] = self._ckeys[:n0], self._chid[:n0]
                R[:, :n0] = self._R[:, :n0]
            self._ckeys, self._chid, self._R = ck, chid, R
        self._ckeys[n0:n0 + m] = keys
        self._chid[n0:n0 + m] = hids
        self._col_of[hids] = np.arange(n0, n0 + m)
        self._ncol = n0 + m
        if self._nrow:
            self._R[:self._nrow, n0:n0 + m] = rbf_kernel(self._rkeys[:self._nrow], keys, self.sigma)

    def _compact_columns(self, live_hids: np.ndarray) -> None:
        keep = np.sort(self._col_of[live_hids])
        self._col_of[self._chid[:self._ncol]] = -1
        n = keep.size
        self._ckeys[:n] = self._ckeys[keep]
        self._chid[:n] = self._chid[keep]
        self._col_of[self._chid[:n]] = np.arange(n)
        if self._nrow:
            self._R[:self._nrow, :n] = self._R[:self._nrow][:, keep]
        self._ncol = n
        self._view = None

    def _clear_rows(self) -> None:
        self._R = np.zeros((0, self._ckeys.shape[0]))
        self._row_of[:] = -1
        self._rsid = np.zeros(0, np.int64)
        self._free, self._nrow = [], 0

    # ------------------------------------------------------------------ rows
    def _take_rows(self, m: int, d: int) -> np.ndarray:
        """Up to ``m`` free row indices (the buffer grows within the cap)."""
        spare = self._R.shape[0] - self._nrow
        if len(self._free) + spare < m:
            limit = self.max_entries // max(self._ckeys.shape[0], 1)
            cap = min(max(16, 2 * (self._nrow + m)), limit)
            if cap > self._R.shape[0]:
                R, rk = np.zeros((cap, self._ckeys.shape[0])), np.zeros((cap, d))
                rsid = np.full(cap, -1, dtype=np.int64)
                if self._nrow:
                    R[:self._nrow], rk[:self._nrow] = self._R[:self._nrow], self._rkeys[:self._nrow]
                    rsid[:self._nrow] = self._rsid[:self._nrow]
                self._R, self._rkeys, self._rsid = R, rk, rsid
            spare = self._R.shape[0] - self._nrow
        k = min(m, len(self._free))
        rows = [self._free.pop() for _ in range(k)]
        extra = min(m - k, spare)
        rows += range(self._nrow, self._nrow + extra)
        self._nrow += extra
        return np.asarray(rows, dtype=np.int64)

    def g(self, view, sids: np.ndarray, keys_of) -> np.ndarray:
        """Exact ``g`` of cold keys ``sids`` against ``view``; ``keys_of(ids)`` returns their keys
        (asked only for rows not stored). New rows are stored while the cap allows."""
        sids = np.asarray(sids, dtype=np.int64)
        a = self._sync(view) if self.max_entries else None
        if a is None:
            return view.exact_g(keys_of(sids))
        self._row_of = _grow_map(self._row_of, int(sids.max(initial=-1)) + 1)
        rows = self._row_of[sids]
        hit = rows >= 0
        n = self._ncol
        out = np.empty(sids.size)
        if hit.any():
            h = np.flatnonzero(hit)
            if h.size >= FULL_PASS_FRACTION * self._nrow:
                # most stored rows are asked for: one contiguous pass over the buffer is cheaper
                # than gathering scattered rows (the gather copies every row it touches)
                out[h] = (self._R[:self._nrow, :n] @ a)[rows[h]]
            else:
                o = np.argsort(rows[h])  # rows in memory order: the gather streams through the buffer
                out[h[o]] = self._R[rows[h[o]], :n] @ a
        if not hit.all():
            miss = np.flatnonzero(~hit)
            keys = np.asarray(keys_of(sids[miss]), dtype=np.float64)
            new = self._take_rows(miss.size, keys.shape[1])
            k = new.size
            if k:  # the rows the cap allows to store: formed once, kept
                K = rbf_kernel(keys[:k], self._ckeys[:n], self.sigma)
                out[miss[:k]] = K @ a
                self._R[new, :n] = K
                self._rkeys[new] = keys[:k]
                self._rsid[new] = sids[miss[:k]]
                self._row_of[sids[miss[:k]]] = new
            if k < miss.size:  # the rest in cache-sized blocks, never as one (misses x support) matrix
                out[miss[k:]] = rbf_matvec(keys[k:], self._ckeys[:n], a, self.sigma)
        return view.rho - 1.0 + 2.0 * out

    def drop(self, sids) -> None:
        sids = np.asarray(sids, dtype=np.int64).ravel()
        sids = sids[sids < self._row_of.size]
        rows = self._row_of[sids]
        rows = rows[rows >= 0]
        self._row_of[self._rsid[rows]] = -1
        self._rsid[rows] = -1
        self._free.extend(rows.tolist())
