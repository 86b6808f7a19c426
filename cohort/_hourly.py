"""Out-of-core hourly aggregation and fill for :mod:`cohort.build` (NumPy, no row-level Python).

The measurement scan streams one packed ``int64`` key and one value per usable row::

    key = stay_idx << 43 | ms_since_intime << 5 | vs        (vs = vital·4 + source, 5 bits)

:class:`BucketSpool` routes the rows into ``n_buckets`` files by contiguous stay-index range, so
each bucket's work fits in memory whatever the input size. Per bucket,
:func:`hourly_means` sorts the keys (a stable sort: nearly linear on the usual
stay/time-ordered input), averages duplicated chartings (same stay, vital source and charttime
to the millisecond), then averages per (stay, hour, source) and combines the two blood-pressure
sources (mean of the two source means). :func:`fill_within_stays` lays the hours on the dense
grid 0..n_hours−1 and forward-/back-fills within each stay; what stays NaN (a stay that never
records the vital) is the cohort median, applied by the caller once every bucket is seen.
:class:`Moments` merges count/mean/M2 across buckets (Chan et al.) for the standardisation.

The slow, obvious counterpart of all of this is :func:`cohort.reference.reference_build`.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

import numpy as np

from cohort.constants import EVENT_THRESHOLDS, ITEMIDS, SPO2_EVENT_BELOW, VITAL_CODE, VITALS

HOUR_MS = 3_600_000
SIDX_SHIFT = 43
MS_SHIFT = 5
MS_MASK = (1 << (SIDX_SHIFT - MS_SHIFT)) - 1  # 38 bits of milliseconds (≈ 8.7 years)
MAX_STAYS = 1 << 20

#: (vital, source) slots of the per-hour means, in VITALS order; SLOT_OF_VS maps vs → slot.
SLOTS: list[tuple[str, int]] = [
    (v, s) for v in VITALS for s in sorted({s_ for (vv, s_, _) in ITEMIDS.values() if vv == v})
]
SLOT_OF_VS = np.full(32, -1, dtype=np.int64)
for _i, (_v, _s) in enumerate(SLOTS):
    SLOT_OF_VS[VITAL_CODE[_v] * 4 + _s] = _i
N_SLOTS = len(SLOTS)


class BucketSpool:
    """Append (key, value) rows into files per bucket of contiguous stay indices.

    Parameters
    ----------
    folder : scratch folder (created; the caller removes it).
    n_stays : number of stay indices (0 .. n_stays−1).
    n_buckets : number of buckets; bucket of stay index i is ``i·n_buckets // n_stays``.
    """

    def __init__(self, folder: Path, n_stays: int, n_buckets: int):
        self.folder = Path(folder)
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700, follow_symlinks=False)  # spooled values are record-level data: owner-only
        self.n_stays = int(n_stays)
        self.n_buckets = int(max(1, min(n_buckets, n_stays)))
        # smallest packed key of each bucket: bucket of key = last bound ≤ key
        self._key_lo = np.array([self.stay_range(b)[0] << SIDX_SHIFT for b in range(self.n_buckets)], dtype=np.int64)
        self._files: dict[tuple[int, str], BinaryIO] = {}

    def stay_range(self, b: int) -> tuple[int, int]:
        """Half-open stay-index range [lo, hi) of bucket ``b`` (those i with i·n_buckets // n_stays = b)."""
        lo = -(-b * self.n_stays // self.n_buckets)
        hi = -(-(b + 1) * self.n_stays // self.n_buckets)
        return lo, hi

    def _path(self, b: int, part: str) -> Path:
        return self.folder / f"bucket_{b:05d}.{part}"

    def add(self, k: np.ndarray, v: np.ndarray) -> None:
        """Append usable rows: ``k`` (n,) int64 packed keys ≥ 0, ``v`` (n,) float64 values."""
        if k.size == 0:
            return
        lo, hi = np.searchsorted(self._key_lo, [k.min(), k.max()], side="right") - 1
        if lo == hi:  # the usual case: input clustered by stay
            self._write(int(lo), k, v)
            return
        b = (np.searchsorted(self._key_lo, k, side="right") - 1).astype(np.int32)
        order = np.argsort(b, kind="stable")
        k, v = k[order], v[order]
        counts = np.bincount(b, minlength=self.n_buckets)
        ends = np.cumsum(counts)
        for j in np.flatnonzero(counts):
            sl = slice(ends[j] - counts[j], ends[j])
            self._write(int(j), k[sl], v[sl])

    def _write(self, b: int, k: np.ndarray, v: np.ndarray) -> None:
        for part, x in (("k", k), ("v", v)):
            f = self._files.get((b, part))
            if f is None:
                f = self._files[(b, part)] = open(self._path(b, part), "ab")
            # a full disk raises OSError(ENOSPC) here; ndarray.tofile raised an errno-less short-write error
            f.write(np.ascontiguousarray(x).data)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    def read(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """All rows of bucket ``b`` as (k (n,) int64, v (n,) float64); its files are then removed."""
        pk, pv = self._path(b, "k"), self._path(b, "v")
        if not pk.exists():
            return np.empty(0, np.int64), np.empty(0, np.float64)
        k, v = np.fromfile(pk, dtype=np.int64), np.fromfile(pv, dtype=np.float64)
        pk.unlink()
        pv.unlink()
        return k, v


def _bp_mean(a: np.ndarray, n: np.ndarray) -> np.ndarray:
    """(coalesce(a, n) + coalesce(n, a)) / 2: the mean of the two source means, or the one present."""
    a2 = np.where(np.isnan(a), n, a)
    n2 = np.where(np.isnan(n), a, n)
    return (a2 + n2) / 2


def hourly_means(k: np.ndarray, v: np.ndarray, n_hours: np.ndarray):
    """Hourly mean per vital from packed measurement keys.

    Parameters
    ----------
    k : (n,) int64 packed keys (see module docstring), any order.
    v : (n,) float64 converted, plausible values.
    n_hours : (n_stays,) int64 hours of each stay index; hour = ⌊ms / 1 h⌋ capped at n_hours − 1.

    Returns
    -------
    sidx : (m,) int64 stay index of each observed (stay, hour), sorted by (sidx, hour).
    hour : (m,) int64.
    values : (m, len(VITALS)) float64 hourly means, NaN where the vital was not charted.
    """
    nv = len(VITALS)
    if k.size == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty((0, nv))
    order = np.argsort(k, kind="stable")
    ks = k[order]
    vs = v[order]
    del order
    new = np.empty(ks.size, dtype=bool)
    new[0] = True
    np.not_equal(ks[1:], ks[:-1], out=new[1:])
    starts = np.flatnonzero(new)
    del new
    per_ts = np.add.reduceat(vs, starts) / np.diff(np.append(starts, ks.size))
    ku = ks[starts]
    del ks, vs, starts
    sidx = ku >> SIDX_SHIFT
    hour = np.minimum(((ku >> MS_SHIFT) & MS_MASK) // HOUR_MS, n_hours[sidx] - 1)
    slot = SLOT_OF_VS[ku & 31]
    hk = (sidx << 24) | hour  # non-decreasing: keys are sorted by (sidx, ms)
    newh = np.empty(hk.size, dtype=bool)
    newh[0] = True
    np.not_equal(hk[1:], hk[:-1], out=newh[1:])
    hstarts = np.flatnonzero(newh)
    block = np.cumsum(newh) - 1
    nb = hstarts.size
    idx = block * N_SLOTS + slot
    sums = np.bincount(idx, weights=per_ts, minlength=nb * N_SLOTS).reshape(nb, N_SLOTS)
    cnts = np.bincount(idx, minlength=nb * N_SLOTS).reshape(nb, N_SLOTS)
    with np.errstate(invalid="ignore", divide="ignore"):
        src_mean = sums / cnts
    out = np.empty((nb, nv))
    for j, vname in enumerate(VITALS):
        cols = [i for i, (vv, _) in enumerate(SLOTS) if vv == vname]
        if len(cols) == 1:
            out[:, j] = src_mean[:, cols[0]]
        else:
            out[:, j] = _bp_mean(src_mean[:, cols[0]], src_mean[:, cols[1]])
    return sidx[hstarts], hour[hstarts], out


def fill_within_stays(pos: np.ndarray, values: np.ndarray, n_hours: np.ndarray, fill: str = "backfill"):
    """Dense hourly grid of a run of consecutive stays, forward- then back-filled within each stay.

    ``fill="causal"`` forward-fills only (no value from a later hour reaches an earlier one): a
    leading gap stays NaN and the caller gives it the (frozen/training) cohort median.

    Parameters
    ----------
    pos : (m,) int64 row of each observed hour in the dense grid (stay offset + hour).
    values : (m, n_vitals) float64 hourly means (NaN: not charted that hour).
    n_hours : (s,) int64 hours of each stay, in grid order; the grid has N = Σ n_hours rows.

    Returns
    -------
    filled : (N, n_vitals) float64, NaN only where the stay never records the vital (causal:
        also before the vital's first record).
    observed : (N, n_vitals) bool, the hour had a measurement of the vital.
    """
    if fill not in ("backfill", "causal"):
        raise ValueError(f"fill must be 'backfill' or 'causal', got {fill!r}")
    n = int(n_hours.sum())
    nv = values.shape[1]
    filled = np.full((n, nv), np.nan)
    filled[pos] = values
    observed = ~np.isnan(filled)
    if n == 0:
        return filled, observed
    ends = np.cumsum(n_hours)
    first = np.repeat(ends - n_hours, n_hours)[:, None]
    last = np.repeat(ends - 1, n_hours)[:, None]
    ar = np.arange(n, dtype=np.int64)[:, None]
    prev = np.maximum.accumulate(np.where(observed, ar, -1), axis=0)
    nxt = np.minimum.accumulate(np.where(observed, ar, n)[::-1], axis=0)[::-1]
    if fill == "causal":
        src = np.where(prev >= first, prev, -1)
    else:
        src = np.where(prev >= first, prev, np.where(nxt <= last, nxt, -1))
    has = src >= 0
    cols = np.broadcast_to(np.arange(nv), src.shape)
    out = np.where(has, filled[np.where(has, src, 0), cols], np.nan)
    return out, observed


def events(filled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(event_composite, event_spo2), each (N,) bool, on filled raw values (N, n_vitals)."""
    comp = np.zeros(filled.shape[0], dtype=bool)
    for v, (lo, hi) in EVENT_THRESHOLDS.items():
        col = filled[:, VITALS.index(v)]
        if lo is not None:
            comp |= col < lo
        if hi is not None:
            comp |= col > hi
    return comp, filled[:, VITALS.index("spo2")] < SPO2_EVENT_BELOW


class Moments:
    """Count, mean and sum of squared deviations per column, merged across batches (Chan et al.)."""

    def __init__(self, n_cols: int):
        self.n = np.zeros(n_cols)
        self.mean = np.zeros(n_cols)
        self.m2 = np.zeros(n_cols)

    def add_group(self, j: int, n: float, mean: float, m2: float) -> None:
        if n <= 0:
            return
        tot = self.n[j] + n
        d = mean - self.mean[j]
        self.mean[j] += d * n / tot
        self.m2[j] += m2 + d * d * self.n[j] * n / tot
        self.n[j] = tot

    @staticmethod
    def group(x: np.ndarray) -> tuple[int, float, float]:
        """(count, mean, sum of squared deviations) of the values ``x`` (k,), for :meth:`add_group`."""
        if x.size == 0:
            return 0, 0.0, 0.0
        mu = float(x.mean())
        return int(x.size), mu, float(np.square(x - mu).sum())

    def sd(self, j: int) -> float | None:
        """Sample standard deviation of column ``j`` (None with fewer than 2 values)."""
        return None if self.n[j] < 2 else float(np.sqrt(self.m2[j] / (self.n[j] - 1)))
