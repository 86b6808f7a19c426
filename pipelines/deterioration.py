"""Deterioration prediction (seed 001 §5): at every hour, will a composite event occur within the
next 6 hours? LSTM vs causal softmax attention vs causal SV-hybrid attention, beside a trivial
"event now" baseline.

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
  hour* crosses its threshold (same thresholds, :func:`cohort._hourly.events` on observed values).
* **Sequences** (``mode=``): ``"sliding"`` (default) — each stay is cut into consecutive blocks
  of ``window`` scored hours; a block is read after up to ``context`` preceding hours of the same
  stay (carried context, recomputed), so every hour is scored once and sees at least
  ``min(context, t)`` hours of history (the old protocol's disjoint windows: ``context = 0``).
  ``"stay"`` — one whole-stay sequence per stay (batches of similar length; padding only at the
  end, which no causal model reads). The LSTM is cheap at any length; the attention models cost
  O(T²) per sequence and the SV hybrid solves one gate per chunk over the whole prefix, which is
  why sliding windows with carried context are the CPU default.
* Training on ``train`` (AdamW, BCE on scored hours, positive-class weight), early stopping on
  ``val`` BCE; the test predictions are returned for paired evaluation
  (:func:`paired_cluster_bootstrap`: one stay-clustered resample scores every model at once).
  After every epoch the listeners registered with :func:`epoch_progress` get the epoch's figures
  (the CLI's per-epoch progress bar).
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cohort.constants import OBSERVED_COLUMNS, VITALS
from cohort.streams import _connection, iter_stays

from .errors import StudyInputError

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


# --------------------------------------------------------------------------------------------
# causal features
# --------------------------------------------------------------------------------------------
def causal_fill(raw: np.ndarray, observed: np.ndarray, medians: np.ndarray) -> np.ndarray:
    """Forward fill of the observed values of one stay; hours before a vital's first observation
    take ``medians`` (training split). raw, observed (n, V); medians (V,) -> (n, V) float64.
    The value at hour t depends only on observations at hours <= t."""
    obs = np.asarray(observed, dtype=bool)
    n = obs.shape[0]
    ar = np.arange(n)[:, None]
    prev = np.maximum.accumulate(np.where(obs, ar, -1), axis=0)
    cols = np.broadcast_to(np.arange(obs.shape[1]), prev.shape)
    vals = np.asarray(raw, dtype=np.float64)[np.maximum(prev, 0), cols]
    return np.where(prev >= 0, vals, np.asarray(medians, dtype=np.float64)[None, :])


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
    raise StudyInputError(f"unknown label {label!r}; choose from {LABEL_VARIANTS}")


def feature_stats(warehouse) -> dict[str, np.ndarray]:
    """mean, sd (the warehouse ``standardisation`` table) and median (its ``median`` column when the
    build recorded one, else the median of the training split's observed hourly values) per vital."""
    with _connection(warehouse) as con:
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
                raise StudyInputError(f"vital {v!r} is never observed; cannot impute")
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
    """Causal features and labels of every stay of one split (ascending stay_id)."""
    if label not in LABEL_VARIANTS:
        raise StudyInputError(f"unknown label {label!r}; choose from {LABEL_VARIANTS}")
    st = stats or feature_stats(warehouse)
    out = []
    for s in iter_stays(warehouse, split=split):
        filled = causal_fill(s.raw, s.observed, st["median"])
        z = (filled - st["mean"]) / st["sd"]
        ev = label_events(s.raw, s.observed, s.event_composite, label)
        y, m = future_event_labels(ev)
        out.append(StayFeatures(np.hstack([z, s.observed]).astype(np.float32), ev, y, m,
                                backfill_exposure(s.observed)))
    return out


def sequences(stays: Sequence[StayFeatures], mode: str = "sliding", window: int = 48,
              context: int = 48) -> SeqData:
    """Rows of the model input (see module doc, "Sequences"). Each scored hour is scored in exactly
    one row; rows are padded at the end to the longest row."""
    if mode not in SEQUENCE_MODES:
        raise StudyInputError(f"unknown sequence mode {mode!r}; choose from {SEQUENCE_MODES}")
    if window < 1 or context < 0:
        raise StudyInputError(f"window must be >= 1 and context >= 0; got {window}, {context}")
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
        raise StudyInputError(f"no scorable hour (stays shorter than {HORIZON + 1} h?)")
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


def load_split(warehouse: str, split: str, window: int = 48, *, mode: str = "sliding", context: int = 48,
               label: str = "filled", stats: dict | None = None) -> SeqData:
    """Model input of one split under the causal protocol (``context=0, mode="sliding"``: the old
    disjoint windows, still causal)."""
    stays = stay_features(warehouse, split, label, stats)
    if not stays:
        raise StudyInputError(f"split {split!r} has no stay")
    try:
        return sequences(stays, mode, window, context)
    except StudyInputError as e:
        raise StudyInputError(f"split {split!r}: {e}") from None


def leakage_summary(warehouse, splits=("train", "val", "test"), label: str = "filled") -> dict[str, Any]:
    """Share of scored hours at which the old loader (warehouse ``_z``, back-filled) fed a value from
    a later hour, per split and overall (aggregates only)."""
    out, tot_n, tot_b = {}, 0, 0
    st = feature_stats(warehouse)
    for sp in splits:
        stays = stay_features(warehouse, sp, label, st)
        n = int(sum(s.m.sum() for s in stays))
        b = int(sum((s.m & s.backfilled).sum() for s in stays))
        out[sp] = {"scored_hours": n, "backfilled_hours": b, "share": b / n if n else 0.0}
        tot_n, tot_b = tot_n + n, tot_b + b
    out["all"] = {"scored_hours": tot_n, "backfilled_hours": tot_b, "share": tot_b / tot_n if tot_n else 0.0}
    return out


# --------------------------------------------------------------------------------------------
# paired, stay-clustered bootstrap of AUROC / AUPRC
# --------------------------------------------------------------------------------------------
def paired_cluster_bootstrap(y: np.ndarray, scores: dict[str, np.ndarray], groups: np.ndarray,
                             pairs: Sequence[tuple[str, str]] = (), n_boot: int = 1000, seed: int = 0,
                             level: float = 0.95) -> dict[str, Any]:
    """AUROC/AUPRC of several score vectors on the same hours, with percentile intervals from ONE
    set of stay-clustered resamples (whole stays drawn with replacement, as
    :func:`evaluation.metrics.auroc_auprc_with_ci` with ``groups``), and the paired differences
    ``a − b`` for every ``(a, b)`` in ``pairs`` computed on the same resamples. Resamples with a
    single class are skipped (counted). Returns aggregates only."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    from evaluation.metrics import bootstrap_indices

    yy = np.asarray(y).astype(np.int8)
    g = np.asarray(groups)
    if yy.ndim != 1 or g.shape != yy.shape or any(np.shape(v) != yy.shape for v in scores.values()):
        raise StudyInputError("labels, groups and every score vector must be aligned 1-D arrays")
    if yy.min() == yy.max():
        raise StudyInputError("AUROC/AUPRC need both classes")
    for a, b in pairs:
        if a not in scores or b not in scores:
            raise StudyInputError(f"pair {(a, b)} names a score that was not given")
    _, inv = np.unique(g, return_inverse=True)
    order = np.argsort(inv, kind="stable")
    members = np.split(order, np.flatnonzero(np.diff(inv[order])) + 1)
    names = list(scores)
    S = {k: np.asarray(v, dtype=np.float64) for k, v in scores.items()}
    rng = np.random.default_rng(seed)
    boot: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in names}
    skipped = 0
    for _ in range(int(n_boot)):
        idx = np.concatenate([members[j] for j in bootstrap_indices(rng, 1, len(members))[0]])
        yb = yy[idx]
        if yb.min() == yb.max():
            skipped += 1
            continue
        for k in names:
            boot[k][0].append(roc_auc_score(yb, S[k][idx]))
            boot[k][1].append(average_precision_score(yb, S[k][idx]))
    if not boot[names[0]][0]:
        raise StudyInputError("every bootstrap resample had a single class")
    tail = (1.0 - level) / 2.0 * 100.0

    def ci(v):
        lo, hi = np.percentile(v, [tail, 100.0 - tail])
        return float(lo), float(hi)

    per = {}
    for k in names:
        au, ap = np.asarray(boot[k][0]), np.asarray(boot[k][1])
        per[k] = {"auroc": float(roc_auc_score(yy, S[k])), "auroc_low": ci(au)[0], "auroc_high": ci(au)[1],
                  "auprc": float(average_precision_score(yy, S[k])), "auprc_low": ci(ap)[0],
                  "auprc_high": ci(ap)[1]}
    diffs = {}
    for a, b in pairs:
        da = np.asarray(boot[a][0]) - np.asarray(boot[b][0])
        dp = np.asarray(boot[a][1]) - np.asarray(boot[b][1])
        diffs[f"{a} - {b}"] = {
            "auroc_diff": per[a]["auroc"] - per[b]["auroc"], "auroc_diff_low": ci(da)[0],
            "auroc_diff_high": ci(da)[1], "auroc_share_boot_gt0": float(np.mean(da > 0)),
            "auprc_diff": per[a]["auprc"] - per[b]["auprc"], "auprc_diff_low": ci(dp)[0],
            "auprc_diff_high": ci(dp)[1], "auprc_share_boot_gt0": float(np.mean(dp > 0))}
    return {"scores": per, "pairs": diffs, "n": int(yy.size), "n_pos": int(yy.sum()), "n_groups": len(members),
            "n_boot_used": int(n_boot) - skipped, "n_boot_skipped": skipped, "level": level, "seed": int(seed)}


# --------------------------------------------------------------------------------------------
# models and training
# --------------------------------------------------------------------------------------------
def make_model(name: str, n_features: int, window: int, size: dict):
    """``window`` = the longest input row (the attention models' learned hour embeddings)."""
    from models.lstm import LSTMClassifier
    from models.sequence_classifier import CausalSequenceClassifier

    if name == "lstm":
        return LSTMClassifier(n_features, hidden=size["hidden"])
    if name == "softmax":
        return CausalSequenceClassifier(n_features, "softmax", d_model=size["d_model"], n_heads=size["heads"],
                                        n_layers=size["layers"], max_len=window)
    if name == "sv_attention":
        return CausalSequenceClassifier(n_features, "sv_hybrid", d_model=size["d_model"], n_heads=size["heads"],
                                        n_layers=size["layers"], max_len=window,
                                        attn_kwargs={"chunk": size["chunk"], "C": size["C"], "sigma": size["sigma"],
                                                     "fista_iters": size["fista_iters"]})
    raise StudyInputError(f"unknown model {name!r}; choose from {MODELS}")


DEFAULT_SIZE = {"hidden": 32, "d_model": 32, "heads": 2, "layers": 1, "chunk": 8, "C": 0.25, "sigma": 2.0,
                "fista_iters": 40}


def _batches(d: SeqData, batch: int, rng: np.random.Generator | None = None) -> list[np.ndarray]:
    """Row batches; rows sorted by length (ties and batch order shuffled when ``rng``) so that each
    batch is trimmed to its own longest row (trailing padding is never read by a causal model)."""
    n = len(d.x)
    length = d.length if d.length is not None else np.full(n, d.x.shape[1])
    key = rng.random(n) if rng is not None else np.zeros(n)
    order = np.lexsort((key, length))
    out = [order[i:i + batch] for i in range(0, n, batch)]
    if rng is not None:
        out = [out[i] for i in rng.permutation(len(out))]
    return out


def _trim(d: SeqData, idx: np.ndarray) -> int:
    return int(d.length[idx].max()) if d.length is not None else d.x.shape[1]


def _predict(model, d: SeqData, batch: int = 64) -> np.ndarray:
    import torch

    model.eval()
    out = np.zeros(d.y.shape, np.float32)
    with torch.no_grad():
        for idx in _batches(d, batch):
            T = _trim(d, idx)
            out[idx, :T] = torch.sigmoid(model(torch.from_numpy(d.x[idx, :T]))).numpy()
    return out


def _loss(model, d: SeqData, batch: int = 64) -> float:
    p = np.clip(_predict(model, d, batch), 1e-7, 1 - 1e-7)
    y, m = d.y[d.m], p[d.m]
    return float(-np.mean(y * np.log(m) + (1 - y) * np.log(1 - m)))


_EPOCH_LISTENERS: list[Callable[[dict], None]] = []


@contextlib.contextmanager
def epoch_progress(listener: Callable[[dict], None] | None) -> Iterator[None]:
    """While inside, :func:`train_and_test` calls ``listener(event)`` in this process after every
    epoch — from the worker thread that trains — with ``model, seed, epoch, max_epochs,
    train_loss, val_loss, elapsed_s``. ``None`` registers nothing."""
    if listener is None:
        yield
        return
    _EPOCH_LISTENERS.append(listener)
    try:
        yield
    finally:
        _EPOCH_LISTENERS.remove(listener)


def train_and_test(train: SeqData, val: SeqData, test: SeqData, model_name: str, seed: int, *,
                   window: int | None = None, size: dict | None = None, max_epochs: int = 12, patience: int = 3,
                   batch: int = 16, lr: float = 3e-3, n_boot: int = 1000, return_predictions: bool = False
                   ) -> dict[str, Any]:
    """Train one model with one seed; return test AUROC/AUPRC with a stay-clustered CI, training
    facts and (``return_predictions``) the test probabilities at the scored hours (float32, in
    :meth:`SeqData.scored` order) under ``"p_test"``."""
    import copy

    import torch

    from evaluation.metrics import auroc_auprc_with_ci

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    size = {**DEFAULT_SIZE, **(size or {})}
    max_len = max(window or 0, train.x.shape[1], val.x.shape[1], test.x.shape[1])
    model = make_model(model_name, train.x.shape[2], max_len, size)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    pos = float(train.y[train.m].mean())
    pw = torch.tensor((1 - pos) / max(pos, 1e-3))
    rng = np.random.default_rng(seed)
    best, best_state, bad, epochs = np.inf, None, 0, 0
    t0 = time.perf_counter()
    for ep in range(max_epochs):
        model.train()
        losses = []
        for idx in _batches(train, batch, rng):
            T = _trim(train, idx)
            x = torch.from_numpy(train.x[idx, :T])
            y = torch.from_numpy(train.y[idx, :T])
            m = torch.from_numpy(train.m[idx, :T])
            if not bool(m.any()):
                continue
            logits = model(x)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits[m], y[m], pos_weight=pw)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(float(loss.detach()))
        epochs = ep + 1
        vl = _loss(model, val)
        for fn in list(_EPOCH_LISTENERS):
            fn({"model": model_name, "seed": int(seed), "epoch": epochs, "max_epochs": int(max_epochs),
                "train_loss": float(np.mean(losses)) if losses else float("nan"), "val_loss": vl,
                "elapsed_s": time.perf_counter() - t0})
        if vl < best - 1e-4:
            best, best_state, bad = vl, copy.deepcopy(model.state_dict()), 0
        else:
            bad += 1
            if bad >= patience:
                break
    train_s = time.perf_counter() - t0
    if best_state is not None:
        model.load_state_dict(best_state)
    p = _predict(model, test)
    groups = np.broadcast_to(test.group[:, None], test.m.shape)[test.m]
    ci = auroc_auprc_with_ci(test.y[test.m].astype(np.int8), p[test.m].astype(np.float64), n_boot=n_boot,
                             seed=seed, groups=groups)
    out = {"model": model_name, "seed": int(seed), "epochs": epochs, "best_val_loss": float(best),
           "train_s": train_s, "n_params": int(sum(q.numel() for q in model.parameters())), **ci.to_dict()}
    if return_predictions:
        out["p_test"] = p[test.m].astype(np.float32)
    return out
