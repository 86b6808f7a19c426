"""A stay's hourly content as the forget registry fingerprints it, and the build step that drops
a stay whose content a forgotten stay had (a re-keyed copy: another stay id, another subject).

Sources re-key records (hospital mergers, re-identification): a forgotten stay's measurements can
come back under a new stay id and a new subject id, which the id rules of
:func:`cohort.build.scan.exclude_stays` cannot see. The registry therefore also keeps keyed
fingerprints (HMAC under the ``content`` sub-key, :mod:`pipelines.store.keys`; never a value) of
the forgotten stays' *observed hourly means* — the build's own stage-4 output, which does not
depend on ids, on the split, on the fill or on the standardisation.

:func:`blocks` gives the canonical bytes that are fingerprinted: the whole stay, and each
24-hour block (hours counted from the stay's intime, so a copy shifted by whole days matches
too), each as the sorted (hour, six quantised values) rows with at least one observed vital.
A block is fingerprinted only if it holds at least :data:`MIN_CELLS` observed values of at least
:data:`MIN_DISTINCT` distinct values, so sparse, common content (a single charted 37.0 °C) can
never match another patient. :func:`drop_forgotten_content` runs between the scan and the
final cohort, only when the registry holds fingerprints: a matching stay's rows leave the spool
before any median, split or standardisation sees them, and the funnel step
``content_not_forgotten`` counts what is left.
"""
from __future__ import annotations

import numpy as np

from cohort._hourly import SIDX_SHIFT, hourly_means

#: values are compared after rounding to this many units (°C, mmHg, bpm, %, /min)
QUANTUM = 1e-3
DAY_HOURS = 24
#: a block is fingerprinted only with at least this many observed values …
MIN_CELLS = 24
#: … of at least this many distinct (quantised) values
MIN_DISTINCT = 8
_NONE = np.iinfo(np.int64).min
_TAG_STAY, _TAG_DAY = b"forgetful/content/stay/v1", b"forgetful/content/day/v1"


def _block(tag: bytes, hours: np.ndarray, q: np.ndarray, observed: np.ndarray) -> bytes | None:
    n = int(observed.sum())
    if n < MIN_CELLS or np.unique(q[observed]).size < MIN_DISTINCT:
        return None
    return tag + np.ascontiguousarray(hours, dtype="<i8").tobytes() + np.ascontiguousarray(q, dtype="<i8").tobytes()


def blocks(hours: np.ndarray, values: np.ndarray) -> list[bytes]:
    """Canonical bytes of one stay's observed hourly content (see the module docstring).

    Parameters
    ----------
    hours : (m,) int64 hour of each row (0 = the stay's first hour).
    values : (m, 6) float64 observed hourly means in :data:`cohort.constants.VITALS` order, NaN
        where the vital was not charted that hour.

    Returns the whole-stay block then the 24-hour blocks (only those dense enough; possibly none).
    """
    hours = np.asarray(hours, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(hours, kind="stable")
    h, v = hours[order], values[order]
    seen = ~np.isnan(v)
    rows = seen.any(axis=1)
    h, v, seen = h[rows], v[rows], seen[rows]
    q = np.where(seen, np.round(np.where(seen, v, 0.0) / QUANTUM), 0).astype(np.int64)
    q[~seen] = _NONE
    out = [_block(_TAG_STAY, h, q, seen)]
    day = h // DAY_HOURS
    for d in np.unique(day):
        sel = day == d
        out.append(_block(_TAG_DAY, h[sel] - d * DAY_HOURS, q[sel], seen[sel]))
    return [b for b in out if b is not None]


def drop_forgotten_content(scanned, exclude, funnel) -> int:
    """Drop every stay of the scan whose content matches a forgotten stay's fingerprint.

    ``exclude.contents(list of per-stay block lists) -> (n,) bool`` (the forget registry,
    :class:`pipelines.store.warehouse.ForgetExclusion`); nothing happens when ``exclude`` has no
    ``contents`` (None: no fingerprint to match). Rewrites the spool's buckets without the
    matching stays' rows, sets their usable-row count to 0 (so the final cohort drops them) and
    adds the funnel step ``content_not_forgotten``. Returns the number of stays dropped."""
    match = getattr(exclude, "contents", None)
    if match is None:
        return 0
    spool, n_ok = scanned.spool, scanned.per_stay["n_ok"]
    dropped = np.zeros(n_ok.size, dtype=bool)
    for b in range(spool.n_buckets):
        k, v = spool.read(b)
        if not k.size:
            continue
        o_sidx, o_hour, o_val = hourly_means(k, v, scanned.hours_of_sidx)
        stays, starts = np.unique(o_sidx, return_index=True)
        ends = np.append(starts[1:], o_sidx.size)
        hit = np.asarray(match([blocks(o_hour[a:e], o_val[a:e]) for a, e in zip(starts, ends)]), dtype=bool)
        if hit.any():
            dropped[stays[hit]] = True
            keep = ~np.isin(k >> SIDX_SHIFT, stays[hit])
            k, v = k[keep], v[keep]
        spool.add(k, v)
    spool.close()
    n_ok[dropped] = 0
    funnel.add("content_not_forgotten", int((n_ok > 0).sum()), int(n_ok.sum()))
    return int(dropped.sum())
