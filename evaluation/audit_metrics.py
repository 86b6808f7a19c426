"""Deletion-audit metrics: gate-score gaps, the coefficient-decay baseline, readout leakage.

A gate *state* here is ``(keys, alpha, rho)`` with the gate score
``s(x) = 2 Σ_i α_i κ(x, x_i) − ρ`` (SPEC §1) and the readout weight of key ``i`` for query ``q``
``α_i κ(q, x_i) / Σ_j α_j κ(q, x_j)``. The kernel is the project's one :func:`sv_core.rbf_kernel`.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from evaluation.errors import MetricError

__all__ = [
    "gate_scores",
    "max_abs_score_gap",
    "decay_alpha",
    "readout_weight_share",
    "readout_weight_share_reference",
]


def _matrix(x: Any, what: str) -> np.ndarray:
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise MetricError(f"{what} must be numeric: {exc}") from None
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise MetricError(f"{what} must have shape (n, d) with n >= 1; got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise MetricError(f"{what} contains NaN or infinite values")
    return arr


def _state(keys: Any, alpha: Any) -> tuple[np.ndarray, np.ndarray]:
    X = _matrix(keys, "keys")
    a = np.asarray(alpha, dtype=np.float64)
    if a.shape != (X.shape[0],):
        raise MetricError(f"alpha must have shape ({X.shape[0]},); got {a.shape}")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise MetricError("alpha must be finite and non-negative")
    return X, a


def gate_scores(keys: Any, alpha: Any, rho: float, probes: Any, sigma: float) -> np.ndarray:
    """Gate scores ``s(p) = 2 Σ_i α_i κ(p, x_i) − ρ`` of shape (m,) for probes of shape (m, d)."""
    from sv_core import rbf_kernel

    X, a = _state(keys, alpha)
    P = _matrix(probes, "probes")
    if P.shape[1] != X.shape[1]:
        raise MetricError(f"probes have d={P.shape[1]} but keys have d={X.shape[1]}")
    if not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma > 0):
        raise MetricError(f"sigma must be a finite positive number; got {sigma!r}")
    return 2.0 * np.asarray(rbf_kernel(P, X, float(sigma)), dtype=np.float64) @ a - float(rho)


def max_abs_score_gap(
    score_a: Callable[[np.ndarray], Any],
    score_b: Callable[[np.ndarray], Any],
    probe_sets: Mapping[str, Any],
) -> dict[str, float]:
    """Maximum ``|s_a(p) − s_b(p)|`` over each named probe set and over all of them.

    Parameters
    ----------
    score_a, score_b : callables mapping probes (m, d) -> scores (m,)
        E.g. ``gate.score`` of the decremented state and of the same-C refit.
    probe_sets : mapping name -> array (m, d)
        E.g. ``{"retained": ..., "removed": ..., "jittered": ...}``. Empty sets are skipped.

    Returns
    -------
    dict
        ``{name: max gap, ..., "all": overall max}``.
    """
    if not probe_sets:
        raise MetricError("probe_sets is empty")
    out: dict[str, float] = {}
    for name, probes in probe_sets.items():
        P = np.asarray(probes, dtype=np.float64)
        if P.ndim != 2:
            raise MetricError(f"probe set {name!r} must have shape (m, d); got {P.shape}")
        if P.shape[0] == 0:
            continue
        sa = np.asarray(score_a(P), dtype=np.float64).reshape(-1)
        sb = np.asarray(score_b(P), dtype=np.float64).reshape(-1)
        if sa.shape != (P.shape[0],) or sb.shape != (P.shape[0],):
            raise MetricError(f"score functions must return shape ({P.shape[0]},) for probe set {name!r}")
        gap = np.abs(sa - sb)
        if not np.all(np.isfinite(gap)):
            raise MetricError(f"non-finite gate scores on probe set {name!r}")
        out[str(name)] = float(gap.max())
    if not out:
        raise MetricError("every probe set is empty")
    out["all"] = max(out.values())
    return out


def decay_alpha(alpha: Any, idx: Any, gamma: float) -> np.ndarray:
    """Coefficient-decay baseline: multiply the target coefficients by ``gamma``, no re-solve.

    The targets stay present; Σα is no longer 1 and ρ is left as it was (the point of the
    baseline is that it does *not* restore optimality). Returns a new array of shape (n,).
    """
    a = np.asarray(alpha, dtype=np.float64)
    if a.ndim != 1:
        raise MetricError(f"alpha must have shape (n,); got {a.shape}")
    if not (isinstance(gamma, (int, float)) and 0.0 <= float(gamma) <= 1.0):
        raise MetricError(f"gamma must lie in [0, 1]; got {gamma!r}")
    ix = np.asarray(idx)
    if ix.ndim == 0:
        ix = ix.reshape(1)
    if ix.size and not np.issubdtype(ix.dtype, np.integer):
        raise MetricError(f"idx must be integer indices; got dtype {ix.dtype}")
    if ix.size and (ix.min() < -a.shape[0] or ix.max() >= a.shape[0]):
        raise MetricError(f"idx out of range for alpha of length {a.shape[0]}")
    out = a.copy()
    out[np.unique(ix % max(a.shape[0], 1))] *= float(gamma)
    return out


def readout_weight_share(keys: Any, alpha: Any, queries: Any, subset: Any, sigma: float) -> float:
    """Leakage: mean over queries of the readout weight carried by ``subset``.

    ``share(q) = Σ_{i∈subset} α_i κ(q, x_i) / Σ_i α_i κ(q, x_i)``, averaged over queries.
    Zero after a completed deletion of the subset (its α are 0); positive under decay.

    Parameters
    ----------
    keys : (n, d); alpha : (n,); queries : (m, d)
    subset : int indices or bool mask of shape (n,)
    sigma : float
    """
    from sv_core import rbf_kernel

    X, a = _state(keys, alpha)
    Q = _matrix(queries, "queries")
    if Q.shape[1] != X.shape[1]:
        raise MetricError(f"queries have d={Q.shape[1]} but keys have d={X.shape[1]}")
    mask = _subset_mask(subset, X.shape[0])
    W = np.asarray(rbf_kernel(Q, X, float(sigma)), dtype=np.float64) * a  # (m, n)
    den = W.sum(axis=1)
    if np.any(den <= 0):
        raise MetricError("a query has zero total readout weight (all α·κ are 0); leakage undefined")
    return float(np.mean(W[:, mask].sum(axis=1) / den))


def readout_weight_share_reference(keys: Any, alpha: Any, queries: Any, subset: Any, sigma: float) -> float:
    """Slow reference for :func:`readout_weight_share` (explicit loops and kernel formula)."""
    X, a = _state(keys, alpha)
    Q = _matrix(queries, "queries")
    mask = _subset_mask(subset, X.shape[0])
    shares = []
    for q in Q:
        w = [a[i] * math.exp(-float(np.sum((q - X[i]) ** 2)) / sigma**2) for i in range(X.shape[0])]
        shares.append(sum(w[i] for i in range(len(w)) if mask[i]) / sum(w))
    return float(sum(shares) / len(shares))


def _subset_mask(subset: Any, n: int) -> np.ndarray:
    s = np.asarray(subset)
    if s.dtype == bool:
        if s.shape != (n,):
            raise MetricError(f"boolean subset must have shape ({n},); got {s.shape}")
        return s
    s = s.reshape(-1)
    if s.size and not np.issubdtype(s.dtype, np.integer):
        raise MetricError(f"subset must be integer indices or a boolean mask; got dtype {s.dtype}")
    if s.size and (s.min() < 0 or s.max() >= n):
        raise MetricError(f"subset indices must lie in [0, {n})")
    mask = np.zeros(n, dtype=bool)
    mask[s] = True
    return mask
