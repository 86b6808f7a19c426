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

from .kernels import rbf_kernel

#: default cap on stored kernel values (float64): 2**24 values = 128 MiB
MAX_ENTRIES = 2 ** 24


class KernelCache:
    """Rows: cold stream ids; columns: hot ids; values ``k(x_row, x_col)``."""

    def __init__(self, sigma: float, max_entries: int = MAX_ENTRIES):
        self.sigma = float(sigma)
        self.max_entries = max(int(max_entries), 0)
        self.reset()

    def reset(self) -> None:
        self._R = np.zeros((0, 0))
        self._rkeys = np.zeros((0, 0))
        self._row: dict[int, int] = {}
        self._free: list[int] = []
        self._nrow = 0
        self._ckeys = np.zeros((0, 0))
        self._col: dict[int, int] = {}
        self._chid: list[int] = []
        self._view = None
        self._acol = np.zeros(0)

    @property
    def n_rows(self) -> int:
        return len(self._row)

    # ------------------------------------------------------------------ columns
    def _sync(self, view) -> np.ndarray:
        """Coefficients aligned with the columns for ``view`` (new support keys get columns)."""
        if self._view is view:
            return self._acol
        sup = np.flatnonzero(view.alpha != 0.0)
        hids = view.ids[sup].tolist()
        new = [k for k, h in enumerate(hids) if h not in self._col]
        if new and self.max_entries:
            live = set(hids)
            stale = sum(1 for h in self._chid if h not in live)
            if stale > max(64, len(self._chid) - stale):
                self._compact_columns(live)
            self._add_columns([hids[k] for k in new], view.keys[sup[new]])
        a = np.zeros(len(self._chid))
        for h, v in zip(hids, view.alpha[sup].tolist()):
            c = self._col.get(h)
            if c is None:  # no room for columns: the cache is bypassed for this view
                self._view, self._acol = view, None
                return None
            a[c] = v
        self._view, self._acol = view, a
        return a

    def _add_columns(self, hids: list[int], keys: np.ndarray) -> None:
        n0, m = len(self._chid), len(hids)
        d = keys.shape[1]
        if self._ckeys.shape[0] < n0 + m or self._ckeys.shape[1] != d:
            cap = max(16, n0 + m + (n0 + m) // 4)
            if self._nrow and (self._R.shape[0] * cap > self.max_entries):
                self._clear_rows()
                if cap > self.max_entries:
                    return
            ck = np.zeros((cap, d))
            R = np.zeros((self._R.shape[0], cap))
            if n0:
                ck[:n0] = self._ckeys[:n0]
                R[:, :n0] = self._R[:, :n0]
            self._ckeys, self._R = ck, R
        self._ckeys[n0:n0 + m] = keys
        for k, h in enumerate(hids):
            self._col[h] = n0 + k
        self._chid += hids
        if self._nrow:
            self._R[:self._nrow, n0:n0 + m] = rbf_kernel(self._rkeys[:self._nrow], keys, self.sigma)

    def _compact_columns(self, live: set) -> None:
        keep = [c for c, h in enumerate(self._chid) if h in live]
        self._chid = [self._chid[c] for c in keep]
        self._col = {h: c for c, h in enumerate(self._chid)}
        n = len(keep)
        self._ckeys[:n] = self._ckeys[keep]
        if self._nrow:
            self._R[:self._nrow, :n] = self._R[:self._nrow][:, keep]
        self._view = None

    def _clear_rows(self) -> None:
        self._R = np.zeros((0, self._ckeys.shape[0]))
        self._rkeys = np.zeros((0, self._rkeys.shape[1] if self._rkeys.ndim == 2 else 0))
        self._row, self._free, self._nrow = {}, [], 0

    # ------------------------------------------------------------------ rows
    def _room(self, m: int, d: int) -> int:
        """Grow the row buffer for up to ``m`` more rows within the cap; returns rows available."""
        ncap = max(self._ckeys.shape[0], 1)
        have = len(self._free) + self._R.shape[0] - self._nrow
        if have >= m:
            return m
        limit = self.max_entries // ncap
        cap = min(max(16, 2 * (self._nrow + m)), limit)
        if cap > self._R.shape[0]:
            R = np.zeros((cap, self._ckeys.shape[0]))
            rk = np.zeros((cap, d))
            if self._nrow:
                R[:self._nrow] = self._R[:self._nrow]
                rk[:self._nrow] = self._rkeys[:self._nrow]
            self._R, self._rkeys = R, rk
        return min(m, len(self._free) + self._R.shape[0] - self._nrow)

    def g(self, view, sids: np.ndarray, keys_of) -> np.ndarray:
        """Exact ``g`` of cold keys ``sids`` against ``view``; ``keys_of(ids)`` returns their keys
        (asked only for rows not stored). New rows are stored while the cap allows."""
        sids = np.asarray(sids, dtype=np.int64)
        a = self._sync(view) if self.max_entries else None
        if a is None:
            return view.exact_g(keys_of(sids))
        out = np.empty(sids.size)
        lst = sids.tolist()
        rows = [self._row.get(s, -1) for s in lst]
        hit = np.fromiter((r >= 0 for r in rows), dtype=bool, count=len(rows))
        n = len(self._chid)
        if hit.any():
            r = np.asarray(rows, dtype=np.int64)[hit]
            out[hit] = self._R[r, :n] @ a
        miss = np.flatnonzero(~hit)
        if miss.size:
            keys = np.asarray(keys_of(sids[miss]), dtype=np.float64)
            K = rbf_kernel(keys, self._ckeys[:n], self.sigma) if n else np.zeros((miss.size, 0))
            out[miss] = K @ a
            k = self._room(miss.size, keys.shape[1])
            for i in range(k):
                row = self._free.pop() if self._free else self._nrow
                if row == self._nrow:
                    self._nrow += 1
                self._R[row, :n] = K[i]
                self._rkeys[row] = keys[i]
                self._row[lst[miss[i]]] = row
        return view.rho - 1.0 + 2.0 * out

    def drop(self, sids) -> None:
        for s in np.asarray(sids, dtype=np.int64).ravel().tolist():
            r = self._row.pop(s, None)
            if r is not None:
                self._free.append(r)
