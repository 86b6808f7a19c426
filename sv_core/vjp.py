"""Exact-path differentiation: a custom VJP through the maintained fp64 solver (SPEC §1).

Within a fixed partition (S, E, R) the free variables ``u = [rho; alpha_S]`` solve ``M u = c`` with
``M = [[0, 1^T], [1, 2 K_SS]]`` and ``c = [1 - |E| C; diag(K)_S - 2 C K_SE 1]``, so ``u = Rinv c``.
For a cotangent ``ubar = [rhobar; alphabar_S]`` and ``w = Rinv^T ubar`` (seed 001, Appendix A)::

    dL/dK_ii += w_i            (i in S)
    dL/dK_ie += -2 C w_i       (i in S, e in E)
    dL/dK_ij += -2 w_i alpha_j (i, j in S)

The backward multiplies by the inverse the forward pass already maintains: no second solve.
Set migrations are kinks: no gradient flows through partition membership. Coefficients in E
(fixed at C) and R (fixed at 0) have zero gradient.

Differentiable functions (float64 torch tensors):

* :func:`svdd_solve` ``(K, C) -> (alpha, rho)``
* :func:`svdd_from_keys` ``(X, C, sigma) -> (alpha, rho)``
* :func:`gate_score` ``(P, X, C, sigma) -> s(P)``
* :func:`sv_readout` ``(Q, X, V, C, sigma) -> o(Q)``
"""
from __future__ import annotations

import numpy as np

try:
    import torch
except ImportError as exc:  # torch is the optional [models] extra; the rest of sv_core needs none
    raise ImportError("sv_core.vjp needs torch (the [models] extra): "
                      "pip install 'forgetful-attention[models]'") from exc

from sv_core.errors import InfeasibleError
from sv_core.kernels import torch_kernel
from sv_core.solver import MaintainedSVDD


class SVDDSolve(torch.autograd.Function):
    """``(K, C) -> (alpha, rho)`` by the maintained fp64 C&P solver, with the Appendix-A VJP."""

    @staticmethod
    def forward(ctx, K: torch.Tensor, C: float):
        Kn = K.detach().to(torch.float64).cpu().numpy()
        n = Kn.shape[0]
        if n * C < 1.0 - 1e-12:
            raise InfeasibleError(f"n*C = {n * C:.6g} < 1: the fixed-C problem is infeasible")
        core = MaintainedSVDD.from_gram(0.5 * (Kn + Kn.T), C)
        core.initialise()
        alpha = core.alpha[:n].copy()
        S = np.asarray(core.S, dtype=np.int64)
        E = np.flatnonzero(core.status[:n] == 2)
        ctx.C = float(C)
        ctx.S, ctx.E, ctx.alpha, ctx.Rinv = S, E, alpha, core.Rinv.copy()
        ctx.meta = (K.dtype, K.device)
        return (torch.as_tensor(alpha, dtype=K.dtype, device=K.device),
                torch.as_tensor(core.rho, dtype=K.dtype, device=K.device))

    @staticmethod
    def backward(ctx, g_alpha, g_rho):
        S, E, alpha, Rinv, C = ctx.S, ctx.E, ctx.alpha, ctx.Rinv, ctx.C
        dtype, device = ctx.meta
        n = alpha.shape[0]
        dK = np.zeros((n, n))
        if S.size:
            ga = np.zeros(n) if g_alpha is None else g_alpha.detach().to(torch.float64).cpu().numpy()
            gr = 0.0 if g_rho is None else float(g_rho)
            ubar = np.concatenate([[gr], ga[S]])
            w = Rinv.T @ ubar
            wS = w[1:]
            dK[S, S] += wS
            if E.size:
                dK[np.ix_(S, E)] += -2.0 * C * wS[:, None]
            dK[np.ix_(S, S)] += -2.0 * np.outer(wS, alpha[S])
        return torch.as_tensor(dK, dtype=dtype, device=device), None


def svdd_solve(K: torch.Tensor, C: float):
    """Differentiable exact solve: K (n, n) -> alpha (n,), rho ()."""
    return SVDDSolve.apply(K, C)


def svdd_from_keys(X: torch.Tensor, C: float, sigma: float):
    """Differentiable exact solve from keys X (n, d): alpha (n,), rho ()."""
    return svdd_solve(torch_kernel(X, X, sigma), C)


def gate_score(P: torch.Tensor, X: torch.Tensor, C: float, sigma: float) -> torch.Tensor:
    """Gate score ``s(p) = 2 sum_i alpha_i k(p, x_i) - rho`` for probes P (m, d) -> (m,)."""
    alpha, rho = svdd_from_keys(X, C, sigma)
    return 2.0 * torch_kernel(P, X, sigma) @ alpha - rho


def sv_readout(Q: torch.Tensor, X: torch.Tensor, V: torch.Tensor, C: float, sigma: float) -> torch.Tensor:
    """Normalised readout ``o(q) = sum a_i k(q,x_i) v_i / sum a_i k(q,x_i)``; Q (m,d), V (n,dv) -> (m,dv)."""
    alpha, _ = svdd_from_keys(X, C, sigma)
    W = torch_kernel(Q, X, sigma) * alpha[None, :]
    return (W @ V) / W.sum(dim=1, keepdim=True)


class ExactSVReadout(torch.nn.Module):
    """A minimal trainable layer on the exact path: keys/values/queries are linear maps of the
    input, mixed by the exact SV readout over the context.

    forward(Xc (n, d_in), Xq (m, d_in)) -> (m, d_out)
    """

    def __init__(self, d_in: int, d_key: int, d_out: int, C: float, sigma: float, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.Wk = torch.nn.Parameter(torch.randn(d_in, d_key, generator=gen, dtype=torch.float64) / d_in**0.5)
        self.Wq = torch.nn.Parameter(torch.randn(d_in, d_key, generator=gen, dtype=torch.float64) / d_in**0.5)
        self.Wv = torch.nn.Parameter(torch.randn(d_in, d_out, generator=gen, dtype=torch.float64) / d_in**0.5)
        self.C, self.sigma = float(C), float(sigma)

    def forward(self, Xc: torch.Tensor, Xq: torch.Tensor) -> torch.Tensor:
        return sv_readout(Xq @ self.Wq, Xc @ self.Wk, Xc @ self.Wv, self.C, self.sigma)
