"""Optional MLX backend for the batched FISTA partition finder (the seed ran FISTA in MLX).

Same algorithm and contract as `sv_core.batched.fista_svdd` (shared-Gram form, warm-started
safeguarded Newton-bisection projection on the shift, fixed momentum schedule, ``iters`` steps);
inputs and outputs are numpy arrays or torch tensors (returned as the same kind, CPU). MLX is
imported lazily: ``pip install "mlx[cpu]"`` on Linux x86-64 (plain ``mlx`` lacks libmlx.so).
"""
from __future__ import annotations

import math

import numpy as np

from sv_core.batched import BatchedGateError, fista_lipschitz


class MLXUnavailableError(ImportError):
    """MLX is not importable here (install ``mlx[cpu]`` on Linux, ``mlx`` on Apple silicon)."""


def _mx():
    try:
        import mlx.core as mx
    except Exception as exc:  # ImportError or a missing shared library
        raise MLXUnavailableError(
            f'MLX is not importable ({exc}); pip install "mlx[cpu]" (Linux) or "mlx" (macOS)'
        ) from exc
    return mx


def _project(mx, zz, mask, C, tau, lo, hi, max_iter=60):
    eps = 16.0 * float(np.finfo(np.float32).eps)
    a = mx.clip(zz - tau[..., None], 0.0, C)
    for _ in range(max_iter):
        d = zz - tau[..., None]
        a = mx.clip(d, 0.0, C)
        err = mx.sum(a, axis=-1) - 1.0
        nf = mx.sum(((d > 0) & (d < C)).astype(zz.dtype), axis=-1)
        step = err / mx.maximum(nf, 1.0)
        scale = eps * (1.0 + mx.abs(tau))
        done = (mx.abs(err) <= eps) | ((hi - lo) <= scale) | ((nf > 0) & (mx.abs(step) <= scale))
        if bool(mx.all(done).item()):
            break
        above = err > 0
        lo = mx.where(above, tau, lo)
        hi = mx.where(above, hi, tau)
        tn = tau + step
        nxt = mx.where((nf > 0) & (tn > lo) & (tn < hi), tn, 0.5 * (lo + hi))
        tau = mx.where(done, tau, nxt)
    return a * mask, tau


def fista_svdd_mlx(K, C: float, mask, iters: int = 80):
    """FISTA partition finder on MLX (float32).

    Parameters
    ----------
    K : array (P, n, n); mask : bool array (P, n) or (P, J, n); C : box; iters : steps.

    Returns
    -------
    alpha_est shaped like mask, same kind (numpy / torch) as K.
    """
    mx = _mx()
    is_torch = type(K).__module__.startswith("torch")
    Kn = K.detach().cpu().numpy() if is_torch else np.asarray(K)
    Mn = mask.detach().cpu().numpy() if is_torch else np.asarray(mask)
    if Kn.ndim != 3 or Kn.shape[1] != Kn.shape[2]:
        raise BatchedGateError(f"K must have shape (P, n, n), got {Kn.shape}")
    flat = Mn.ndim == 2
    M3 = Mn[:, None, :] if flat else Mn
    if M3.shape[0] != Kn.shape[0] or M3.shape[-1] != Kn.shape[-1]:
        raise BatchedGateError("mask must have shape (P, n) or (P, J, n) matching K")
    C = float(C)
    if not (C > 0):
        raise BatchedGateError(f"box C must be positive, got {C}")
    import torch  # Lipschitz bound: reuse the torch implementation (one definition)

    L = fista_lipschitz(torch.as_tensor(Kn, dtype=torch.float32), torch.as_tensor(M3)).numpy()
    Km = mx.array(Kn.astype(np.float32))
    m = mx.array(M3.astype(np.float32))
    diagK = mx.expand_dims(mx.diagonal(Km, axis1=-2, axis2=-1), 1)
    invL = mx.array((1.0 / L)[..., None].astype(np.float32))
    KT = mx.swapaxes(Km, -1, -2)
    a = m / mx.maximum(mx.sum(m, axis=-1, keepdims=True), 1.0)
    y = a
    t = 1.0
    tau = None
    big = 1e30
    for _ in range(iters):
        z = y - (2.0 * mx.matmul(y, KT) - diagK) * invL
        zmax = mx.max(mx.where(m > 0, z, -big), axis=-1)
        zmin = mx.min(mx.where(m > 0, z, big), axis=-1)
        zz = mx.where(m > 0, z, (zmin - 4.0 * C - 1.0 - (zmax - zmin))[..., None])
        lo, hi = zmin - C, zmax
        t0 = 0.5 * (lo + hi) if tau is None else mx.where((tau > lo) & (tau < hi), tau, 0.5 * (lo + hi))
        a_new, tau = _project(mx, zz, m, C, t0, lo, hi)
        t_new = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * t * t))
        y = a_new + ((t - 1.0) / t_new) * (a_new - a)
        a, t = a_new, t_new
        mx.eval(a, y, tau)
    out = np.array(a)
    if flat:
        out = out[:, 0, :]
    return torch.as_tensor(out) if is_torch else out
