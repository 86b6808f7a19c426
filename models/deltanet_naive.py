"""DeltaNet reference: the naive per-step delta-rule recurrence (Schlag et al. 2021).

``S_t = S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T``, ``o_t = S_t q_t``, with S of shape
(d_v, d_k), L2-normalised keys and ``beta_t in (0, 1)``. Slow and obvious; the chunked form in
:mod:`models.attn_deltanet` is tested against it.
"""
from __future__ import annotations

import torch


def deltanet_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor):
    """Per-step recurrence.

    Parameters
    ----------
    q, k : tensors (B, H, T, d_k) (k already normalised by the caller)
    v : tensor (B, H, T, d_v)
    beta : tensor (B, H, T) in (0, 1)

    Returns
    -------
    tensor (B, H, T, d_v)
    """
    B, H, T, dk = k.shape
    S = k.new_zeros(B, H, v.shape[-1], dk)
    out = []
    for t in range(T):
        kt, vt, bt = k[:, :, t], v[:, :, t], beta[:, :, t, None]
        pred = (S @ kt.unsqueeze(-1)).squeeze(-1)  # S k_t, (B, H, d_v)
        S = S + (bt * (vt - pred)).unsqueeze(-1) * kt.unsqueeze(-2)
        out.append((S @ q[:, :, t].unsqueeze(-1)).squeeze(-1))
    return torch.stack(out, dim=2)
