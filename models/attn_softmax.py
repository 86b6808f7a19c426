"""Causal softmax attention (the full, unbounded reference; unfused masked implementation)."""
from __future__ import annotations

import torch
from torch import nn

from models.multihead import MultiHeadIO, causal_mask, masked_softmax_attention


class CausalSoftmaxAttention(nn.Module):
    """Full causal multi-head softmax attention.

    Parameters
    ----------
    d_model, n_heads : width and heads.
    block_size : maximum sequence length (unused; part of the common constructor signature).
    """

    def __init__(self, d_model: int, n_heads: int, block_size: int = 256, bias: bool = True):
        super().__init__()
        self.io = MultiHeadIO(d_model, n_heads, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, d_model) -> (B, T, d_model)."""
        q, k, v = self.io.split(x)
        allowed = causal_mask(x.shape[1], x.device)
        return self.io.merge(masked_softmax_attention(q, k, v, allowed))
