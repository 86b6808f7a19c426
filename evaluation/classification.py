"""Classification metrics: AUROC and AUPRC with percentile bootstrap intervals (flat or cluster
bootstrap over groups), and ROC curves on a fixed grid for the report.

Bootstrap resamples are drawn as in :func:`evaluation.metrics.bootstrap_indices` (the same
generator consumption as the slow reference loops of :mod:`evaluation.metrics`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from evaluation.errors import MetricError
from evaluation.metrics import bootstrap_indices, check_boot_args

__all__ = ["ClassificationCI", "auroc_auprc_with_ci", "roc_curve_points"]


@dataclass(frozen=True)
class ClassificationCI:
    """Point estimates and percentile bootstrap intervals for AUROC and AUPRC.

    ``n_boot_used`` counts resamples containing both classes (others are skipped, and counted in
    ``n_boot_skipped``). ``groups`` in the call switches to a cluster bootstrap over groups.
    """

    auroc: float
    auroc_low: float
    auroc_high: float
    auprc: float
    auprc_low: float
    auprc_high: float
    prevalence: float
    n: int
    n_pos: int
    n_boot_used: int
    n_boot_skipped: int
    level: float
    seed: int
    n_groups: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _binary(y: Any, p: Any) -> tuple[np.ndarray, np.ndarray]:
    yy = np.asarray(y)
    pp = np.asarray(p, dtype=np.float64)
    if yy.ndim != 1 or pp.ndim != 1 or yy.shape != pp.shape:
        raise MetricError(f"labels and scores must be 1-D of equal length; got {yy.shape} and {pp.shape}")
    if yy.size == 0:
        raise MetricError("labels are empty")
    if not np.all(np.isin(yy, (0, 1))):
        raise MetricError("labels must be binary (0/1 or bool)")
    if not np.all(np.isfinite(pp)):
        raise MetricError("scores contain NaN or infinite values")
    yy = yy.astype(np.int8)
    if yy.min() == yy.max():
        raise MetricError("AUROC/AUPRC need both classes; labels are all one class")
    return yy, pp


def auroc_auprc_with_ci(
    y: Any,
    p: Any,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    *,
    groups: Any = None,
    progress: bool = False,
) -> ClassificationCI:
    """AUROC and AUPRC (scikit-learn's ``roc_auc_score``/``average_precision_score``) with
    percentile bootstrap intervals.

    Parameters
    ----------
    y : array-like of {0, 1}, shape (n,)
    p : array-like of float, shape (n,)
        Predicted scores/probabilities (higher = positive).
    n_boot, seed, level
        Bootstrap settings (resamples drawn as in :func:`bootstrap_indices`).
    groups : array-like, shape (n,), optional
        Cluster labels (e.g. one per ICU stay). If given, whole groups are resampled, which
        respects the within-stay correlation of hourly predictions. Labels stay in memory only.
    progress : bool
        Show a tqdm progress bar over resamples.
    """
    from sklearn.metrics import average_precision_score, roc_auc_score

    yy, pp = _binary(y, p)
    n_boot, level = check_boot_args(n_boot, level)
    rng = np.random.default_rng(seed)
    n = yy.shape[0]

    members: list[np.ndarray] | None = None
    if groups is not None:
        g = np.asarray(groups)
        if g.shape != (n,):
            raise MetricError(f"groups must have shape ({n},); got {g.shape}")
        _, inverse = np.unique(g, return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        bounds = np.flatnonzero(np.diff(inverse[order])) + 1
        members = np.split(order, bounds)

    aurocs: list[float] = []
    auprcs: list[float] = []
    skipped = 0
    iterator: Any = range(n_boot)
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, desc="bootstrap AUROC/AUPRC", leave=False)
    for _ in iterator:
        if members is None:
            idx = bootstrap_indices(rng, 1, n)[0]
        else:
            pick = bootstrap_indices(rng, 1, len(members))[0]
            idx = np.concatenate([members[j] for j in pick])
        yb = yy[idx]
        if yb.min() == yb.max():
            skipped += 1
            continue
        aurocs.append(roc_auc_score(yb, pp[idx]))
        auprcs.append(average_precision_score(yb, pp[idx]))
    if not aurocs:
        raise MetricError("every bootstrap resample had a single class; cannot form an interval")
    tail = (1.0 - level) / 2.0 * 100.0
    a_lo, a_hi = np.percentile(aurocs, [tail, 100.0 - tail])
    p_lo, p_hi = np.percentile(auprcs, [tail, 100.0 - tail])
    return ClassificationCI(
        auroc=float(roc_auc_score(yy, pp)),
        auroc_low=float(a_lo),
        auroc_high=float(a_hi),
        auprc=float(average_precision_score(yy, pp)),
        auprc_low=float(p_lo),
        auprc_high=float(p_hi),
        prevalence=float(yy.mean()),
        n=int(n),
        n_pos=int(yy.sum()),
        n_boot_used=len(aurocs),
        n_boot_skipped=skipped,
        level=level,
        seed=int(seed),
        n_groups=None if members is None else len(members),
    )


def roc_curve_points(y: Any, p: Any, n_points: int = 101) -> dict[str, list[float]]:
    """ROC curve resampled on a fixed false-positive-rate grid (an aggregate, safe to store).

    Returns ``{"fpr": [...], "tpr": [...]}`` with ``n_points`` entries each; ``tpr`` is the
    step-wise maximum true-positive rate achievable at each grid FPR.
    """
    from sklearn.metrics import roc_curve

    yy, pp = _binary(y, p)
    if isinstance(n_points, bool) or not isinstance(n_points, int) or n_points < 2:
        raise MetricError(f"n_points must be an integer >= 2; got {n_points!r}")
    fpr, tpr, _ = roc_curve(yy, pp)
    grid = np.linspace(0.0, 1.0, n_points)
    # right-continuous step: largest tpr among thresholds with fpr <= grid value
    pos = np.searchsorted(fpr, grid, side="right") - 1
    tgrid = np.maximum.accumulate(tpr)[np.clip(pos, 0, None)]
    return {"fpr": [float(v) for v in grid], "tpr": [float(v) for v in tgrid]}


# --------------------------------------------------------------------------------------------
# paired significance tests
