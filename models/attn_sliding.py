"""Sliding-window causal softmax attention (the matched-state "swa" baseline)."""
from __future__ import annotations

import torch
from torch import nn

from models.multihead import AttentionConfigError, MultiHeadIO, masked_softmax_attention, window_mask


class SlidingWindowAttention(nn.Module):
    """Causal softmax attention restricted to the last ``window`` tokens (including itself).

    Parameters
    ----------
    d_model, n_heads, block_size : as `CausalSoftmaxAttention`.
    window : int >= 1, number of visible tokens per query.
    """

    def __init__(
        self, d_model: int, n_heads: int, block_size: int = 256, window: int = 64, bias: bool = True
    ):
        super().__init__()
        if int(window) < 1:
            raise AttentionConfigError(f"window must be >= 1, got {window}")
        self.window = int(window)
        self.io = MultiHeadIO(d_model, n_heads, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, d_model) -> (B, T, d_model)."""
        q, k, v = self.io.split(x)
        allowed = window_mask(x.shape[1], self.window, x.device)
        return self.io.merge(masked_softmax_attention(q, k, v, allowed))
