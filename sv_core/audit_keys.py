"""Synthetic key generators of the fixed-C deletion audit (:mod:`sv_core.audit`).

Each generator maps ``rng -> (n, d)`` keys; :mod:`sv_core.audit` registers them as regimes with
their construction stated (``REGIME_INFO``). :func:`dedupe` is the greedy 0.1-SD deduplication
the ICU regimes share.
"""
from __future__ import annotations

import numpy as np


def dedupe(X: np.ndarray, tol: float = 0.1) -> np.ndarray:
    """Greedy deduplication: keep a key only if it is farther than ``tol`` (Euclidean) from
    every key kept before it. Returns the kept keys in their original order."""
    kept: list[int] = []
    for i in range(X.shape[0]):
        if not kept or np.min(np.linalg.norm(X[kept] - X[i], axis=1)) > tol:
            kept.append(i)
    return X[kept]


def gaussian_keys(rng: np.random.Generator, n: int = 64, d: int = 6) -> np.ndarray:
    return rng.standard_normal((n, d))


def clustered_keys(rng: np.random.Generator, clusters: int = 8, per: int = 8, d: int = 6,
                   spread: float = 2.0, jitter: float = 0.01) -> np.ndarray:
    """Clustered near-duplicates: a few centres, each repeated with tiny jitter."""
    centres = spread * rng.standard_normal((clusters, d))
    X = np.repeat(centres, per, axis=0) + jitter * rng.standard_normal((clusters * per, d))
    return X[rng.permutation(X.shape[0])]


def icu_like_keys(rng: np.random.Generator, hours: int = 160, d: int = 6) -> np.ndarray:
    """ICU-like standardised 6-d vitals: long stable stretches with small noise and slow drift,
    a few short excursions; deduplicated at 0.1 SD as in the seed's ICU regime."""
    X = np.empty((hours, d))
    level = 0.5 * rng.standard_normal(d)
    t = 0
    while t < hours:
        seg = int(rng.integers(12, 48))
        drift = 0.01 * rng.standard_normal(d)
        for _ in range(min(seg, hours - t)):
            level = level + drift
            X[t] = level + 0.05 * rng.standard_normal(d)
            t += 1
        if rng.random() < 0.5 and t < hours:  # excursion (deterioration-like)
            L = int(rng.integers(1, 5))
            X[t : t + L] = level + rng.normal(0, 1.5, size=d)
            t += L
        level = level + 0.3 * rng.standard_normal(d)
    return dedupe(X, 0.1)


def duplicate_keys(rng: np.random.Generator, groups: int = 12, per: int = 6, d: int = 6) -> np.ndarray:
    """Stress regime beyond the seed's: exact repeats and 1e-6 near-repeats of a few keys."""
    centres = 1.5 * rng.standard_normal((groups, d))
    X = np.repeat(centres, per, axis=0)
    near = rng.random(X.shape[0]) < 0.5
    X[near] += 1e-6 * rng.standard_normal((int(np.count_nonzero(near)), d))
    return X[rng.permutation(X.shape[0])]


def redundant_keys(rng: np.random.Generator, clusters: int = 8, per: int = 8, d: int = 6,
                   spread: float = 2.0, jitter_range: tuple[float, float] = (1e-6, 1e-3),
                   p_repeats: float = 0.6) -> np.ndarray:
    """The seed's hard redundant regime: near-duplicate clusters at a per-trial jitter drawn
    log-uniformly from ``jitter_range``; with probability ``p_repeats`` half of each cluster's
    copies are exact repeats. Calibrated so that about half the trials have an identifiable
    partition (exact repeats make the optimal coefficients non-unique) and the support's Gram
    block has condition number >= 1e9 (see ``cond_K_support`` in the summary)."""
    centres = spread * rng.standard_normal((clusters, d))
    X = np.repeat(centres, per, axis=0)
    jit = float(np.exp(rng.uniform(np.log(jitter_range[0]), np.log(jitter_range[1]))))
    moved = np.ones(X.shape[0], dtype=bool)
    if rng.random() < p_repeats:
        moved[rng.permutation(X.shape[0])[: X.shape[0] // 2]] = False
    X[moved] += jit * rng.standard_normal((int(moved.sum()), d))
    return X[rng.permutation(X.shape[0])]


def jitter_regime(jitter: float, clusters: int = 8, per: int = 8, d: int = 6, spread: float = 2.0):
    """Near-duplicate clusters (``clusters`` centres x ``per`` copies) at a fixed ``jitter``
    (0: exact repeats), for the jitter sweep."""
    def gen(rng: np.random.Generator) -> np.ndarray:
        centres = spread * rng.standard_normal((clusters, d))
        X = np.repeat(centres, per, axis=0) + jitter * rng.standard_normal((clusters * per, d))
        return X[rng.permutation(X.shape[0])]
    return gen


#: the jitter sweep of near-duplicate clusters (8 x 8, d = 6); 0.0 = exact repeats
SWEEP_JITTERS = (1e-2, 1e-3, 3e-4, 1e-4, 3e-5, 1e-5, 1e-6, 1e-7, 0.0)


def sweep_name(j: float) -> str:
    return "jitter_0" if j == 0.0 else f"jitter_{j:.0e}"
