"""Clinical LSTM baseline: per-hour sequence classifier ``(B, T, F) -> logits (B, T)``."""
from __future__ import annotations

import torch
from torch import nn


class LSTMClassifier(nn.Module):
    """Unidirectional (hence causal) LSTM with a linear per-step head.

    Parameters
    ----------
    n_features : F, inputs per hour.
    hidden : LSTM width.
    layers : stacked LSTM layers.
    dropout : between stacked layers.
    """

    def __init__(self, n_features: int, hidden: int = 64, layers: int = 1, dropout: float = 0.0):
        super().__init__()
        self.lstm = nn.LSTM(n_features, hidden, num_layers=layers, batch_first=True,
                            dropout=dropout if layers > 1 else 0.0)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, F) -> logits (B, T)."""
        h, _ = self.lstm(x)
        return self.head(h).squeeze(-1)
