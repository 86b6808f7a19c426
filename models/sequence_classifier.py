"""Causal attention classifiers for per-hour clinical sequences ``(B, T, F) -> logits (B, T)``.

The same pre-norm `Block` as the language model, fed by a linear input projection and learned
hour embeddings; ``attention="softmax"`` (causal softmax) or ``"sv_hybrid"`` (causal SV hybrid
with a chunk-frozen gate; chunk / C / sigma via ``attn_kwargs``). Each hour's logit depends only
on hours up to it.
"""
from __future__ import annotations

import torch
from torch import nn

from models.backbone import Block, make_attention
from models.multihead import AttentionConfigError


class CausalSequenceClassifier(nn.Module):
    """Per-hour causal classifier.

    Parameters
    ----------
    n_features : F.
    attention : "softmax" | "sv_hybrid" | any key of `models.backbone.ATTENTION`.
    d_model, n_heads, n_layers : width, heads, blocks.
    max_len : longest sequence (learned hour embeddings).
    attn_kwargs : passed to the attention module (e.g. ``{"chunk": 8, "C": 0.25, "sigma": 2.0}``).
    """

    def __init__(
        self,
        n_features: int,
        attention: str = "softmax",
        d_model: int = 64,
        n_heads: int = 4,
        n_layers: int = 2,
        max_len: int = 512,
        attn_kwargs: dict | None = None,
    ):
        super().__init__()
        self.max_len = int(max_len)
        self.inp = nn.Linear(n_features, d_model)
        self.pos = nn.Embedding(self.max_len, d_model)
        self.blocks = nn.ModuleList(
            Block(d_model, make_attention(attention, d_model, n_heads, max_len, **(attn_kwargs or {})))
            for _ in range(n_layers)
        )
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, F) -> logits (B, T)."""
        B, T, _ = x.shape
        if T > self.max_len:
            raise AttentionConfigError(f"sequence length {T} exceeds max_len {self.max_len}")
        h = self.inp(x) + self.pos(torch.arange(T, device=x.device))
        for blk in self.blocks:
            h = blk(h)
        return self.head(self.ln(h)).squeeze(-1)
