"""Shared multi-head plumbing: q/k/v projection, head split/merge and masked softmax attention.

Every attention variant in :mod:`models` owns one `MultiHeadIO` so the backbone is identical
across variants (001, Appendix C: "a pluggable attention module so every variant shares an
identical backbone").
"""
from __future__ import annotations

import math

import torch
from torch import nn


class AttentionConfigError(ValueError):
    """Invalid attention hyper-parameters (head split, window, chunk, box C ...)."""


class MultiHeadIO(nn.Module):
    """Fused q/k/v projection ``d_model -> 3 d_model`` and output projection.

    Parameters
    ----------
    d_model : int, model width.
    n_heads : int, must divide d_model.
    bias : bool, linear biases.
    """

    def __init__(self, d_model: int, n_heads: int, bias: bool = True):
        super().__init__()
        if d_model % n_heads != 0:
            raise AttentionConfigError(f"n_heads={n_heads} must divide d_model={d_model}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.proj = nn.Linear(d_model, d_model, bias=bias)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, T, d_model) -> q, k, v each (B, H, T, head_dim)."""
        B, T, _ = x.shape
        q, k, v = self.qkv(x).split(self.d_model, dim=-1)
        shape = (B, T, self.n_heads, self.head_dim)
        return (
            q.view(shape).transpose(1, 2),
            k.view(shape).transpose(1, 2),
            v.view(shape).transpose(1, 2),
        )

    def merge(self, y: torch.Tensor) -> torch.Tensor:
        """(B, H, T, head_dim) -> projected (B, T, d_model)."""
        B, H, T, dh = y.shape
        return self.proj(y.transpose(1, 2).reshape(B, T, H * dh))


def causal_mask(T: int, device=None) -> torch.Tensor:
    """Bool (T, T): ``allowed[t, j] = j <= t``."""
    idx = torch.arange(T, device=device)
    return idx.unsqueeze(1) >= idx.unsqueeze(0)


def window_mask(T: int, window: int, device=None) -> torch.Tensor:
    """Bool (T, T): ``allowed[t, j] = t - window < j <= t`` (the query sees ``window`` tokens)."""
    if window < 1:
        raise AttentionConfigError(f"window must be >= 1, got {window}")
    idx = torch.arange(T, device=device)
    diff = idx.unsqueeze(1) - idx.unsqueeze(0)
    return (diff >= 0) & (diff < window)


def masked_softmax_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor
) -> torch.Tensor:
    """Unfused masked softmax attention ``softmax(q k^T / sqrt(d) | allowed) v``.

    Parameters
    ----------
    q, k, v : tensors (B, H, T, d)
    allowed : bool tensor broadcastable to (B, H, T, T); every row must allow >= 1 key.

    Returns
    -------
    tensor (B, H, T, d)
    """
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
