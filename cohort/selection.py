"""Deterministic stay sampling and subject-level train/val/test splits."""
from __future__ import annotations

import numpy as np

from cohort.constants import SPLIT_FRACTIONS
from cohort.errors import BadParameterError


def sample_stays(stay_ids, n: int | None, seed: int) -> np.ndarray:
    """Sample ``n`` stays without replacement, deterministically per ``seed``.

    Parameters
    ----------
    stay_ids : array-like of int, shape (n_stays,)
    n : int or None
        None (or n ≥ n_stays) keeps every stay.
    seed : int

    Returns
    -------
    ndarray of int64, shape (min(n, n_stays),), sorted ascending.
    """
    ids = np.unique(np.asarray(stay_ids, dtype=np.int64))
    if n is None or n >= ids.size:
        return ids
    if n < 1:
        raise BadParameterError(f"sample size must be ≥ 1, got {n}")
    rng = np.random.default_rng([int(seed), 0x5A4D])
    return np.sort(rng.choice(ids, size=int(n), replace=False))


def assign_splits(subject_ids, seed: int, fractions=SPLIT_FRACTIONS) -> dict[int, str]:
    """Assign each subject to ``train``/``val``/``test`` (no subject in two splits).

    Subjects are sorted, permuted with ``seed``; the first ``round(0.70·n)`` are train (at
    least one), the next ``round(0.15·n)`` val, the rest test.

    Parameters
    ----------
    subject_ids : array-like of int, shape (n,) (duplicates allowed)
    seed : int

    Returns
    -------
    dict subject_id -> split name.
    """
    subj = np.unique(np.asarray(subject_ids, dtype=np.int64))
    n = subj.size
    rng = np.random.default_rng([int(seed), 0x5B17])
    perm = subj[rng.permutation(n)]
    n_train = max(1, int(round(fractions[0] * n))) if n else 0
    n_val = min(n - n_train, int(round(fractions[1] * n)))
    out: dict[int, str] = {}
    for i, s in enumerate(perm.tolist()):
        out[s] = "train" if i < n_train else ("val" if i < n_train + n_val else "test")
    return out
