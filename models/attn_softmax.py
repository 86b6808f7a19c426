"""Causal softmax attention (the full, unbounded reference): the unfused masked implementation, or
torch's fused ``scaled_dot_product_attention`` (``fused=True``; the peer a user would pick, tested
against the unfused one)."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from models.multihead import MultiHeadIO, causal_mask, masked_softmax_attention


class CausalSoftmaxAttention(nn.Module):
    """Full causal multi-head softmax attention.

    Parameters
    ----------
    d_model, n_heads : width and heads.
    block_size : maximum sequence length (unused; part of the common constructor signature).
    fused : torch's ``scaled_dot_product_attention(..., is_causal=True)`` (FlashAttention / memory-
        efficient kernels where the device has them) instead of the unfused masked reference.
    """

    def __init__(self, d_model: int, n_heads: int, block_size: int = 256, bias: bool = True, fused: bool = False):
        super().__init__()
        self.io = MultiHeadIO(d_model, n_heads, bias)
        self.fused = bool(fused)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, d_model) -> (B, T, d_model)."""
        q, k, v = self.io.split(x)
        if self.fused:
            return self.io.merge(F.scaled_dot_product_attention(q, k, v, is_causal=True))
        allowed = causal_mask(x.shape[1], x.device)
        return self.io.merge(masked_softmax_attention(q, k, v, allowed))
