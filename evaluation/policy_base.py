"""The selection-policy interface and the input checks every policy shares.

:class:`SelectionPolicy` is the one policy interface (a KV-cache "press"): a policy scores every key
of a context, :func:`select_top_k` keeps the ``k`` highest scores. The built-in policies live in
:mod:`evaluation.policies`, the published peers in :mod:`evaluation.peers`; both build on this module,
so neither imports the other's internals.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np

from evaluation.errors import PolicyError

__all__ = ["SelectionPolicy", "as_keys", "check_sigma", "check_scores", "check_budget", "gram_row_blocks", "rbf",
           "select_top_k", "select_top_k_reference"]

#: kernel entries per block of :func:`gram_row_blocks` (8 MB of fp64 per block)
GRAM_BLOCK = 1 << 20
#: rows of a block at least (a one-row product takes the BLAS's vector path, whose rounding differs)
GRAM_MIN_ROWS = 64


# --------------------------------------------------------------------------------------------
# input checks
# --------------------------------------------------------------------------------------------
def as_keys(keys: Any, what: str = "keys") -> np.ndarray:
    """Validate a key matrix and return it as a float64 array of shape (n, d)."""
    try:
        arr = np.asarray(keys, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"{what} must be a numeric array of shape (n, d): {exc}") from None
    if arr.ndim != 2:
        raise PolicyError(f"{what} must have shape (n, d); got ndim={arr.ndim}")
    if arr.shape[0] == 0:
        raise PolicyError(f"{what} is empty (n = 0)")
    if not np.all(np.isfinite(arr)):
        raise PolicyError(f"{what} contains NaN or infinite values")
    return arr


def check_sigma(sigma: float) -> float:
    if not isinstance(sigma, (int, float, np.floating, np.integer)) or not math.isfinite(sigma) or sigma <= 0:
        raise PolicyError(f"sigma must be a finite positive number; got {sigma!r}")
    return float(sigma)


def rbf() -> Callable[..., np.ndarray]:
    """The project's one RBF kernel (imported lazily so metric-only users need no solver)."""
    from sv_core import rbf_kernel

    return rbf_kernel


def gram_row_blocks(X: np.ndarray, sigma: float, *, lower: bool = False, block: int | None = None):
    """The Gram matrix ``rbf_kernel(X, X, σ)`` by row blocks, never whole: yields ``(r0, r1, B)``
    with ``B = K[r0:r1, :]`` (``lower``: ``K[r0:r1, :r1]``, what the lower triangle needs) in order,
    at most ``block`` (default :data:`GRAM_BLOCK`) entries a block, and :data:`GRAM_MIN_ROWS` rows.

    Every entry equals the whole matrix's to rounding: each block is the kernel of its rows against
    ``X`` from its first row on, so the kernel's centring (on ``X[0]``) and each entry's formula are
    the same (a symmetric entry ``K[j, i]`` is computed as ``K[i, j]``); the products come from a BLAS
    call on the block's rows, the same bits on most builds and within a few ulps where a build picks
    another kernel for another row count (tests/test_evaluation_gram_blocks.py).
    """
    n = X.shape[0]
    rows = max(GRAM_MIN_ROWS, int(GRAM_BLOCK if block is None else block) // max(n, 1))
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        yield r0, r1, rbf()(X[r0:r1], X[:r1] if lower else X, sigma)


# --------------------------------------------------------------------------------------------
# selection
# --------------------------------------------------------------------------------------------
def select_top_k(scores: Any, k: int) -> np.ndarray:
    """Indices of the ``k`` highest scores, returned in ascending (temporal) order.

    Parameters
    ----------
    scores : array-like of shape (n,)
        Finite scores; higher means "keep".
    k : int
        Budget, ``0 <= k <= n``.

    Returns
    -------
    kept : ndarray of shape (k,), dtype intp
        Sorted kept indices. Ties are broken by ascending index (the earlier token is kept).
    """
    s = check_scores(scores)
    k = check_budget(k, s.shape[0])
    order = np.argsort(-s, kind="stable")  # stable: equal scores keep ascending index order
    return np.sort(order[:k]).astype(np.intp)


def select_top_k_reference(scores: Any, k: int) -> np.ndarray:
    """Slow reference for :func:`select_top_k` (Python sort on ``(-score, index)``)."""
    s = check_scores(scores)
    k = check_budget(k, s.shape[0])
    ranked = sorted(range(s.shape[0]), key=lambda i: (-float(s[i]), i))
    return np.array(sorted(ranked[:k]), dtype=np.intp)


def check_scores(scores: Any) -> np.ndarray:
    try:
        s = np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"scores must be numeric: {exc}") from None
    if s.ndim != 1:
        raise PolicyError(f"scores must have shape (n,); got shape {s.shape}")
    if not np.all(np.isfinite(s)):
        raise PolicyError("scores contain NaN or infinite values")
    return s


def check_budget(k: Any, n: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise PolicyError(f"budget k must be an integer; got {k!r}")
    if not 0 <= int(k) <= n:
        raise PolicyError(f"budget k must satisfy 0 <= k <= n = {n}; got {k}")
    return int(k)


# --------------------------------------------------------------------------------------------
# interface
# --------------------------------------------------------------------------------------------
class SelectionPolicy(ABC):
    """One token-selection policy.

    Subclasses set :attr:`name` and implement :meth:`score`. :attr:`requires_queries` marks
    oracle policies that read the evaluation queries (all others must ignore them).
    """

    name: str = "policy"
    requires_queries: bool = False

    @abstractmethod
    def score(self, keys: Any, *, rng: np.random.Generator | None = None, queries: Any = None) -> np.ndarray:
        """Score every key of one context.

        Parameters
        ----------
        keys : array-like of shape (n, d)
            The context's keys in temporal order.
        rng : numpy Generator, optional
            Randomness source for stochastic policies; ignored by deterministic ones.
        queries : array-like of shape (m, d), optional
            Evaluation queries; read only by oracle policies.

        Returns
        -------
        scores : ndarray of shape (n,)
            Higher = more worth keeping.
        """

    def select(self, keys: Any, k: int, *, rng: np.random.Generator | None = None, queries: Any = None) -> np.ndarray:
        """Kept indices (ascending, shape ``(k,)``) under budget ``k``."""
        return select_top_k(self.score(keys, rng=rng, queries=queries), k)

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self._params().items())
        return f"{type(self).__name__}({params})"

    def _params(self) -> dict[str, Any]:
        return {}
