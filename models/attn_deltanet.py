"""DeltaNet attention with a chunked (WY / UT-transform) parallel form.

Within a chunk of c steps the product of Householder-like factors
``prod_i (I - beta_i k_i k_i^T) = I - sum_i w_i k_i^T`` and the accumulated writes
``sum_i u_i k_i^T`` have rows ``W = T K`` and ``U = T V`` with
``T = (I + tril(diag(beta) K K^T, -1))^{-1} diag(beta)`` (one triangular solve). Given the
state ``S0`` entering the chunk::

    U~  = U - W S0^T
    O   = Q S0^T + (Q K^T * tril) U~
    S1  = S0 + U~^T K

Only the chunk loop is sequential. Reference: :func:`models.deltanet_naive.deltanet_naive`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.multihead import AttentionConfigError, MultiHeadIO


def deltanet_chunked(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, chunk: int = 64
) -> torch.Tensor:
    """Chunked delta rule; same contract as `deltanet_naive`.

    Parameters
    ----------
    q, k : (B, H, T, d_k); v : (B, H, T, d_v); beta : (B, H, T); chunk : int >= 1.
    """
    if chunk < 1:
        raise AttentionConfigError(f"chunk must be >= 1, got {chunk}")
    B, H, T, dk = k.shape
    dv = v.shape[-1]
    S = k.new_zeros(B, H, dv, dk)
    outs = []
    for s in range(0, T, chunk):
        e = min(T, s + chunk)
        c = e - s
        Kc, Vc, Qc, bc = k[:, :, s:e], v[:, :, s:e], q[:, :, s:e], beta[:, :, s:e]
        eye = torch.eye(c, dtype=k.dtype, device=k.device)
        A = eye + torch.tril(bc.unsqueeze(-1) * (Kc @ Kc.transpose(-1, -2)), diagonal=-1)
        rhs = torch.cat([bc.unsqueeze(-1) * Kc, bc.unsqueeze(-1) * Vc], dim=-1)
        WU = torch.linalg.solve_triangular(A, rhs, upper=False)
        W, U = WU[..., :dk], WU[..., dk:]
        Ut = U - W @ S.transpose(-1, -2)
        tri = torch.tril(Qc @ Kc.transpose(-1, -2))
        outs.append(Qc @ S.transpose(-1, -2) + tri @ Ut)
        S = S + Ut.transpose(-1, -2) @ Kc
    return torch.cat(outs, dim=2)


class DeltaNetAttention(nn.Module):
    """Multi-head DeltaNet layer: L2-normalised q/k, ``beta = sigmoid(W_beta x)`` per head.

    Parameters
    ----------
    d_model, n_heads, block_size : common signature.
    chunk : chunk length of the parallel form.
    """

    def __init__(
        self, d_model: int, n_heads: int, block_size: int = 256, chunk: int = 64, bias: bool = True
    ):
        super().__init__()
        self.io = MultiHeadIO(d_model, n_heads, bias)
        self.beta = nn.Linear(d_model, n_heads, bias=True)
        self.chunk = int(chunk)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, d_model) -> (B, T, d_model)."""
        q, k, v = self.io.split(x)
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        beta = torch.sigmoid(self.beta(x)).transpose(1, 2)  # (B, H, T)
        return self.io.merge(deltanet_chunked(q, k, v, beta, self.chunk))
