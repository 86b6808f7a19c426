"""The normalised kernel readout used by every study (one formula, arbitrary coefficients).

``o(q) = Σ_i a_i κ(q, x_i) v_i / Σ_i a_i κ(q, x_i)`` with the project's one RBF kernel. With
``a = α`` it is the gated SV readout; with ``a = 1`` on a kept subset it is the uniform-RBF
readout that every selection policy shares (seed 001 §5: "equal retained-key coefficients with
the same RBF similarity readout").
"""
from __future__ import annotations

import numpy as np

from evaluation.studies.errors import StudyError
from sv_core import rbf_kernel


def kernel_weights(Q: np.ndarray, X: np.ndarray, a: np.ndarray, sigma: float) -> np.ndarray:
    """Normalised weights ``a_i κ(q, x_i) / Σ_j a_j κ(q, x_j)``.

    Parameters
    ----------
    Q : (m, d) queries; X : (n, d) keys; a : (n,) non-negative coefficients; sigma : bandwidth.

    Returns
    -------
    (m, n) array; a row whose total weight underflows to 0 is all zeros.
    """
    Q = np.atleast_2d(np.asarray(Q, dtype=np.float64))
    X = np.atleast_2d(np.asarray(X, dtype=np.float64))
    a = np.asarray(a, dtype=np.float64).reshape(-1)
    if a.shape[0] != X.shape[0]:
        raise StudyError(f"coefficients have {a.shape[0]} entries for {X.shape[0]} keys")
    if np.any(a < 0):
        raise StudyError("readout coefficients must be non-negative")
    W = rbf_kernel(Q, X, sigma) * a[None, :]
    den = W.sum(axis=1, keepdims=True)
    return np.divide(W, den, out=np.zeros_like(W), where=den > 0)


def kernel_readout(Q, X, a, V, sigma: float) -> np.ndarray:
    """``kernel_weights(Q, X, a, sigma) @ V``; V (n,) or (n, d_v) -> (m,) or (m, d_v)."""
    return kernel_weights(Q, X, a, sigma) @ np.asarray(V, dtype=np.float64)


def kernel_readout_reference(Q, X, a, V, sigma: float) -> np.ndarray:
    """Slow loop reference of :func:`kernel_readout` (explicit kernel formula)."""
    Q = np.atleast_2d(np.asarray(Q, dtype=np.float64))
    X = np.atleast_2d(np.asarray(X, dtype=np.float64))
    V = np.asarray(V, dtype=np.float64)
    out = []
    for q in Q:
        w = np.array([a[i] * np.exp(-np.sum((q - X[i]) ** 2) / sigma**2) for i in range(X.shape[0])])
        tot = w.sum()
        out.append((w / tot) @ V if tot > 0 else np.zeros(V.shape[1:]))
    return np.asarray(out)


def uniform_recall(Q: np.ndarray, labels: np.ndarray, X: np.ndarray, y: np.ndarray, kept: np.ndarray,
                   sigma: float, n_classes: int) -> np.ndarray:
    """Per-query correctness of the uniform-RBF readout over the kept keys.

    The readout is one-hot class values averaged with weights ``κ(q, x_i)`` over ``kept``;
    the answer is its argmax (ties -> lowest class; an all-zero readout is wrong).

    Returns
    -------
    (m,) bool array.
    """
    kept = np.asarray(kept, dtype=np.intp)
    if kept.size == 0:
        return np.zeros(len(Q), dtype=bool)
    onehot = np.eye(n_classes)[np.asarray(y)[kept]]
    out = kernel_readout(Q, X[kept], np.ones(kept.size), onehot, sigma)
    ok = out.max(axis=1) > 0
    return ok & (out.argmax(axis=1) == np.asarray(labels))
