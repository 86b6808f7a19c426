"""Pre-norm decoder backbone (nanoGPT style) with a pluggable attention module.

Token + learned positional embeddings, ``n_layers`` pre-norm blocks
(``x + attn(LN(x))``, ``x + MLP(LN(x))``), final LayerNorm and a weight-tied output head.
Every attention variant plugs into the identical backbone (001, Appendix C).

The 3.22M configuration: vocab 256, d_model 256, 4 layers, 4 heads, block 256 (parameter count
reported nanoGPT-style, i.e. without the position embedding: 3,225,088).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from models.attn_deltanet import DeltaNetAttention
from models.attn_linear import LinearAttention
from models.attn_sliding import SlidingWindowAttention
from models.attn_softmax import CausalSoftmaxAttention
from models.multihead import AttentionConfigError
from models.sv_hybrid import SVHybridAttention

ATTENTION = {
    "softmax": CausalSoftmaxAttention,
    "sliding": SlidingWindowAttention,
    "linear": LinearAttention,
    "deltanet": DeltaNetAttention,
    "sv_hybrid": SVHybridAttention,
}


@dataclass
class GPTConfig:
    """Backbone configuration.

    attention : key of `ATTENTION`; attn_kwargs are passed to that module's constructor
    (e.g. ``{"window": 96}`` for "sliding", ``{"chunk": 64, "C": 0.25, "sigma": 2.0}`` for
    "sv_hybrid").
    """

    vocab_size: int = 256
    block_size: int = 256
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    attention: str = "softmax"
    attn_kwargs: dict = field(default_factory=dict)
    bias: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


class MLP(nn.Module):
    """``d -> 4d -> GELU -> d``."""

    def __init__(self, d_model: int, bias: bool = True):
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model, bias=bias)
        self.proj = nn.Linear(4 * d_model, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


def make_attention(name: str, d_model: int, n_heads: int, block_size: int, bias: bool = True, **kw):
    """Instantiate an attention variant by name (see `ATTENTION`)."""
    if name not in ATTENTION:
        raise AttentionConfigError(f"unknown attention {name!r}; choose from {sorted(ATTENTION)}")
    return ATTENTION[name](d_model, n_heads, block_size, bias=bias, **kw)


class Block(nn.Module):
    """Pre-norm transformer block around any attention module ``(B, T, d) -> (B, T, d)``."""

    def __init__(self, d_model: int, attn: nn.Module, bias: bool = True):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = attn
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Byte-level decoder LM.

    forward(idx (B, T) long, targets (B, T) long or None) -> (logits (B, T, vocab), loss | None)
    with loss the mean cross-entropy in nats.
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.block_size, cfg.d_model)
        self.blocks = nn.ModuleList(
            Block(
                cfg.d_model,
                make_attention(
                    cfg.attention, cfg.d_model, cfg.n_heads, cfg.block_size, cfg.bias,
                    **cfg.attn_kwargs,
                ),
                cfg.bias,
            )
            for _ in range(cfg.n_layers)
        )
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.wte.weight  # weight tying
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("io.proj.weight") or name.endswith("mlp.proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; nanoGPT convention excludes the position embedding."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.wpe.weight.numel() if non_embedding else n

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.shape
        if T > self.cfg.block_size:
            raise AttentionConfigError(f"sequence length {T} exceeds block_size {self.cfg.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss

    def attention_stats(self) -> list[dict]:
        """`last_stats` of every SV hybrid layer (empty for other variants)."""
        return [b.attn.last_stats for b in self.blocks if hasattr(b.attn, "last_stats")]
