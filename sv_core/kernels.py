"""The one RBF kernel of the project: ``k(a, b) = exp(-||a - b||^2 / sigma^2)``.

``sigma`` is the *bandwidth* (not ``2 sigma^2``); squared distances are clamped at 0 so that
rounding never produces ``k > 1``. A numpy version (fp64, for the exact solver) and a torch
version (any dtype/device, differentiable) compute the same function.
"""
from __future__ import annotations

import numpy as np

from sv_core.errors import InvalidKeysError


def sq_dists(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Squared Euclidean distances, clamped at 0.

    Parameters
    ----------
    A : (n, d) array
    B : (m, d) array

    Returns
    -------
    (n, m) float64 array
    """
    A = np.asarray(A, dtype=np.float64)
    B = np.asarray(B, dtype=np.float64)
    if B.shape[0] and A.shape[0]:
        # distances are translation invariant: centring on a point of the data avoids the
        # cancellation of ||a||^2 + ||b||^2 - 2 a.b for keys far from the origin
        c = B[0]
        if np.abs(c).max(initial=0.0) > 1.0:
            A = A - c
            B = B - c
    an = np.einsum("ij,ij->i", A, A)
    bn = np.einsum("ij,ij->i", B, B)
    # (an_i + bn_j) - 2 a_i.b_j with two (n, m) buffers (the products are exact scalings)
    P = A @ B.T
    P *= 2.0
    D = np.add.outer(an, bn)
    np.subtract(D, P, out=D)
    np.maximum(D, 0.0, out=D)
    return D


def rbf_kernel(A: np.ndarray, B: np.ndarray, sigma: float) -> np.ndarray:
    """RBF Gram matrix ``exp(-||a_i - b_j||^2 / sigma^2)``.

    Parameters
    ----------
    A : (n, d) array
    B : (m, d) array
    sigma : float > 0, bandwidth

    Returns
    -------
    K : (n, m) float64 array
    """
    A = np.atleast_2d(np.asarray(A, dtype=np.float64))
    B = np.atleast_2d(np.asarray(B, dtype=np.float64))
    D = sq_dists(A, B)
    np.divide(D, -(float(sigma) ** 2), out=D)  # = (-D) / sigma^2, in place
    return np.exp(D, out=D)


def check_finite_kernel(K: np.ndarray) -> None:
    """Belt and braces after a kernel evaluation: every entry finite and in [0, 1]
    (:class:`sv_core.errors.InvalidKeysError` otherwise)."""
    if K.size and not (np.isfinite(K).all() and K.min() >= 0.0 and K.max() <= 1.0):
        raise InvalidKeysError("the RBF kernel of these keys is not finite; rescale the keys or sigma")


def torch_kernel(A, B, sigma):
    """Torch RBF kernel with the same definition; differentiable.

    Parameters
    ----------
    A : (..., n, d) tensor
    B : (..., m, d) tensor
    sigma : float or tensor

    Returns
    -------
    (..., n, m) tensor
    """
    import torch

    an = (A * A).sum(-1, keepdim=True)
    bn = (B * B).sum(-1, keepdim=True).transpose(-1, -2)
    D = an + bn - 2.0 * (A @ B.transpose(-1, -2))
    D = torch.clamp(D, min=0.0)
    return torch.exp(-D / (sigma * sigma))


#: elements of one (rows x columns) kernel block in :func:`rbf_matvec` (~2 MB per fp64 temporary)
MATVEC_BLOCK = 1 << 18


def rbf_matvec(A: np.ndarray, B: np.ndarray, w: np.ndarray, sigma: float,
               block: int = MATVEC_BLOCK) -> np.ndarray:
    """``rbf_kernel(A, B, sigma) @ w`` without forming the (n, m) matrix.

    The product is computed over row blocks of ``A`` with at most ``block`` kernel entries each
    (the same kernel, :func:`rbf_kernel`, entry for entry), so the memory is O(block) whatever
    ``n``. Each row's sum is one BLAS mat-vec over all of ``B``.

    Parameters
    ----------
    A : (n, d) array;  B : (m, d) array;  w : (m,) weights;  sigma : float > 0, bandwidth
    block : int, kernel entries per block

    Returns
    -------
    (n,) float64 array
    """
    A = np.atleast_2d(np.asarray(A, dtype=np.float64))
    B = np.atleast_2d(np.asarray(B, dtype=np.float64))
    w = np.asarray(w, dtype=np.float64).reshape(-1)
    n, m = A.shape[0], B.shape[0]
    out = np.zeros(n)
    if m == 0 or n == 0:
        return out
    rows = max(1, int(block) // m)
    for lo in range(0, n, rows):
        out[lo : lo + rows] = rbf_kernel(A[lo : lo + rows], B, sigma) @ w
    return out
