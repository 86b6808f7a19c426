"""Clinical GRU peer: per-hour sequence classifier ``(B, T, F) -> logits (B, T)``.

The strongest recurrent peer of YAIB's hourly ICU benchmarks (van de Water et al., ICLR 2024:
GRU ahead of LSTM and Transformer on AKI and sepsis); the same shape and head as
:class:`models.lstm.LSTMClassifier`, so the deterioration study and the MEDS-DEV entries train
both with one loop.
"""
from __future__ import annotations

import torch
from torch import nn


class GRUClassifier(nn.Module):
    """Unidirectional (hence causal) GRU with a linear per-step head.

    Parameters
    ----------
    n_features : F, inputs per hour.
    hidden : GRU width.
    layers : stacked GRU layers.
    dropout : between stacked layers.
    """

    def __init__(self, n_features: int, hidden: int = 64, layers: int = 1, dropout: float = 0.0):
        super().__init__()
        self.gru = nn.GRU(n_features, hidden, num_layers=layers, batch_first=True,
                          dropout=dropout if layers > 1 else 0.0)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, F) -> logits (B, T)."""
        h, _ = self.gru(x)
        return self.head(h).squeeze(-1)
