"""Deterministic, seeded samples of stays.

Every stay gets a rank key ``SHA-256(seed, stay_id)`` (first 8 bytes, big-endian): the order
depends only on the seed and the stay's own id, never on which other stays are present, so a
sample of ``N`` stays is the ``N`` smallest keys — stable under rebuilds (a stay that stays
eligible keeps its place; a forgotten or newly ineligible stay leaves without reshuffling the
rest) and nested (the sample of ``N`` contains the sample of every ``M < N``). The hash is not
keyed: the same seed picks the same stays on every machine. Nothing of the order is stored.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from evaluation.errors import MetricError

__all__ = ["rank_keys", "seeded_order", "sample_stays"]


def rank_keys(stay_ids: Sequence[int], seed: int = 0) -> np.ndarray:
    """Rank key of each stay, shape (n,) uint64: the first 8 bytes of ``SHA-256("seed:stay_id")``."""
    s = int(seed)
    return np.fromiter((int.from_bytes(hashlib.sha256(f"{s}:{int(i)}".encode()).digest()[:8], "big")
                        for i in stay_ids), dtype=np.uint64, count=len(stay_ids))


def seeded_order(stay_ids: Sequence[int], seed: int = 0) -> np.ndarray:
    """``stay_ids`` (int64) in ascending rank-key order (ties, which need a hash collision, by id)."""
    ids = np.asarray(list(stay_ids), dtype=np.int64)
    if ids.size == 0:
        return ids
    return ids[np.lexsort((ids, rank_keys(ids, seed)))]


def sample_stays(stay_ids: Sequence[int], n: int | None, seed: int = 0) -> np.ndarray:
    """The ``n`` stays of ``stay_ids`` with the smallest rank keys, returned ascending by id
    (every stay when ``n`` is None or at least the number of stays).

    Raises :class:`MetricError` for duplicate ids or ``n < 1``.
    """
    ids = np.asarray(list(stay_ids), dtype=np.int64)
    if np.unique(ids).size != ids.size:
        raise MetricError("stay ids must be unique")
    if n is None or n >= ids.size:
        return np.sort(ids)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise MetricError(f"the number of stays must be a positive integer, got {n!r}")
    return np.sort(seeded_order(ids, seed)[: int(n)])
