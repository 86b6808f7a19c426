"""LightGBM beside the sequence models: gradient-boosted trees on causal summary features of the
same hourly rows (the ``lightgbm`` model of the deterioration study and of the MEDS-DEV entries).

Why: on hourly ICU benchmarks a tree model on hand-made summaries of the recent hours is a peer the
sequence models must beat — YAIB (van de Water et al., ICLR 2024) reports LightGBM first on 24-h
mortality and HiRID-ICU-Benchmark (Yèche et al., NeurIPS 2021) on circulatory failure.

Features (:func:`summary_features`), per row and hour t, from the row's hours <= t only (the
rows the sequence models read: causal z-scores then observed flags, ``(N, T, 2V)``): the current
z-scores and flags, and for each trailing window w of :data:`WINDOWS` hours (cut at the row's
first hour) the mean, minimum and maximum z-score per vital, the change of the z-score over the
window and the share of its hours with a measurement. Every scored hour of a training window is
one training row.

Training (:func:`fit`): ``lightgbm.train`` on the scored hours of ``train_windows`` training
windows drawn with the seed (all when None), the positive class weighted by (1 − prevalence) /
prevalence as the sequence models' BCE is, early-stopped on the validation rows' log loss.
Deterministic for a seed: LightGBM's ``deterministic`` mode, row-wise histograms, one thread by
default, every random stream seeded by ``seed``.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from evaluation.clinical import deterioration as det
from evaluation.clinical import deterioration_reader as rd
from evaluation.clinical import deterioration_training as dtr

#: trailing windows (hours) of the summary features
WINDOWS = (6, 24)
#: LightGBM parameters of the peer (``seed``, ``num_threads`` and the class weight are set per fit)
DEFAULT_PARAMS: dict[str, Any] = {
    "objective": "binary", "metric": "binary_logloss", "learning_rate": 0.05, "num_leaves": 31,
    "min_data_in_leaf": 20, "feature_fraction": 0.8, "bagging_fraction": 0.8, "bagging_freq": 1,
    "lambda_l2": 1.0, "deterministic": True, "force_row_wise": True, "verbose": -1,
}
MAX_ROUNDS, PATIENCE = 1000, 50
LIGHTGBM_HINT = "pip install 'forgetful-attention[lightgbm]'"


def require_lightgbm():
    """The ``lightgbm`` module, or :class:`DeteriorationInputError` naming the extra to install."""
    try:
        import lightgbm
    except ImportError:
        raise det.DeteriorationInputError(f"the lightgbm model needs lightgbm, which is not installed: "
                                          f"{LIGHTGBM_HINT}") from None
    return lightgbm


def feature_names(n_vitals: int = 6, vitals: tuple[str, ...] | None = None) -> list[str]:
    """Names of the :func:`summary_features` columns, in order."""
    from cohort.constants import VITALS

    v = list(vitals or VITALS)[:n_vitals]
    out = [f"{a}_z" for a in v] + [f"{a}_observed" for a in v]
    for w in WINDOWS:
        for stat in ("mean", "min", "max", "change", "observed_share"):
            out += [f"{a}_{stat}_{w}h" for a in v]
    return out


def _trailing(a: np.ndarray, w: int, op) -> np.ndarray:
    """op (np.minimum / np.maximum) over hours [max(0, t−w+1), t] of a (N, T, V), per t."""
    out = a.copy()
    for k in range(1, min(w, a.shape[1])):
        out = op(out, np.concatenate([np.repeat(a[:, :1], k, axis=1), a[:, :-k]], axis=1))
    return out


def summary_features(x: np.ndarray) -> np.ndarray:
    """Causal summary features of rows ``x`` (N, T, 2V) (z-scores, then observed flags) ->
    (N, T, K) float32, K = 2V + 5V·len(WINDOWS) (module docstring; hour t reads hours <= t)."""
    x = np.asarray(x, dtype=np.float32)
    N, T, F = x.shape
    V = F // 2
    z, obs = x[..., :V].astype(np.float64), x[..., V:].astype(np.float64)
    t = np.arange(T)
    parts = [x[..., :V], x[..., V:]]
    cz = np.concatenate([np.zeros((N, 1, V)), np.cumsum(z, axis=1)], axis=1)
    co = np.concatenate([np.zeros((N, 1, V)), np.cumsum(obs, axis=1)], axis=1)
    for w in WINDOWS:
        lo = np.maximum(t - w + 1, 0)
        n = (t - lo + 1)[None, :, None]
        parts += [(cz[:, t + 1] - cz[:, lo]) / n, _trailing(z, w, np.minimum), _trailing(z, w, np.maximum),
                  z - z[:, lo], (co[:, t + 1] - co[:, lo]) / n]
    return np.concatenate(parts, axis=2).astype(np.float32)


def scored_rows(reader: dtr.WindowReader, order: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(features (n, K) float32, labels (n,) float32) of the scored hours of the windows ``order``."""
    xs, ys = [], []
    for d in reader.shards(order):
        xs.append(summary_features(d.x)[d.m])
        ys.append(d.y[d.m])
    return np.concatenate(xs), np.concatenate(ys).astype(np.float32)


def fit(seed: int, train: dtr.WindowReader, val: dtr.WindowReader, *, train_windows: int | None = None,
        params: dict | None = None, threads: int = 1, max_rounds: int = MAX_ROUNDS,
        patience: int = PATIENCE) -> tuple[Any, dict[str, Any]]:
    """Fit the LightGBM peer (module docstring). Returns (booster, facts: epochs = boosting rounds
    kept, best_val_loss, train_s, n_params = leaves of the kept trees, train_windows_per_epoch)."""
    lgb = require_lightgbm()
    t0, c0, r0 = time.perf_counter(), time.process_time(), train.read_s + val.read_s
    W = train.n_windows
    rng = np.random.default_rng(seed)
    pick = np.arange(W) if train_windows is None or train_windows >= W else \
        np.sort(rng.choice(W, int(train_windows), replace=False))
    xt, yt = scored_rows(train, pick)
    xv, yv = scored_rows(val)
    if yt.min() == yt.max():
        raise det.DeteriorationInputError("the LightGBM peer needs both classes among the training rows")
    pos = float(yt.mean())
    p = {**DEFAULT_PARAMS, **(params or {}), "seed": int(seed), "num_threads": int(threads),
         "scale_pos_weight": (1 - pos) / max(pos, 1e-3)}
    p["min_data_in_leaf"] = int(min(p["min_data_in_leaf"], max(1, yt.size // 10)))  # tiny cohorts still split
    dtrain = lgb.Dataset(xt, yt, params={"verbose": -1}, free_raw_data=True)
    dval = lgb.Dataset(xv, yv, reference=dtrain)
    booster = lgb.train(p, dtrain, num_boost_round=int(max_rounds), valid_sets=[dval], valid_names=["val"],
                        callbacks=[lgb.early_stopping(int(patience), verbose=False)])
    rounds = int(booster.best_iteration or booster.current_iteration())
    leaves = sum(t["num_leaves"] for t in booster.dump_model(num_iteration=rounds)["tree_info"])
    best = float(booster.best_score.get("val", {}).get("binary_logloss", float("nan")))
    dtr.emit_epoch({"model": "lightgbm", "seed": int(seed), "epoch": 1, "max_epochs": 1, "train_loss": float("nan"),
                    "val_loss": best, "elapsed_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                    "read_s": train.read_s + val.read_s - r0})
    return booster, {"epochs": rounds, "best_val_loss": best, "train_s": time.perf_counter() - t0,
                     "n_params": int(leaves), "train_windows_per_epoch": int(pick.size)}


def predict(booster, reader: dtr.WindowReader) -> Iterator[tuple[det.SeqData, np.ndarray]]:
    """(rows, probabilities (N, T) float32, zero at unscored hours) per shard, in index order."""
    rounds = int(booster.best_iteration or booster.current_iteration())
    for d in reader.shards():
        out = np.zeros(d.y.shape, np.float32)
        if d.m.any():
            out[d.m] = booster.predict(summary_features(d.x)[d.m], num_iteration=rounds).astype(np.float32)
        yield d, out


def train_and_test(data: dtr.StudyData, seed: int, *, train_windows: int | None = None, n_boot: int = 10_000,
                   shard: int = rd.SHARD_WINDOWS, return_predictions: bool = False, threads: int = 1,
                   params: dict | None = None) -> dict[str, Any]:
    """The deterioration study's LightGBM run with one seed: the same result as
    :func:`evaluation.clinical.deterioration_training.train_and_test` (test AUROC/AUPRC with a
    stay-clustered CI, facts, ``p_test`` in :func:`~evaluation.clinical.deterioration_training.scored_targets`
    order)."""
    train, val = dtr.WindowReader(data, data.train, shard), dtr.WindowReader(data, data.val, shard)
    booster, facts = fit(seed, train, val, train_windows=train_windows, params=params, threads=threads)
    p, y, g = dtr.scored_predictions(predict(booster, dtr.WindowReader(data, data.test, shard)))
    return dtr.run_result("lightgbm", seed, facts, p, y, g, n_boot, return_predictions)
