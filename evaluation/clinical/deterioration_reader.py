"""Deterioration study: reading the model input from the warehouse, a shard of windows at a time
(the protocol itself: :mod:`evaluation.clinical.deterioration`).

:func:`split_index` reads only the stay lengths of a split (one DuckDB ``GROUP BY``) and lists
its windows as ``(stay, input start, scoring start, end)`` — 32 bytes per window, the only
per-split state. :func:`load_windows` reads the hours of the stays a set of windows needs (one
DuckDB query into NumPy), builds their causal features vectorised over the shard
(:func:`~evaluation.clinical.deterioration.block_features`) and cuts the rows; :func:`iter_shards`
does it a shard of windows at a time, so a training epoch or a scoring pass holds one shard,
whatever the number of stays. :func:`stay_features` is the per-stay reference (the whole split
in memory) the shard path is tested against.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from cohort.constants import OBSERVED_COLUMNS, VITALS
from evaluation.clinical.deterioration import (
    HORIZON,
    DeteriorationInputError,
    SeqData,
    StayBlock,
    StayFeatures,
    backfill_exposure,
    block_features,
    causal_fill,
    check_label,
    check_rows,
    cut_windows,
    future_event_labels,
    label_events,
    window_pieces,
)

#: windows per shard of the streaming reader (about 6 MB of rows at 96 h x 12 features)
SHARD_WINDOWS = 1024


@contextlib.contextmanager
def connect(con_or_path) -> Iterator[duckdb.DuckDBPyConnection]:
    """The caller's DuckDB connection (left open), or a read-only one on a warehouse path (closed)."""
    from cohort.streams import warehouse_connection

    if not isinstance(con_or_path, duckdb.DuckDBPyConnection) and not Path(con_or_path).is_file():
        raise DeteriorationInputError(f"warehouse {con_or_path} does not exist; build it with `forgetful build-cohort`")
    with warehouse_connection(con_or_path) as con:
        yield con


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


def stay_features(warehouse, split: str, label: str = "filled", stats: dict | None = None) -> list[StayFeatures]:
    """Reference: causal features and labels of every stay of one split (ascending stay_id), one
    stay at a time with the per-stay functions; holds the whole split."""
    from cohort.streams import iter_stays

    check_label(label)
    st = stats or feature_stats(warehouse)
    out = []
    for s in iter_stays(warehouse, split=split):
        z = (causal_fill(s.raw, s.observed, st["median"]) - st["mean"]) / st["sd"]
        ev = label_events(s.raw, s.observed, s.event_composite, label)
        y, m = future_event_labels(ev)
        out.append(StayFeatures(np.hstack([z, s.observed]).astype(np.float32), ev, y, m,
                                backfill_exposure(s.observed)))
    return out


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
    check_rows(mode, window, context)
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
