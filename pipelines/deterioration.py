"""Deterioration prediction (seed 001 §5): at every hour, will a composite event occur within the
next 6 hours? LSTM vs causal softmax attention vs causal SV-hybrid attention.

* features per hour: the 6 z-scored vitals and their 6 observed flags (F = 12);
* label at hour t: any ``event_composite`` in hours t+1 … t+6; hours without 6 future hours in
  the stay are not scored (mask);
* sequences are cut into non-overlapping windows of ``window`` hours (labels are computed on the
  whole stay first, so windows do not change them); every model is causal, so a logit at hour t
  reads hours ≤ t of its window only;
* training on the ``train`` split (AdamW, BCE on scored hours), early stopping on the ``val``
  loss, test AUROC/AUPRC with a stay-clustered bootstrap CI
  (:func:`evaluation.metrics.auroc_auprc_with_ci`, groups = stays).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from cohort.streams import iter_stays

from .errors import StudyInputError

HORIZON = 6
MODELS = ("lstm", "softmax", "sv_attention")


@dataclass
class SeqData:
    """x (N, T, F) float32; y (N, T) float32; m (N, T) bool scored; group (N,) stay index."""

    x: np.ndarray
    y: np.ndarray
    m: np.ndarray
    group: np.ndarray


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


def load_split(warehouse: str, split: str, window: int = 48) -> SeqData:
    xs, ys, ms, gs = [], [], [], []
    for j, s in enumerate(iter_stays(warehouse, split=split)):
        feats = np.hstack([s.z, s.observed.astype(np.float64)]).astype(np.float32)
        y, m = future_event_labels(s.event_composite)
        for a in range(0, len(feats), window):
            b = min(a + window, len(feats))
            if not m[a:b].any():
                continue
            pad = window - (b - a)
            xs.append(np.pad(feats[a:b], ((0, pad), (0, 0))))
            ys.append(np.pad(y[a:b].astype(np.float32), (0, pad)))
            ms.append(np.pad(m[a:b], (0, pad)))
            gs.append(j)
    if not xs:
        raise StudyInputError(f"split {split!r} has no scorable hour (stays shorter than {HORIZON + 1} h?)")
    return SeqData(np.stack(xs), np.stack(ys), np.stack(ms), np.asarray(gs))


def make_model(name: str, n_features: int, window: int, size: dict):
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


def _predict(model, d: SeqData, batch: int = 64) -> np.ndarray:
    import torch

    model.eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(d.x), batch):
            out.append(torch.sigmoid(model(torch.from_numpy(d.x[i:i + batch]))).numpy())
    return np.concatenate(out)


def _loss(model, d: SeqData, batch: int = 64) -> float:
    p = np.clip(_predict(model, d, batch), 1e-7, 1 - 1e-7)
    y, m = d.y[d.m], p[d.m]
    return float(-np.mean(y * np.log(m) + (1 - y) * np.log(1 - m)))


def train_and_test(train: SeqData, val: SeqData, test: SeqData, model_name: str, seed: int, *,
                   window: int = 48, size: dict | None = None, max_epochs: int = 12, patience: int = 3,
                   batch: int = 16, lr: float = 3e-3, n_boot: int = 1000) -> dict[str, Any]:
    """Train one model with one seed; return test AUROC/AUPRC with CIs and training facts."""
    import copy

    import torch

    from evaluation.metrics import auroc_auprc_with_ci

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    size = {**DEFAULT_SIZE, **(size or {})}
    model = make_model(model_name, train.x.shape[2], window, size)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    pos = float(train.y[train.m].mean())
    pw = torch.tensor((1 - pos) / max(pos, 1e-3))
    rng = np.random.default_rng(seed)
    best, best_state, bad, epochs = np.inf, None, 0, 0
    t0 = time.perf_counter()
    for ep in range(max_epochs):
        model.train()
        for idx in np.array_split(rng.permutation(len(train.x)), max(1, len(train.x) // batch)):
            x = torch.from_numpy(train.x[idx])
            y = torch.from_numpy(train.y[idx])
            m = torch.from_numpy(train.m[idx])
            logits = model(x)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits[m], y[m], pos_weight=pw)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        epochs = ep + 1
        vl = _loss(model, val)
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
    return {"model": model_name, "seed": int(seed), "epochs": epochs, "best_val_loss": float(best),
            "train_s": train_s, "n_params": int(sum(q.numel() for q in model.parameters())), **ci.to_dict()}
