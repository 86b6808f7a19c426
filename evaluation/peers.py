"""The strongest published selection peers, behind the one policy interface of :mod:`evaluation.policies`.

The KV-cache compression scores users reach for today (several ship in NVIDIA's ``kvpress``).
Each is a :class:`evaluation.policies.SelectionPolicy`: it scores every key of one context and
:func:`evaluation.policies.select_top_k` keeps the ``k`` highest (ties -> earlier token), so a
comparison at a matched budget differs only in *which* tokens are kept.

* query-free (any key stream, e.g. ICU hours): ``leverage`` (ridge leverage, Alaoui & Mahoney
  2015; Cohen, Musco & Musco 2017), ``kernel_leverage`` (the same in the gate's RBF feature
  space), ``keydiff`` (Park et al. 2025, arXiv:2504.15364);
* query-stream (``queries`` = the *observed* queries, never the evaluation queries): ``snapkv``
  (Li et al. 2024, arXiv:2404.14469), ``tova`` (Oren et al. 2024, arXiv:2401.06104), both
  scoring with the readout attention of :func:`rbf_attention`.

Each class states its score; λ of the leverage peers: :func:`_check_lam`. Each fast path has a
slow, obvious ``*_reference`` implementation beside it for tests.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from evaluation.errors import PolicyError
from evaluation.policy_base import SelectionPolicy, as_keys, check_sigma, gram_row_blocks, rbf

__all__ = [
    "LeveragePolicy",
    "KernelLeveragePolicy",
    "KeyDiffPolicy",
    "SnapKVPolicy",
    "TOVAPolicy",
    "PEER_POLICIES",
    "QUERY_FREE_PEERS",
    "QUERY_PEERS",
    "leverage_scores_reference",
    "kernel_leverage_scores_reference",
    "keydiff_scores_reference",
    "snapkv_scores_reference",
    "rbf_attention",
]

#: peers that need only the keys (run on every selection study)
QUERY_FREE_PEERS = ("leverage", "kernel_leverage", "keydiff")
#: peers that need an observed query stream (run where one exists)
QUERY_PEERS = ("snapkv", "tova")


def _check_lam(lam_rel: Any, lam: Any) -> tuple[float, float | None]:
    """Check the ridge of the leverage peers (typed error on a bad value).

    ``λ = lam_rel · (mean eigenvalue)``, i.e. ``lam_rel · tr(XᵀX)/d`` for keys and ``lam_rel · tr(K)/n
    = lam_rel`` for the RBF Gram (κ(x, x) = 1), with ``lam_rel = 1e-2`` by default. Why: (i) the scale
    is relative, so z-scored vitals, unit sentence embeddings and learned keys are treated alike and
    rescaling the keys does not change the ranking; (ii) a ridge is *needed*: exact duplicate keys
    (common in hourly vitals) make ``XᵀX``/``K`` singular and the unridged scores undefined; (iii) 1 %
    of the average energy is small enough that a direction carried by a single key still gives it
    leverage ≈ 1 (it is "novel"), while directions carried only by near-duplicate jitter fall below λ
    and are shared out among the duplicates (they are "redundant") — the behaviour that makes leverage
    a strong redundancy-aware peer. An absolute ``lam`` can be given instead.
    """
    if not isinstance(lam_rel, (int, float, np.floating)) or not math.isfinite(lam_rel) or lam_rel <= 0:
        raise PolicyError(f"lam_rel must be a finite positive number; got {lam_rel!r}")
    if lam is not None and (not isinstance(lam, (int, float, np.floating)) or not math.isfinite(lam) or lam <= 0):
        raise PolicyError(f"lam must be None or a finite positive number; got {lam!r}")
    return float(lam_rel), None if lam is None else float(lam)


def _as_queries(queries: Any, X: np.ndarray, who: str) -> np.ndarray:
    if queries is None:
        raise PolicyError(f"{who} needs the observed query stream (queries=...)")
    Q = as_keys(queries, "queries")
    if Q.shape[1] != X.shape[1]:
        raise PolicyError(f"queries have d={Q.shape[1]} but keys have d={X.shape[1]}")
    return Q


def rbf_attention(Q: np.ndarray, X: np.ndarray, sigma: float) -> np.ndarray:
    """Readout attention ``A[q, i] = κ(q, x_i) / Σ_j κ(q, x_j)`` (an all-zero row stays zero).

    This is the project's readout attention (the one every study's readout uses and
    :class:`evaluation.policies.OracleAttentionPolicy` sums), not a dot-product softmax: a
    query-stream peer scores with the attention it will be evaluated under.
    """
    W = np.asarray(rbf()(Q, X, sigma), dtype=np.float64)
    row = W.sum(axis=1, keepdims=True)
    return np.divide(W, row, out=np.zeros_like(W), where=row > 0)


# --------------------------------------------------------------------------------------------
# leverage
# --------------------------------------------------------------------------------------------
class LeveragePolicy(SelectionPolicy):
    """Ridge leverage scores of the key matrix: ``τ_i = [X (XᵀX + λI)⁻¹ Xᵀ]_ii`` (keep highest).

    Alaoui & Mahoney (2015), "Fast Randomized Kernel Ridge Regression with Statistical
    Guarantees", eq. (1) with the linear kernel; Cohen, Musco & Musco (2017), "Input Sparsity Time
    Low-rank Approximation via Ridge Leverage Score Sampling". Keys are used as given (no
    centring). ``λ = lam_rel · tr(XᵀX)/d`` unless ``lam`` is given (:func:`_check_lam`: why 1e-2).
    """

    name = "leverage"

    def __init__(self, lam_rel: float = 1e-2, lam: float | None = None) -> None:
        self.lam_rel, self.lam = _check_lam(lam_rel, lam)

    def _params(self) -> dict[str, Any]:
        return {"lam_rel": self.lam_rel, "lam": self.lam}

    def ridge(self, X: np.ndarray) -> float:
        """The λ used for key matrix ``X``."""
        if self.lam is not None:
            return self.lam
        tr = float(np.einsum("ij,ij->", X, X))
        return self.lam_rel * (tr / X.shape[1] if tr > 0 else 1.0)

    def score(self, keys: Any, *, rng: np.random.Generator | None = None, queries: Any = None) -> np.ndarray:
        X = as_keys(keys)
        G = X.T @ X + self.ridge(X) * np.eye(X.shape[1])
        Z = np.linalg.solve(G, X.T)  # (d, n) = (XᵀX + λI)⁻¹ Xᵀ
        return np.einsum("ij,ji->i", X, Z)


def leverage_scores_reference(keys: Any, lam: float) -> np.ndarray:
    """Slow reference: the full hat matrix ``X (XᵀX + λI)⁻¹ Xᵀ`` by explicit inverse, its diagonal."""
    X = as_keys(keys)
    H = X @ np.linalg.inv(X.T @ X + lam * np.eye(X.shape[1])) @ X.T
    return np.array([H[i, i] for i in range(X.shape[0])])


class KernelLeveragePolicy(SelectionPolicy):
    """Kernel ridge leverage scores in the gate's RBF space: ``τ_i = [K (K + λI)⁻¹]_ii`` (keep highest).

    Alaoui & Mahoney (2015) eq. (1); Musco & Musco (2017), "Recursive Sampling for the Nyström
    Method". ``K = sv_core.rbf_kernel(X, X, σ)`` with the same σ as the gate it is compared with;
    ``λ = lam_rel · tr(K)/n = lam_rel`` unless ``lam`` is given. Computed as
    ``τ = 1 − λ·diag((K + λI)⁻¹)`` (identity ``K(K+λI)⁻¹ = I − λ(K+λI)⁻¹``) via a Cholesky factor.
    """

    name = "kernel_leverage"

    def __init__(self, sigma: float, lam_rel: float = 1e-2, lam: float | None = None) -> None:
        self.sigma = check_sigma(sigma)
        self.lam_rel, self.lam = _check_lam(lam_rel, lam)

    def _params(self) -> dict[str, Any]:
        return {"sigma": self.sigma, "lam_rel": self.lam_rel, "lam": self.lam}

    def ridge(self, K: np.ndarray) -> float:
        if self.lam is not None:
            return self.lam
        return self.lam_rel * float(np.trace(K)) / K.shape[0]

    def score(self, keys: Any, *, rng: np.random.Generator | None = None, queries: Any = None) -> np.ndarray:
        X = as_keys(keys)
        # one n x n buffer (Fortran order: LAPACK factors and inverts it in place) holds K's lower
        # triangle, its Cholesky factor and the factor's inverse; K is written into it by row
        # blocks (gram_row_blocks: the same entries as the whole kernel), so nothing else of n x n
        # size is ever allocated: a 7,670-hour stay needs one 0.47 GB buffer, not two
        n = X.shape[0]
        K = np.empty((n, n), order="F")
        for r0, r1, B in gram_row_blocks(X, self.sigma, lower=True):
            K[r0:r1, :r1] = B
        lam = self.ridge(K)
        from scipy.linalg.lapack import dpotrf, dtrtri

        K.flat[:: n + 1] += lam
        L, info = dpotrf(K, lower=1, clean=1, overwrite_a=1)
        if info != 0:
            raise PolicyError(f"kernel leverage: K + λI is not positive definite (LAPACK info {info})")
        # L⁻¹ by LAPACK's triangular inverse (n³/3 flops; a general solve against I costs ~8× that);
        # diag((LLᵀ)⁻¹) = column norms² of L⁻¹
        Linv, info = dtrtri(L, lower=1, overwrite_c=1)
        if info != 0:
            raise PolicyError(f"kernel leverage: the Cholesky factor is singular (LAPACK info {info})")
        return 1.0 - lam * np.einsum("ij,ij->j", Linv, Linv)


def kernel_leverage_scores_reference(keys: Any, sigma: float, lam: float) -> np.ndarray:
    """Slow reference: explicit kernel loop, explicit inverse, diagonal of ``K (K + λI)⁻¹``."""
    X = as_keys(keys)
    n = X.shape[0]
    K = np.array([[math.exp(-float(np.sum((X[i] - X[j]) ** 2)) / sigma**2) for j in range(n)] for i in range(n)])
    M = K @ np.linalg.inv(K + lam * np.eye(n))
    return np.array([M[i, i] for i in range(n)])


# --------------------------------------------------------------------------------------------
# KeyDiff
# --------------------------------------------------------------------------------------------
class KeyDiffPolicy(SelectionPolicy):
    """KeyDiff: keep the keys least similar to the mean key (Park et al. 2025, arXiv:2504.15364).

    ``a = mean_i x_i/‖x_i‖`` (the anchor, as in the paper and kvpress ``KeyDiffPress``) and
    ``score_i = −cos(x_i, a)``. Norms below ``eps`` are clamped to ``eps`` (torch's
    ``cosine_similarity`` convention), so a zero key or a zero anchor scores 0.
    """

    name = "keydiff"

    def __init__(self, eps: float = 1e-8) -> None:
        if not isinstance(eps, (int, float)) or not eps > 0:
            raise PolicyError(f"eps must be a positive number; got {eps!r}")
        self.eps = float(eps)

    def score(self, keys: Any, *, rng: np.random.Generator | None = None, queries: Any = None) -> np.ndarray:
        X = as_keys(keys)
        nrm = np.maximum(np.linalg.norm(X, axis=1), self.eps)
        a = (X / nrm[:, None]).mean(axis=0)
        return -(X @ a) / (nrm * max(float(np.linalg.norm(a)), self.eps))


def keydiff_scores_reference(keys: Any, eps: float = 1e-8) -> np.ndarray:
    """Slow reference of :class:`KeyDiffPolicy` (loops, explicit cosine)."""
    X = as_keys(keys)
    units = [x / max(math.sqrt(float(x @ x)), eps) for x in X]
    a = sum(units) / len(units)
    na = max(math.sqrt(float(a @ a)), eps)
    return np.array([-float(x @ a) / (max(math.sqrt(float(x @ x)), eps) * na) for x in X])


# --------------------------------------------------------------------------------------------
# query-stream peers
# --------------------------------------------------------------------------------------------
class SnapKVPolicy(SelectionPolicy):
    """SnapKV (Li et al. 2024, arXiv:2404.14469): observation-window attention votes, pooled.

    ``v_i = Σ_{q ∈ window} A[q, i]`` with ``A`` the readout attention (:func:`rbf_attention`), then a 1-D
    pool along token positions with stride 1 and ``kernel_size`` (odd): ``max`` takes the window
    maximum (edges clipped), ``avg`` the window sum / ``kernel_size`` with zero padding (torch
    ``avg_pool1d`` with ``count_include_pad=True``, as in kvpress ``SnapKVPress``). ``window``
    keeps only the last ``window`` observed queries (``None``: all given). Defaults
    ``kernel_size = 5``, ``pooling = "avg"`` follow kvpress. SnapKV additionally always keeps the
    observation-window tokens themselves when they are part of the context; a caller whose queries
    are context tokens protects them (the streaming study does).
    """

    name = "snapkv"
    requires_queries = True

    def __init__(self, sigma: float, window: int | None = None, kernel_size: int = 5, pooling: str = "avg") -> None:
        self.sigma = check_sigma(sigma)
        if window is not None and (isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1):
            raise PolicyError(f"window must be None or a positive integer; got {window!r}")
        if isinstance(kernel_size, bool) or not isinstance(kernel_size, (int, np.integer)) or kernel_size < 1 \
                or kernel_size % 2 == 0:
            raise PolicyError(f"kernel_size must be a positive odd integer; got {kernel_size!r}")
        if pooling not in ("max", "avg"):
            raise PolicyError(f"pooling must be 'max' or 'avg'; got {pooling!r}")
        self.window = None if window is None else int(window)
        self.kernel_size = int(kernel_size)
        self.pooling = pooling

    def _params(self) -> dict[str, Any]:
        return {"sigma": self.sigma, "window": self.window, "kernel_size": self.kernel_size, "pooling": self.pooling}

    def score(self, keys: Any, *, rng: np.random.Generator | None = None, queries: Any = None) -> np.ndarray:
        X = as_keys(keys)
        Q = _as_queries(queries, X, "SnapKVPolicy")
        if self.window is not None:
            Q = Q[-self.window:]
        votes = rbf_attention(Q, X, self.sigma).sum(axis=0)
        r = self.kernel_size // 2
        if r == 0:
            return votes
        if self.pooling == "max":
            pad = np.pad(votes, r, constant_values=-np.inf)
            return np.lib.stride_tricks.sliding_window_view(pad, self.kernel_size).max(axis=1)
        pad = np.pad(votes, r, constant_values=0.0)
        return np.lib.stride_tricks.sliding_window_view(pad, self.kernel_size).sum(axis=1) / self.kernel_size


def snapkv_scores_reference(keys: Any, queries: Any, sigma: float, kernel_size: int = 5,
                            pooling: str = "avg") -> np.ndarray:
    """Slow reference of :class:`SnapKVPolicy` (all queries as the window; loops)."""
    X = as_keys(keys)
    Q = as_keys(queries, "queries")
    n = X.shape[0]
    votes = [0.0] * n
    for q in Q:
        w = [math.exp(-float(np.sum((q - x) ** 2)) / sigma**2) for x in X]
        tot = sum(w)
        if tot > 0:
            for i in range(n):
                votes[i] += w[i] / tot
    r = kernel_size // 2
    out = []
    for i in range(n):
        nb = [votes[j] for j in range(i - r, i + r + 1) if 0 <= j < n]
        out.append(max(nb) if pooling == "max" else sum(nb) / kernel_size)
    return np.array(out)


class TOVAPolicy(SelectionPolicy):
    """TOVA (Oren et al. 2024, arXiv:2401.06104): keep the keys the *last* query attends to most.

    ``score_i = A[q_last, i]`` with ``A`` the readout attention (:func:`rbf_attention`); ``queries`` is the
    observed stream and only its last row is read.
    """

    name = "tova"
    requires_queries = True

    def __init__(self, sigma: float) -> None:
        self.sigma = check_sigma(sigma)

    def _params(self) -> dict[str, Any]:
        return {"sigma": self.sigma}

    def score(self, keys: Any, *, rng: np.random.Generator | None = None, queries: Any = None) -> np.ndarray:
        X = as_keys(keys)
        Q = _as_queries(queries, X, "TOVAPolicy")
        return rbf_attention(Q[-1:], X, self.sigma)[0]


#: canonical name -> class, merged into :func:`evaluation.policies.get_policy`'s registry
PEER_POLICIES: dict[str, type[SelectionPolicy]] = {
    "leverage": LeveragePolicy,
    "kernel_leverage": KernelLeveragePolicy,
    "keydiff": KeyDiffPolicy,
    "snapkv": SnapKVPolicy,
    "tova": TOVAPolicy,
}
