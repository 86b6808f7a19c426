"""Paired, cluster-resampled bootstrap of AUROC / AUPRC, vectorised over resamples.

A cluster (e.g. an ICU stay) drawn k times contributes all its rows k times, so a resample is a
vector of integer cluster weights ``w`` (G,), and its AUROC / AUPRC are those of the weighted
rows: the same formulas :func:`sklearn.metrics.roc_auc_score` (trapezoid, ties counted half) and
:func:`sklearn.metrics.average_precision_score` (recall steps times precision) apply to the
concatenated resample, on integer counts. Both need the weighted true- and false-positive
counts only at the distinct scores held by a positive row; per score vector, sorted once, those
are three sparse (thresholds x clusters) count matrices with at most n entries together, so a
block of resamples is three sparse-dense products and a few cumulative sums — 10,000 resamples
of 10^5 rows take tens of seconds, not hours. The draws are those of
:func:`evaluation.metrics.bootstrap_indices` (chunking-invariant), so the result equals the
per-resample loop :func:`paired_cluster_bootstrap_reference` to rounding.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from evaluation.errors import MetricError
from evaluation.metrics import bootstrap_indices


def _prepare(y, scores: dict, groups, pairs) -> tuple[np.ndarray, dict, np.ndarray, int]:
    yy = np.asarray(y).astype(np.int8)
    g = np.asarray(groups)
    if yy.ndim != 1 or g.shape != yy.shape or any(np.shape(v) != yy.shape for v in scores.values()):
        raise MetricError("labels, groups and every score vector must be aligned 1-D arrays")
    if not scores:
        raise MetricError("no score vector given")
    if yy.size == 0 or yy.min() == yy.max():
        raise MetricError("AUROC/AUPRC need both classes")
    for a, b in pairs:
        if a not in scores or b not in scores:
            raise MetricError(f"pair {(a, b)} names a score that was not given")
    _, codes = np.unique(g, return_inverse=True)
    S = {k: np.asarray(v, dtype=np.float64) for k, v in scores.items()}
    return yy, S, codes.reshape(-1), int(codes.max()) + 1


class _Sorted:
    """One score vector sorted by decreasing score, reduced to what a weighted resample needs: at
    each of the K distinct scores held by a positive row (the thresholds at which the PR curve
    gains recall), per cluster, the positive rows at that score (``tp``), the negative rows scoring
    above it but below the previous such threshold (``fp_above``) and the negative rows tied with
    it (``fp_tie``) — three sparse (K, G) count matrices with at most n entries together — and the
    positive / negative rows per cluster (``n_pos``, ``n_neg``)."""

    def __init__(self, s: np.ndarray, y: np.ndarray, codes: np.ndarray, G: int):
        from scipy import sparse

        order = np.argsort(-s, kind="mergesort")
        ss, pos, cc = s[order], y[order].astype(bool), codes[order]
        tie = np.concatenate([[0], np.cumsum(ss[1:] != ss[:-1])])  # tie group of each row
        has_pos = np.zeros(tie[-1] + 1, dtype=bool)
        has_pos[tie[pos]] = True
        thr_groups = np.flatnonzero(has_pos)  # tie groups holding a positive, descending score
        K = thr_groups.size
        k = np.searchsorted(thr_groups, tie)  # the first threshold at or below each row's score
        inside = k < K  # rows below the last positive threshold count in no TP/FP needed here
        at = inside & (thr_groups[np.minimum(k, K - 1)] == tie)

        def counts(sel):
            return sparse.csr_matrix((np.ones(int(sel.sum())), (k[sel], cc[sel])), shape=(K, G))

        self.tp, self.fp_above, self.fp_tie = counts(pos), counts(inside & ~pos & ~at), counts(~pos & at)
        self.n_pos = np.bincount(codes[y.astype(bool)], minlength=G).astype(np.float64)
        self.n_neg = np.bincount(codes[~y.astype(bool)], minlength=G).astype(np.float64)

    def curves(self, W: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """AUROC, AUPRC and validity (both classes present) of the resamples with cluster
        weights W (b, G): ``AUROC = sum_k dTP_k (N - (FP_k + FP_k^>) / 2) / (P N)`` and
        ``AUPRC = sum_k dTP_k TP_k / (TP_k + FP_k) / P`` (FP^>: negatives strictly above)."""
        Wt = np.ascontiguousarray(W.T, dtype=np.float64)  # (G, b)
        P, N = self.n_pos @ Wt, self.n_neg @ Wt
        ok = (P > 0) & (N > 0)
        Ps, Ns = np.where(ok, P, 1.0), np.where(ok, N, 1.0)
        dtp = self.tp @ Wt  # (K, b)
        tp = np.cumsum(dtp, axis=0)
        above = self.fp_above @ Wt
        fp_strict = np.cumsum(above, axis=0)
        fp_strict[1:] += np.cumsum(self.fp_tie @ Wt, axis=0)[:-1]
        fp = fp_strict + self.fp_tie @ Wt
        auroc = (dtp * (N - 0.5 * (fp + fp_strict))).sum(0) / (Ps * Ns)
        auprc = (dtp * (tp / np.maximum(tp + fp, 1.0))).sum(0) / Ps
        return auroc, auprc, ok


def _summary(y, S, names, codes, G, boot_au, boot_ap, pairs, n_boot, skipped, level, seed) -> dict[str, Any]:
    from sklearn.metrics import average_precision_score, roc_auc_score

    if not boot_au[names[0]]:
        raise MetricError("every bootstrap resample had a single class")
    tail = (1.0 - level) / 2.0 * 100.0

    def ci(v):
        lo, hi = np.percentile(v, [tail, 100.0 - tail])
        return float(lo), float(hi)

    per = {}
    for k in names:
        au, ap = np.asarray(boot_au[k]), np.asarray(boot_ap[k])
        per[k] = {"auroc": float(roc_auc_score(y, S[k])), "auroc_low": ci(au)[0], "auroc_high": ci(au)[1],
                  "auprc": float(average_precision_score(y, S[k])), "auprc_low": ci(ap)[0],
                  "auprc_high": ci(ap)[1]}
    diffs = {}
    for a, b in pairs:
        da = np.asarray(boot_au[a]) - np.asarray(boot_au[b])
        dp = np.asarray(boot_ap[a]) - np.asarray(boot_ap[b])
        diffs[f"{a} - {b}"] = {
            "auroc_diff": per[a]["auroc"] - per[b]["auroc"], "auroc_diff_low": ci(da)[0],
            "auroc_diff_high": ci(da)[1], "auroc_share_boot_gt0": float(np.mean(da > 0)),
            "auprc_diff": per[a]["auprc"] - per[b]["auprc"], "auprc_diff_low": ci(dp)[0],
            "auprc_diff_high": ci(dp)[1], "auprc_share_boot_gt0": float(np.mean(dp > 0))}
    return {"scores": per, "pairs": diffs, "n": int(y.size), "n_pos": int(y.sum()), "n_groups": G,
            "n_boot_used": int(n_boot) - skipped, "n_boot_skipped": skipped, "level": level, "seed": int(seed)}


def paired_cluster_bootstrap(y: np.ndarray, scores: dict[str, np.ndarray], groups: np.ndarray,
                             pairs: Sequence[tuple[str, str]] = (), n_boot: int = 10_000, seed: int = 0,
                             level: float = 0.95, block_elems: int = 1 << 18) -> dict[str, Any]:
    """AUROC/AUPRC of several score vectors on the same rows, with percentile intervals from ONE
    set of cluster resamples (whole clusters drawn with replacement), and the paired differences
    ``a − b`` for every ``(a, b)`` in ``pairs`` on the same resamples. Resamples with a single
    class are skipped (counted).

    Parameters
    ----------
    y : (n,) {0, 1}; scores : name -> (n,) float; groups : (n,) cluster labels.
    pairs : (a, b) names; n_boot, seed, level : bootstrap settings; block_elems : resamples are
        processed ``max(1, block_elems // K)`` at a time (K: distinct scores of positive rows).

    Returns
    -------
    dict with ``scores`` (per name: auroc, auroc_low/high, auprc, auprc_low/high), ``pairs`` (per
    "a - b": differences, intervals, share of resamples > 0), ``n, n_pos, n_groups,
    n_boot_used, n_boot_skipped, level, seed`` (aggregates only).
    """
    yy, S, codes, G = _prepare(y, scores, groups, pairs)
    names = list(S)
    sorted_ = {k: _Sorted(S[k], yy, codes, G) for k in names}
    rng = np.random.default_rng(seed)
    boot_au: dict[str, list] = {k: [] for k in names}
    boot_ap: dict[str, list] = {k: [] for k in names}
    K = max(so.tp.shape[0] for so in sorted_.values())
    skipped, done, b = 0, 0, max(1, int(block_elems) // max(1, K))
    while done < int(n_boot):
        nb = min(b, int(n_boot) - done)
        pick = bootstrap_indices(rng, nb, G)
        W = np.bincount((pick + (np.arange(nb) * G)[:, None]).ravel(), minlength=nb * G).reshape(nb, G)
        ok = None
        for k in names:
            au, ap, ok_k = sorted_[k].curves(W)
            ok = ok_k if ok is None else ok
            boot_au[k].extend(au[ok].tolist())
            boot_ap[k].extend(ap[ok].tolist())
        skipped += int((~ok).sum())
        done += nb
    return _summary(yy, S, names, codes, G, boot_au, boot_ap, pairs, n_boot, skipped, level, seed)


def paired_cluster_bootstrap_reference(y, scores, groups, pairs=(), n_boot: int = 1000, seed: int = 0,
                                       level: float = 0.95) -> dict[str, Any]:
    """Slow reference of :func:`paired_cluster_bootstrap`: one resample at a time, rows
    concatenated cluster by cluster, scored by scikit-learn."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    yy, S, codes, G = _prepare(y, scores, groups, pairs)
    names = list(S)
    order = np.argsort(codes, kind="stable")
    members = np.split(order, np.flatnonzero(np.diff(codes[order])) + 1)
    rng = np.random.default_rng(seed)
    boot_au: dict[str, list] = {k: [] for k in names}
    boot_ap: dict[str, list] = {k: [] for k in names}
    skipped = 0
    for _ in range(int(n_boot)):
        idx = np.concatenate([members[j] for j in bootstrap_indices(rng, 1, G)[0]])
        yb = yy[idx]
        if yb.min() == yb.max():
            skipped += 1
            continue
        for k in names:
            boot_au[k].append(roc_auc_score(yb, S[k][idx]))
            boot_ap[k].append(average_precision_score(yb, S[k][idx]))
    return _summary(yy, S, names, codes, G, boot_au, boot_ap, pairs, n_boot, skipped, level, seed)
