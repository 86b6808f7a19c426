"""Causal linear attention (Katharopoulos et al., 2020) with feature map ``elu(x) + 1``."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.multihead import MultiHeadIO, causal_mask


def linear_attention_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float = 1e-6):
    """Reference recurrence: ``S_t = S_{t-1} + phi(k_t) v_t^T``, ``z_t = z_{t-1} + phi(k_t)``,
    ``o_t = S_t^T phi(q_t) / (z_t . phi(q_t))``. Shapes (B, H, T, d) -> (B, H, T, d_v)."""
    fq, fk = F.elu(q) + 1.0, F.elu(k) + 1.0
    B, H, T, d = q.shape
    S = q.new_zeros(B, H, d, v.shape[-1])
    z = q.new_zeros(B, H, d)
    out = []
    for t in range(T):
        S = S + fk[:, :, t, :, None] * v[:, :, t, None, :]
        z = z + fk[:, :, t]
        num = (fq[:, :, t, :, None] * S).sum(-2)
        den = (fq[:, :, t] * z).sum(-1, keepdim=True)
        out.append(num / (den + eps))
    return torch.stack(out, dim=2)


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float = 1e-6):
    """Parallel (masked quadratic) form of `linear_attention_naive`; same shapes."""
    fq, fk = F.elu(q) + 1.0, F.elu(k) + 1.0
    A = (fq @ fk.transpose(-1, -2)) * causal_mask(q.shape[2], q.device)
    return (A @ v) / (A.sum(-1, keepdim=True) + eps)


class LinearAttention(nn.Module):
    """Multi-head causal linear attention; state per head is a d x d matrix."""

    def __init__(self, d_model: int, n_heads: int, block_size: int = 256, bias: bool = True):
        super().__init__()
        self.io = MultiHeadIO(d_model, n_heads, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, d_model) -> (B, T, d_model)."""
        q, k, v = self.io.split(x)
        return self.io.merge(linear_attention(q, k, v))
