"""Deterioration prediction (seed 001 §5): at every hour, will a composite event occur within the
next 6 hours? The protocol (:data:`PROTOCOL`): causal features, labels, model input rows.

* **Causal features** (F = 12 per hour): the 6 vitals rebuilt from the warehouse's *observed*
  hourly values only (:func:`causal_fill`: forward fill, the training-split median before a
  vital's first measurement, never a later value), standardised, plus the 6 ``_observed`` flags;
  :func:`backfill_exposure` counts the hours the warehouse's back-filled ``_z`` would have leaked.
* **Labels** at hour t: any event in hours t+1 … t+6 (:func:`future_event_labels`), on filled or
  observed values (:func:`label_events`).
* **Rows**: sliding blocks of scored hours after carried context, or whole stays (:func:`sequences`).

Vectorised over a block of stays (:func:`block_features`, :func:`window_pieces`,
:func:`cut_windows`) for the streaming reader :mod:`evaluation.clinical.deterioration_reader`;
the per-stay functions are the slow references they are tested against. Training and scoring:
:mod:`evaluation.clinical.deterioration_training`; the paired, stay-clustered bootstrap:
:mod:`evaluation.cluster_bootstrap`; the Prefect flow: :mod:`pipelines.flows.clinical_deterioration`.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cohort.constants import VITALS
from evaluation.errors import EvaluationError

HORIZON = 6
#: per-hour sequence models (torch): :func:`evaluation.clinical.deterioration_models.make_model`
SEQUENCE_MODELS = ("lstm", "gru", "softmax", "sv_attention")
#: gradient-boosted trees on causal summary features of the same rows: :mod:`evaluation.clinical.tabular_peers`
TABULAR_MODELS = ("lightgbm",)
MODELS = SEQUENCE_MODELS + TABULAR_MODELS
LABEL_VARIANTS = ("filled", "observed")
SEQUENCE_MODES = ("sliding", "stay")
PROTOCOL = "causal-ffill+train-median/v2"
LABEL_TEXT = {
    "filled": "event_composite on filled values (forward fill, back fill, training median): an hour can be an "
              "event without a reading of the triggering vital",
    "observed": "observed-only: an hour is an event only if a vital measured that hour crosses its threshold",
}
N_FEATURES = 2 * len(VITALS)  # causal z-scores + observed flags


class DeteriorationInputError(EvaluationError):
    """Bad input to the deterioration study (mode, label, window, an empty split, a vital never
    observed, a warehouse that changed while it was read)."""


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
    The value at hour t depends only on observations at hours <= t.

    The warehouse's own ``_z`` columns are forward- *then back-* filled, so an hour before a vital's
    first measurement carries that future measurement: the model reads this fill instead, standardised
    with the warehouse ``standardisation`` table.
    """
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
    """Per-hour event flags (n,) under one of :data:`LABEL_VARIANTS`.

    ``"filled"`` — the warehouse ``event_composite``: SPEC §2 thresholds on the *filled* values
    (forward fill → back fill → training median), so an hour without a reading of the triggering
    vital can be an event; ``"observed"`` — an hour is an event only if a vital *measured that hour*
    crosses its threshold (same thresholds, on observed values). Hours without 6 future hours in the
    stay are not scored.
    """
    if label == "filled":
        return np.asarray(event_composite, dtype=bool)
    if label == "observed":
        from cohort._hourly import events

        return events(np.where(observed, raw, np.nan))[0]
    raise DeteriorationInputError(f"unknown label {label!r}; choose from {LABEL_VARIANTS}")


@dataclass
class StayFeatures:
    x: np.ndarray          # (n, 12) float32 causal z + observed flags
    events: np.ndarray     # (n,) bool under the chosen label
    y: np.ndarray          # (n,) bool future-event label
    m: np.ndarray          # (n,) bool scored
    backfilled: np.ndarray  # (n,) bool the old loader fed a back-filled value at this hour


# --------------------------------------------------------------------------------------------
# the same, vectorised over a block of stays (the streaming path)
# --------------------------------------------------------------------------------------------
def check_label(label: str) -> None:
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


def causal_features(raw: np.ndarray, observed: np.ndarray, stats: dict) -> np.ndarray:
    """The model input of rows that are each one causal stream (the MEDS-DEV path: one row per
    prediction time, its hours ending at that time): per row, :func:`causal_fill` (forward fill,
    the training median before a vital's first observation in the row), z-scored with ``stats``
    (mean, sd, median per vital), beside the observed flags. raw, observed (N, T, V) -> (N, T, 2V)
    float32; hour t of a row depends only on its hours <= t."""
    obs = np.asarray(observed, dtype=bool)
    N, T, V = obs.shape
    flat = _fill_blocks(np.asarray(raw, dtype=np.float64).reshape(N * T, V), obs.reshape(N * T, V),
                        np.arange(N + 1) * T, stats["median"])
    z = (flat.reshape(N, T, V) - stats["mean"]) / stats["sd"]
    return np.concatenate([z, obs], axis=2).astype(np.float32)


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
    check_label(label)
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


def check_rows(mode: str, window: int, context: int) -> None:
    if mode not in SEQUENCE_MODES:
        raise DeteriorationInputError(f"unknown sequence mode {mode!r}; choose from {SEQUENCE_MODES}")
    if window < 1 or context < 0:
        raise DeteriorationInputError(f"window must be >= 1 and context >= 0; got {window}, {context}")


def sequences(stays: Sequence[StayFeatures], mode: str = "sliding", window: int = 48,
              context: int = 48) -> SeqData:
    """Reference: rows of the model input from per-stay features. Each
    scored hour is scored in exactly one row; rows are padded at the end to the longest row.

    ``mode="sliding"`` (default): each stay is cut into consecutive blocks of ``window`` scored
    hours; a block is read after up to ``context`` preceding hours of the same stay (carried context,
    recomputed), so every hour is scored once and sees at least ``min(context, t)`` hours of history
    (``context = 0``: disjoint windows). ``mode="stay"``: one whole-stay row per stay. A row is a
    *window*; :class:`evaluation.clinical.deterioration_reader.SplitIndex` lists them.
    """
    check_rows(mode, window, context)
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
    check_rows(mode, window, context)
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


