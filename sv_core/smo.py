"""SMO for the fixed-C SVDD dual: the fast partition finder of :func:`sv_core.solve`.

Problem (SPEC §1), RBF kernel (``diag K = 1``)::

    min_a  a^T K a - diag(K)^T a    s.t.  sum(a) = 1,  0 <= a_i <= C

Algorithm: the second-order working-set selection of libsvm (Fan, Chen and Lin 2005; every label
+1), stated at :func:`smo_reference`, from the start of :func:`initial_alpha`. Two implementations
of the same loop, tested against each other: :func:`smo_reference` (NumPy, slow and readable) and
the compiled ``sv_core._smo`` (``sv_core/_smo.c``, optional); :func:`smo` runs the compiled loop
when it is built and the reference otherwise (``FORGETFUL_SOLVER=reference`` selects it). The
result is *not* certified here: :func:`sv_core.solve` identifies the partition, re-solves the
margin system and checks KKT on an exactly recomputed gradient.
"""
from __future__ import annotations

import math
import os
import types
from dataclasses import dataclass

import numpy as np

from sv_core.kernels import rbf_matvec

_smo: types.ModuleType | None
try:  # built by setup.py; absent without a C compiler (then the reference loop runs)
    from sv_core import _smo
except ImportError:  # pragma: no cover - depends on the build
    _smo = None
#: the interface version this module speaks (``SMO_ABI`` in the C file); a stale build is ignored
ABI = 1
if _smo is not None and getattr(_smo, "ABI", None) != ABI:  # pragma: no cover
    _smo = None

ENABLED = os.environ.get("FORGETFUL_SOLVER", "").strip().lower() not in ("reference", "numpy", "python")

#: default stopping gap ``max_{a>0} G - min_{a<C} G`` (libsvm's ``tol`` in the same units)
SMO_TOL = 1e-9
#: curvature used when ``q <= 0`` (exact duplicates), as in libsvm
TAU = 1e-12
#: default memory of the compiled loop's kernel-column cache
CACHE_BYTES = 64 << 20
#: termination codes
CONVERGED, MAX_ITER, STALLED = 0, 1, 2
CODES = {CONVERGED: "converged", MAX_ITER: "max_iter", STALLED: "stalled"}


def fast_smo_available() -> bool:
    """True when the compiled SMO is built and not switched off by ``FORGETFUL_SOLVER``."""
    return _smo is not None and ENABLED


@dataclass
class SMOResult:
    """What :func:`smo` returns: ``alpha`` (n,), ``G`` (n,) the loop's maintained gradient
    ``2 K alpha - diag K``, ``iterations``, ``status`` ("converged", "max_iter", "stalled"),
    ``method`` ("compiled" or "reference") and the compiled loop's cache counters."""

    alpha: np.ndarray
    G: np.ndarray
    iterations: int
    status: str
    method: str
    cache_hits: int = 0
    cache_misses: int = 0
    cache_columns: int = 0


def initial_alpha(X: np.ndarray, C: float) -> np.ndarray:
    """Feasible start: ``floor(1/C)`` keys at ``C`` and one key with the remainder ``1 - floor(1/C) C``.

    The keys placed are the farthest from the mean key (squared Euclidean distance, ties by
    index). Requires ``n C >= 1``.

    Parameters
    ----------
    X : (n, d) keys;  C : the box

    Returns
    -------
    alpha : (n,) with ``sum(alpha) = 1`` up to rounding and ``0 <= alpha <= C``

    libsvm starts from the first keys in row order; on RBF problems the keys at ``C`` are the ones
    outside the sphere, which distance from the mean ranks well, so the iterations only exchange the
    few keys it ranks wrongly. The starting gradient is one blocked kernel product
    (:func:`sv_core.kernels.rbf_matvec`, BLAS), O(n / C) kernel entries.
    """
    n = X.shape[0]
    k = min(n, int(math.floor(1.0 / C)))
    rem = 1.0 - k * C
    if rem >= C and k < n:  # 1/C rounded down by one
        k += 1
        rem = 1.0 - k * C
    d2 = ((X - X.mean(axis=0)) ** 2).sum(axis=1)
    order = np.argsort(-d2, kind="stable")
    a = np.zeros(n)
    a[order[:k]] = C
    if rem > 0.0 and k < n:
        a[order[k]] = rem
    return a


def gradient(X: np.ndarray, alpha: np.ndarray, sigma: float, K: np.ndarray | None = None) -> np.ndarray:
    """``G = 2 K alpha - diag K`` summed afresh over the support (``diag K = 1``): blocked kernel
    products (O(block) memory), or a mat-vec with the given Gram matrix ``K`` (n, n)."""
    sup = np.flatnonzero(alpha != 0.0)
    if K is not None:
        return 2.0 * (K[:, sup] @ alpha[sup]) - np.diag(K)
    return 2.0 * rbf_matvec(X, X[sup], alpha[sup], sigma) - 1.0


def _column(X: np.ndarray, j: int, sigma: float, K: np.ndarray | None) -> np.ndarray:
    """Kernel column j: the same direct-difference formula as the compiled loop."""
    if K is not None:
        return K[j]
    diff = X - X[j]
    return np.exp(-np.einsum("ij,ij->i", diff, diff) / (sigma * sigma))


def smo_reference(X: np.ndarray, C: float, sigma: float, alpha0: np.ndarray, G0: np.ndarray,
                  tol: float = SMO_TOL, max_iter: int | None = None,
                  K: np.ndarray | None = None) -> SMOResult:
    """NumPy reference of the compiled SMO loop. Slow: two kernel
    columns per iteration, nothing cached. ``alpha0``/``G0`` (n,) are the start and its gradient.

    With ``G = 2 K a - diag K`` (the KKT gradient ``g = rho + G`` up to the offset), one iteration
    picks ``i = argmin {G_t : a_t < C}`` (first index on ties), stops when
    ``max {G_t : a_t > 0} - G_i <= tol``, picks ``j`` maximising ``(G_t - G_i)^2 / q_t`` over
    ``a_t > 0, G_t > G_i`` with ``q_t = 2 (K_ii + K_tt - 2 K_it)`` (``TAU`` when not positive), moves
    ``delta = min((G_j - G_i) / q_j, C - a_i, a_j)`` from ``a_j`` to ``a_i`` (a bound that is reached
    is set exactly) and updates ``G += 2 delta (K[:, i] - K[:, j])``.
    """
    a = np.array(alpha0, dtype=np.float64)
    G = np.array(G0, dtype=np.float64)
    n = a.size
    if max_iter is None:
        max_iter = max(10_000_000, 100 * n)
    status = MAX_ITER
    it = 0
    while it < max_iter:
        up = a < C
        if not up.any():
            status = CONVERGED
            break
        i = int(np.argmin(np.where(up, G, np.inf)))
        gmin = G[i]
        gmax = np.where(a > 0.0, G, -np.inf).max()
        if not gmax - gmin > tol:
            status = CONVERGED
            break
        Ki = _column(X, i, sigma, K)
        b = G - gmin
        ok = (a > 0.0) & (b > 0.0)
        if not ok.any():
            status = STALLED
            break
        q = 2.0 * (Ki[i] + 1.0 - 2.0 * Ki)
        q = np.where(q > 0.0, q, TAU)
        j = int(np.argmax(np.where(ok, b * b / q, -np.inf)))
        Kj = _column(X, j, sigma, K)
        qj = 2.0 * (Ki[i] + Kj[j] - 2.0 * Ki[j])
        if not qj > 0.0:
            qj = TAU
        delta = (G[j] - gmin) / qj
        lim_i, lim_j = C - a[i], a[j]
        hit_i = hit_j = False
        if delta >= lim_i:
            delta, hit_i = lim_i, True
        if delta >= lim_j:
            delta, hit_j, hit_i = lim_j, True, lim_i == lim_j
        if not delta > 0.0:
            status = STALLED
            break
        a[i] = C if hit_i else a[i] + delta
        a[j] = 0.0 if hit_j else a[j] - delta
        G += (2.0 * delta) * (Ki - Kj)
        it += 1
    return SMOResult(a, G, it, CODES[status], "reference")


def smo(X: np.ndarray, C: float, sigma: float, alpha0: np.ndarray | None = None,
        tol: float = SMO_TOL, max_iter: int | None = None, cache_bytes: int = CACHE_BYTES,
        K: np.ndarray | None = None, method: str = "auto") -> SMOResult:
    """Run the SMO loop from ``alpha0`` (default :func:`initial_alpha`).

    Parameters
    ----------
    X : (n, d) float64 keys (validated by the caller);  C : box;  sigma : RBF bandwidth
    alpha0 : (n,) feasible start, optional
    tol : stopping gap;  max_iter : default ``max(10^7, 100 n)`` (libsvm's)
    cache_bytes : memory of the compiled loop's column cache (at least two columns)
    K : (n, n) Gram matrix the caller already holds (its rows are read; nothing is cached)
    method : "auto" (compiled when available), "compiled" or "reference"

    Returns
    -------
    :class:`SMOResult`

    The compiled loop takes kernel columns on demand into an LRU cache of bounded memory
    (``cache_bytes``; never the n x n matrix), or the rows of a Gram matrix ``K`` the caller already
    holds; the reference takes one kernel column per use, no cache
    (``tests/test_sv_core_certified.py`` runs both).
    """
    X = np.ascontiguousarray(X, dtype=np.float64)
    n, d = X.shape
    a = initial_alpha(X, C) if alpha0 is None else np.array(alpha0, dtype=np.float64)
    G = gradient(X, a, sigma, K)
    if max_iter is None:
        max_iter = max(10_000_000, 100 * n)
    if method == "auto":
        method = "compiled" if fast_smo_available() else "reference"
    if method == "reference":
        return smo_reference(X, C, sigma, a, G, tol, max_iter, K)
    if method != "compiled":
        raise ValueError(f"method must be 'auto', 'compiled' or 'reference', got {method!r}")
    if _smo is None:
        raise RuntimeError("sv_core._smo is not built")
    flat, ldk = None, 0
    if K is not None:
        if K.shape != (n, n):
            raise ValueError(f"K must have shape ({n}, {n}), got {K.shape}")
        if K.dtype != np.float64 or K.strides[1] != 8 or K.strides[0] % 8 or K.strides[0] < 8 * n:
            K = np.ascontiguousarray(K, dtype=np.float64)
        ldk = K.strides[0] // 8
        # the rows of a (strided) view of a larger C-ordered matrix, as one flat buffer
        flat = np.lib.stride_tricks.as_strided(K, shape=((n - 1) * ldk + n,), strides=(8,))
    code, iters, hits, misses, ncols = _smo.smo(X, n, d, float(sigma), float(C), a, G, float(tol),
                                                int(max_iter), float(cache_bytes), flat, ldk)
    return SMOResult(a, G, int(iters), CODES[code], "compiled", int(hits), int(misses), int(ncols))


__all__ = ["SMOResult", "smo", "smo_reference", "initial_alpha", "gradient", "fast_smo_available",
           "SMO_TOL", "CACHE_BYTES"]
