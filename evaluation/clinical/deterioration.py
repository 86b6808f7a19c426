"""Deterioration prediction (seed 001 §5): at every hour, will a composite event occur within the
next 6 hours? The protocol and its data: causal features, labels, model input rows, and the
streaming reader that cuts them from the warehouse a shard of windows at a time. Training and
scoring: :mod:`evaluation.clinical.deterioration_training`; the paired, stay-clustered bootstrap:
:mod:`evaluation.cluster_bootstrap`; the Prefect flow: :mod:`pipelines.flows.clinical_deterioration`.

Protocol (``PROTOCOL``)
-----------------------
* **Causal features** (F = 12 per hour): the 6 vitals rebuilt from the warehouse's *observed*
  hourly values only — forward fill within the stay, and the **training-split median** of the
  observed hourly values for hours before a vital's first measurement (never a later value) —
  standardised with the warehouse ``standardisation`` table, plus the 6 ``_observed`` flags. The
  warehouse's own ``_z`` columns are forward- *then back-* filled, so an hour before a vital's
  first measurement carries that future measurement; :func:`backfill_exposure` counts such hours
  (the share of scored hours that the old loader fed a back-filled value is reported).
* **Labels** at hour t: any event in hours t+1 … t+6 (:func:`future_event_labels`); hours
  without 6 future hours in the stay are not scored. Two event definitions (``label=``):
  ``"filled"`` — the warehouse ``event_composite``: SPEC §2 thresholds on the *filled* values
  (forward fill → back fill → training median), so an hour without a reading of the triggering
  vital can be an event; ``"observed"`` — an hour is an event only if a vital *measured that
  hour* crosses its threshold (same thresholds, on observed values).
* **Rows** (``mode=``): ``"sliding"`` (default) — each stay is cut into consecutive blocks of
  ``window`` scored hours; a block is read after up to ``context`` preceding hours of the same
  stay (carried context, recomputed), so every hour is scored once and sees at least
  ``min(context, t)`` hours of history (``context = 0``: disjoint windows). ``"stay"`` — one
  whole-stay row per stay. A row is a *window*; :class:`SplitIndex` lists them.

Streaming (bounded memory)
--------------------------
:func:`split_index` reads only the stay lengths of a split (one DuckDB ``GROUP BY``) and lists
its windows as ``(stay, input start, scoring start, end)`` — 32 bytes per window, the only
per-split state. :func:`load_windows` reads the hours of the stays a set of windows needs (one
DuckDB query), builds their causal features vectorised over the shard (:func:`block_features`)
and cuts the rows (:func:`cut_windows`); :func:`iter_shards` does it a shard of windows at a
time, so a training epoch or a scoring pass holds one shard, whatever the number of stays. The
per-stay functions (:func:`stay_features`, :func:`sequences`) are the slow references the shard
path is tested against.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from cohort.constants import OBSERVED_COLUMNS, VITALS
from evaluation.errors import EvaluationError

HORIZON = 6
MODELS = ("lstm", "softmax", "sv_attention")
LABEL_VARIANTS = ("filled", "observed")
SEQUENCE_MODES = ("sliding", "stay")
PROTOCOL = "causal-ffill+train-median/v2"
LABEL_TEXT = {
    "filled": "event_composite on filled values (forward fill, back fill, training median): an hour can be an "
              "event without a reading of the triggering vital",
    "observed": "observed-only: an hour is an event only if a vital measured that hour crosses its threshold",
}
N_FEATURES = 2 * len(VITALS)  # causal z-scores + observed flags
#: windows per shard of the streaming reader (about 6 MB of rows at 96 h x 12 features)
SHARD_WINDOWS = 1024


class DeteriorationInputError(EvaluationError):
    """Bad input to the deterioration study (mode, label, window, an empty split, a vital never
    observed, a warehouse that changed while it was read)."""


@contextlib.contextmanager
def connect(con_or_path) -> Iterator[duckdb.DuckDBPyConnection]:
    """The caller's DuckDB connection (left open), or a read-only one on a warehouse path (closed)."""
    if isinstance(con_or_path, duckdb.DuckDBPyConnection):
        yield con_or_path
        return
    p = Path(con_or_path)
    if not p.is_file():
        raise DeteriorationInputError(f"warehouse {p} does not exist; build it with `forgetful build-cohort`")
    con = duckdb.connect(str(p), read_only=True)
    try:
        yield con
    finally:
        con.close()


# --------------------------------------------------------------------------------------------
# labels and causal features of one stay (the references)
# --------------------------------------------------------------------------------------------
def future_event_labels(events: np.ndarray, horizon: int = HORIZON) -> tuple[np.ndarray, np.ndarray]:
    """y[t] = any(events[t+1 : t+1+horizon]); mask[t] = t + horizon < n. Shapes (n,), (n,)."""
    ev = np.asarray(events, dtype=bool)
    n = ev.size
    c = np.concatenate([[0], np.cumsum(ev)])
    t = np.arange(n)
    hi = np.minimum(t + 1 + horizon, n)
    y = (c[hi] - c[np.minimum(t + 1, n)]) > 0
    return y, t + horizon < n


def future_event_labels_reference(events, horizon: int = HORIZON):
    """Slow reference for :func:`future_event_labels` (explicit loop)."""
    ev = list(map(bool, events))
    n = len(ev)
    y = np.array([any(ev[t + 1:t + 1 + horizon]) for t in range(n)], dtype=bool)
    return y, np.array([t + horizon < n for t in range(n)], dtype=bool)


def causal_fill(raw: np.ndarray, observed: np.ndarray, medians: np.ndarray) -> np.ndarray:
    """Forward fill of the observed values of one stay; hours before a vital's first observation
    take ``medians`` (training split). raw, observed (n, V); medians (V,) -> (n, V) float64.
    The value at hour t depends only on observations at hours <= t."""
    return _fill_blocks(raw, observed, np.array([0, np.shape(observed)[0]]), medians)


def causal_fill_reference(raw, observed, medians) -> np.ndarray:
    """Slow reference for :func:`causal_fill` (explicit loop)."""
    raw = np.asarray(raw, dtype=np.float64)
    out = np.empty_like(raw)
    for j in range(raw.shape[1]):
        last = None
        for t in range(raw.shape[0]):
            if observed[t][j]:
                last = raw[t, j]
            out[t, j] = medians[j] if last is None else last
    return out


def backfill_exposure(observed: np.ndarray) -> np.ndarray:
    """(n,) bool: hours at which some vital has not been measured yet but is measured later in the
    stay — exactly the hours a forward-then-back fill gives a value from the future."""
    obs = np.asarray(observed, dtype=bool)
    seen = np.maximum.accumulate(obs, axis=0)
    later = np.flip(np.maximum.accumulate(np.flip(obs, 0), axis=0), 0)
    return np.any(~seen & later, axis=1)


def label_events(raw: np.ndarray, observed: np.ndarray, event_composite: np.ndarray, label: str) -> np.ndarray:
    """Per-hour event flags (n,) under one of :data:`LABEL_VARIANTS` (see module doc)."""
    if label == "filled":
        return np.asarray(event_composite, dtype=bool)
    if label == "observed":
        from cohort._hourly import events

        return events(np.where(observed, raw, np.nan))[0]
    raise DeteriorationInputError(f"unknown label {label!r}; choose from {LABEL_VARIANTS}")


def feature_stats(warehouse) -> dict[str, np.ndarray]:
    """mean, sd (the warehouse ``standardisation`` table) and median (its ``median`` column when the
    build recorded one, else the median of the training split's observed hourly values) per vital."""
    with connect(warehouse) as con:
        cols = {r[0] for r in con.execute("DESCRIBE standardisation").fetchall()}
        rows = {r[0]: r[1:] for r in con.execute(
            "SELECT vital, mean, sd" + (", median" if "median" in cols else "") + " FROM standardisation").fetchall()}
        med = []
        for v, ob in zip(VITALS, OBSERVED_COLUMNS):
            if "median" in cols:
                med.append(rows[v][2])
                continue
            q = (f"SELECT median(h.{v}) FROM vitals_hourly h JOIN cohort_stays s USING (stay_id) "
                 f"WHERE h.{ob} AND s.split = ?")
            m = con.execute(q, ["train"]).fetchone()[0]
            if m is None:  # no training observation: all stays (as the warehouse build does)
                m = con.execute(q.replace("s.split = ?", "TRUE")).fetchone()[0]
            if m is None:
                raise DeteriorationInputError(f"vital {v!r} is never observed; cannot impute")
            med.append(m)
    return {"mean": np.array([rows[v][0] for v in VITALS], dtype=np.float64),
            "sd": np.array([rows[v][1] for v in VITALS], dtype=np.float64),
            "median": np.array(med, dtype=np.float64)}


@dataclass
class StayFeatures:
    x: np.ndarray          # (n, 12) float32 causal z + observed flags
    events: np.ndarray     # (n,) bool under the chosen label
    y: np.ndarray          # (n,) bool future-event label
    m: np.ndarray          # (n,) bool scored
    backfilled: np.ndarray  # (n,) bool the old loader fed a back-filled value at this hour


def stay_features(warehouse, split: str, label: str = "filled", stats: dict | None = None) -> list[StayFeatures]:
    """Reference: causal features and labels of every stay of one split (ascending stay_id), one
    stay at a time with the per-stay functions; holds the whole split."""
    from cohort.streams import iter_stays

    _check_label(label)
    st = stats or feature_stats(warehouse)
    out = []
    for s in iter_stays(warehouse, split=split):
        z = (causal_fill(s.raw, s.observed, st["median"]) - st["mean"]) / st["sd"]
        ev = label_events(s.raw, s.observed, s.event_composite, label)
        y, m = future_event_labels(ev)
        out.append(StayFeatures(np.hstack([z, s.observed]).astype(np.float32), ev, y, m,
                                backfill_exposure(s.observed)))
    return out


# --------------------------------------------------------------------------------------------
# the same, vectorised over a block of stays (the streaming path)
# --------------------------------------------------------------------------------------------
def _check_label(label: str) -> None:
    if label not in LABEL_VARIANTS:
        raise DeteriorationInputError(f"unknown label {label!r}; choose from {LABEL_VARIANTS}")


def _fill_blocks(raw, observed, starts, medians) -> np.ndarray:
    """Causal fill of stays stacked row-wise (stay j = rows ``starts[j]:starts[j+1]``): the last
    observed value at or before each hour within its own stay, else the median."""
    obs = np.asarray(observed, dtype=bool)
    r = np.arange(obs.shape[0])
    first = np.repeat(np.asarray(starts[:-1]), np.diff(starts))  # first row of each row's stay
    prev = np.maximum.accumulate(np.where(obs, r[:, None], (first - 1)[:, None]), axis=0)
    cols = np.broadcast_to(np.arange(obs.shape[1]), prev.shape)
    vals = np.asarray(raw, dtype=np.float64)[np.maximum(prev, 0), cols]
    return np.where(prev >= first[:, None], vals, np.asarray(medians, dtype=np.float64)[None, :])


@dataclass
class StayBlock:
    """Causal features of several stays stacked row-wise: stay j is rows ``starts[j]:starts[j+1]``
    (R rows in all). x (R, 12) float32; events, y, m, backfilled (R,) bool as in :class:`StayFeatures`."""

    starts: np.ndarray
    x: np.ndarray
    events: np.ndarray
    y: np.ndarray
    m: np.ndarray
    backfilled: np.ndarray


def block_features(raw: np.ndarray, observed: np.ndarray, event_composite: np.ndarray, starts: np.ndarray,
                   stats: dict, label: str = "filled") -> StayBlock:
    """:class:`StayFeatures` of every stay of a block at once (same values as :func:`stay_features`).
    raw, observed (R, 6); event_composite (R,); starts (S+1,) row offsets."""
    _check_label(label)
    starts = np.asarray(starts, dtype=np.int64)
    obs = np.asarray(observed, dtype=bool)
    z = (_fill_blocks(raw, obs, starts, stats["median"]) - stats["mean"]) / stats["sd"]
    ev = label_events(raw, obs, event_composite, label)  # per hour: no cross-stay dependence
    n = np.diff(starts)
    stay_end = np.repeat(starts[1:], n)
    r = np.arange(obs.shape[0])
    c = np.concatenate([[0], np.cumsum(ev)])
    hi = np.minimum(r + 1 + HORIZON, stay_end)
    y = (c[hi] - c[np.minimum(r + 1, stay_end)]) > 0
    m = r + HORIZON < stay_end
    first = np.repeat(starts[:-1], n)
    seen = _segment_accumulate(obs, first)
    later = _segment_accumulate(obs[::-1], (obs.shape[0] - 1 - (stay_end - 1))[::-1])[::-1]
    return StayBlock(starts, np.hstack([z, obs]).astype(np.float32), ev, y, m, np.any(~seen & later, axis=1))


def _segment_accumulate(obs: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Running OR of obs (R, V) down the rows, restarted at each row's segment start ``first``."""
    r = np.arange(obs.shape[0])
    last = np.maximum.accumulate(np.where(obs, r[:, None], -1), axis=0)
    return last >= first[:, None]


# --------------------------------------------------------------------------------------------
# model input rows
# --------------------------------------------------------------------------------------------
@dataclass
class SeqData:
    """x (N, T, F) float32; y (N, T) float32; m (N, T) bool scored; group (N,) stay index within the
    split; now (N, T) bool the current hour's event flag (the "event now" baseline); length (N,)
    valid hours of each row."""

    x: np.ndarray
    y: np.ndarray
    m: np.ndarray
    group: np.ndarray
    now: np.ndarray | None = None
    length: np.ndarray | None = None

    def scored(self, a: np.ndarray) -> np.ndarray:
        """Values of a (N, T) array at the scored hours, row-major (aligned across models)."""
        return a[self.m]


def _check_rows(mode: str, window: int, context: int) -> None:
    if mode not in SEQUENCE_MODES:
        raise DeteriorationInputError(f"unknown sequence mode {mode!r}; choose from {SEQUENCE_MODES}")
    if window < 1 or context < 0:
        raise DeteriorationInputError(f"window must be >= 1 and context >= 0; got {window}, {context}")


def sequences(stays: Sequence[StayFeatures], mode: str = "sliding", window: int = 48,
              context: int = 48) -> SeqData:
    """Reference: rows of the model input from per-stay features (see module doc, "Rows"). Each
    scored hour is scored in exactly one row; rows are padded at the end to the longest row."""
    _check_rows(mode, window, context)
    pieces = []  # (stay index, start of input, start of scoring, end)
    for j, s in enumerate(stays):
        n = len(s.y)
        if mode == "stay":
            if s.m.any():
                pieces.append((j, 0, 0, n))
            continue
        for a in range(0, n, window):
            b = min(a + window, n)
            if s.m[a:b].any():
                pieces.append((j, max(0, a - context), a, b))
    if not pieces:
        raise DeteriorationInputError(f"no scorable hour (stays shorter than {HORIZON + 1} h?)")
    T = max(e - c for _, c, _, e in pieces)
    N, F = len(pieces), stays[0].x.shape[1]
    x = np.zeros((N, T, F), np.float32)
    y = np.zeros((N, T), np.float32)
    m = np.zeros((N, T), bool)
    now = np.zeros((N, T), bool)
    length = np.empty(N, np.int64)
    for i, (j, c, a, e) in enumerate(pieces):
        s, L = stays[j], e - c
        x[i, :L] = s.x[c:e]
        y[i, :L] = s.y[c:e]
        m[i, a - c:L] = s.m[a:e]
        now[i, :L] = s.events[c:e]
        length[i] = L
    return SeqData(x, y, m, np.array([p[0] for p in pieces]), now, length)


def window_pieces(lengths: np.ndarray, mode: str = "sliding", window: int = 48, context: int = 48) -> np.ndarray:
    """The windows of stays of the given lengths, as (W, 4) int64 rows ``(stay, input start c,
    scoring start a, end e)`` in stay then time order — the rows :func:`sequences` builds."""
    _check_rows(mode, window, context)
    n = np.asarray(lengths, dtype=np.int64)
    if mode == "stay":
        j = np.flatnonzero(n > HORIZON)
        z = np.zeros_like(j)
        return np.stack([j, z, z, n[j]], axis=1)
    count = np.where(n > HORIZON, -(-(n - HORIZON) // window), 0)  # block starts a with a + HORIZON < n
    j = np.repeat(np.arange(n.size), count)
    a = (np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)) * window
    return np.stack([j, np.maximum(0, a - context), a, np.minimum(a + window, n[j])], axis=1).astype(np.int64)


def cut_windows(block: StayBlock, stay_of: np.ndarray, pieces: np.ndarray, T: int | None = None) -> SeqData:
    """Rows of ``pieces`` (W, 4) cut from ``block``; ``stay_of[k]`` = the block position of the
    stay named in ``pieces[k, 0]`` (which stays as the row's group). Rows padded to ``T``
    (default: the longest row)."""
    c, a, e = pieces[:, 1], pieces[:, 2], pieces[:, 3]
    L = e - c
    T = int(L.max()) if T is None else int(T)
    t = np.arange(T)[None, :]
    valid = t < L[:, None]
    src = np.where(valid, block.starts[stay_of][:, None] + c[:, None] + t, 0)
    m = valid & (t >= (a - c)[:, None]) & block.m[src]
    x = np.where(valid[..., None], block.x[src], np.float32(0))
    return SeqData(x.astype(np.float32, copy=False), np.where(valid, block.y[src], False).astype(np.float32), m,
                   pieces[:, 0].copy(), valid & block.events[src], L.astype(np.int64))


# --------------------------------------------------------------------------------------------
# split index and the streaming reader
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SplitIndex:
    """The windows of one split without their data. stay_ids, lengths (S,) ascending stay_id;
    pieces (W, 4) from :func:`window_pieces` (stay = position in ``stay_ids``)."""

    split: str
    stay_ids: np.ndarray
    lengths: np.ndarray
    pieces: np.ndarray

    @property
    def n_windows(self) -> int:
        return int(self.pieces.shape[0])

    @property
    def longest(self) -> int:
        """The longest row (hours)."""
        return int((self.pieces[:, 3] - self.pieces[:, 1]).max()) if self.n_windows else 0

    @property
    def scored_hours(self) -> int:
        return int(np.minimum(self.pieces[:, 3], self.lengths[self.pieces[:, 0]] - HORIZON).sum()
                   - self.pieces[:, 2].sum()) if self.n_windows else 0

    def sample_stays(self, k: int | None, seed: int = 0) -> SplitIndex:
        """A deterministic sample of ``k`` stays (all when ``k`` is None or >= the stays), renumbered
        in stay_id order, with all their windows."""
        S = self.stay_ids.size
        if k is None or k >= S:
            return self
        keep = np.sort(np.random.default_rng(seed).choice(S, int(k), replace=False))
        new = np.full(S, -1, dtype=np.int64)
        new[keep] = np.arange(keep.size)
        p = self.pieces[np.isin(self.pieces[:, 0], keep)].copy()
        p[:, 0] = new[p[:, 0]]
        return replace(self, stay_ids=self.stay_ids[keep], lengths=self.lengths[keep], pieces=p)

    def sample_windows(self, k: int | None, seed: int = 0) -> SplitIndex:
        """A deterministic sample of ``k`` windows (all when None or >= the windows), in order."""
        if k is None or k >= self.n_windows:
            return self
        keep = np.sort(np.random.default_rng(seed).choice(self.n_windows, int(k), replace=False))
        return replace(self, pieces=self.pieces[keep])


def split_index(warehouse, split: str, mode: str = "sliding", window: int = 48, context: int = 48) -> SplitIndex:
    """:class:`SplitIndex` of one split: stay lengths by one DuckDB aggregate, windows from them."""
    _check_rows(mode, window, context)
    with connect(warehouse) as con:
        d = con.execute(
            "SELECT s.stay_id, count(h.stay_id) AS n FROM cohort_stays s LEFT JOIN vitals_hourly h USING (stay_id) "
            "WHERE s.split = ? GROUP BY s.stay_id ORDER BY s.stay_id", [split]).fetchnumpy()
    ids, n = np.asarray(d["stay_id"], dtype=np.int64), np.asarray(d["n"], dtype=np.int64)
    if ids.size == 0:
        raise DeteriorationInputError(f"split {split!r} has no stay")
    pieces = window_pieces(n, mode, window, context)
    if pieces.shape[0] == 0:
        raise DeteriorationInputError(f"split {split!r}: no scorable hour (stays shorter than {HORIZON + 1} h?)")
    return SplitIndex(split, ids, n, pieces)


_COLUMNS = list(VITALS) + list(OBSERVED_COLUMNS) + ["event_composite"]


def load_block(warehouse, index: SplitIndex, stays: np.ndarray, stats: dict, label: str = "filled") -> StayBlock:
    """:class:`StayBlock` of the stays at positions ``stays`` (ascending) of ``index``: one query."""
    ids = index.stay_ids[stays]
    with connect(warehouse) as con:
        d = con.execute(
            f"SELECT stay_id, {', '.join(_COLUMNS)} FROM vitals_hourly WHERE stay_id IN "
            f"(SELECT unnest(?::BIGINT[])) ORDER BY stay_id, hour", [ids.tolist()]).fetchnumpy()
    sid = np.asarray(d["stay_id"], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(index.lengths[stays])])
    if sid.size != starts[-1] or (sid.size and not np.array_equal(np.repeat(ids, index.lengths[stays]), sid)):
        raise DeteriorationInputError("the warehouse changed while the study read it; rerun the study")
    raw = np.column_stack([np.asarray(d[c], dtype=np.float64) for c in VITALS])
    obs = np.column_stack([np.asarray(d[c], dtype=bool) for c in OBSERVED_COLUMNS])
    return block_features(raw, obs, np.asarray(d["event_composite"], dtype=bool), starts, stats, label)


def load_windows(warehouse, index: SplitIndex, windows: np.ndarray, stats: dict, label: str = "filled",
                 T: int | None = None) -> SeqData:
    """Rows of the windows ``windows`` (positions in ``index.pieces``, in the order given), read
    from the warehouse (only the stays they need)."""
    pieces = index.pieces[np.asarray(windows, dtype=np.int64)]
    stays, stay_of = np.unique(pieces[:, 0], return_inverse=True)
    return cut_windows(load_block(warehouse, index, stays, stats, label), stay_of, pieces, T)


def iter_shards(warehouse, index: SplitIndex, order: np.ndarray | None, stats: dict, label: str = "filled",
                shard: int = SHARD_WINDOWS) -> Iterator[SeqData]:
    """Rows of the windows ``order`` (default: every window, in index order), ``shard`` windows at
    a time; each shard is read and featurised on its own (bounded memory)."""
    order = np.arange(index.n_windows) if order is None else np.asarray(order, dtype=np.int64)
    with connect(warehouse) as con:
        for i in range(0, order.size, shard):
            yield load_windows(con, index, order[i:i + shard], stats, label)


def leakage_summary(warehouse, splits=("train", "val", "test"), label: str = "filled",
                    shard_stays: int = 2048) -> dict[str, Any]:
    """Share of scored hours at which the old loader (warehouse ``_z``, back-filled) fed a value from
    a later hour, per split and overall (aggregates only; read ``shard_stays`` stays at a time)."""
    out, tot_n, tot_b = {}, 0, 0
    st = feature_stats(warehouse)
    with connect(warehouse) as con:
        for sp in splits:
            idx = split_index(con, sp)
            n = b = 0
            for i in range(0, idx.stay_ids.size, shard_stays):
                blk = load_block(con, idx, np.arange(i, min(i + shard_stays, idx.stay_ids.size)), st, label)
                n, b = n + int(blk.m.sum()), b + int((blk.m & blk.backfilled).sum())
            out[sp] = {"scored_hours": n, "backfilled_hours": b, "share": b / n if n else 0.0}
            tot_n, tot_b = tot_n + n, tot_b + b
    out["all"] = {"scored_hours": tot_n, "backfilled_hours": tot_b, "share": tot_b / tot_n if tot_n else 0.0}
    return out
