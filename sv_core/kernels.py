"""The one RBF kernel of the project: ``k(a, b) = exp(-||a - b||^2 / sigma^2)``.

``sigma`` is the *bandwidth* (not ``2 sigma^2``); squared distances are clamped at 0 so that
rounding never produces ``k > 1``. A numpy version (fp64, for the exact solver) and a torch
version (any dtype/device, differentiable) compute the same function.
"""
from __future__ import annotations

import numpy as np


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
    D = an[:, None] + bn[None, :] - 2.0 * (A @ B.T)
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
    return np.exp(-sq_dists(A, B) / float(sigma) ** 2)


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
