"""The SV hybrid layer's gate and readout as one autograd node (CPU, compiled loops).

`SVHybridAttention.forward` takes this path when it applies (:func:`fused_applicable`: no deletion
mask, the batched gate with the compiled FISTA / KKT backends and the compiled readout, CPU
float32 / float64 tensors, ``sv_core._batchfast`` built). It runs the same functions on the same
inputs in the same order as the unfused path - `models.sv_hybrid.prefix_gate_batched` (the Gram,
`sv_core.batched.fista_svdd`, `partition_masks`, the compiled KKT solve, the warm-up rows) then the
compiled readout - so its output and every gradient are the same bits (tested against it). What it
leaves out is the orchestration between them: about ten autograd nodes (the Gram, the KKT solve, the
gate's reshapes, pads and concatenation, the readout), each function's re-validation of what the
previous one produced, and the copies between them. `python -m evaluation.clinical.deterioration_layer_bench`
measures the SV layer's time inside its compiled loops and around them.

When the compiled KKT solve cannot take the batch (a problem with valid keys but no margin key, or
a margin block that does not factor), :func:`fused_hybrid_attend` returns None before any graph is
recorded and the layer runs the unfused path, which solves such batches by its reference.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from models.sv_hybrid_readout import chunk_starts, gate_rows, prefix_masks
from sv_core.batched import fista_svdd, gate_stats, partition_masks, warmup_threshold
from sv_core.batched.common import any_true, check_box, compiled_applicable, gram_backward, gram_forward
from sv_core.batched.kkt import FactorFailed, compiled_kkt_backward, compiled_kkt_forward, needs_interval_rho
from sv_core.batched.readout import compiled_readout_applicable, readout_backward, readout_forward


def fused_applicable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep, kkt_solver: str,
                     fista_backend: str) -> bool:
    """The fused path takes this pass: no deletion mask, compiled KKT and FISTA backends ("auto" or
    "compiled"), CPU float32 / float64 tensors of one dtype, the compiled loops built."""
    return (keep is None and kkt_solver in ("auto", "compiled") and fista_backend in ("auto", "compiled")
            and compiled_applicable(k) and compiled_readout_applicable(q, k, v))


class _Plan:
    """What the fused node's forward reads, computed without autograd before it (the Gram, the masks,
    the partition); the node keeps it for the backward."""

    __slots__ = ("B", "H", "T", "n", "J", "chunk", "C", "sigma", "ridge", "Xf", "K", "keep", "S", "E", "warm",
                 "uniform", "need_pz")


class _FusedHybrid(torch.autograd.Function):
    """``y`` of the hybrid layer from q, k, v (B, H, T, d) and a :class:`_Plan`; second output the gate
    coefficients (P, J, n), not differentiable. Raises `FactorFailed` (before recording anything) when
    a margin block does not factor."""

    @staticmethod
    def forward(ctx, q, k, v, plan: _Plan):
        a_kkt, _rho, state = compiled_kkt_forward(plan.K, plan.S, plan.ridge, plan.E, plan.C)
        alpha = a_kkt if plan.uniform is None else torch.where(plan.warm.unsqueeze(-1), plan.uniform, a_kkt)
        gate = gate_rows(alpha, plan.B, plan.H, plan.T)
        y, w, pz = readout_forward(q, k, v, gate, plan.chunk, need_pz=plan.need_pz)
        ctx.plan, ctx.state = plan, state
        ctx.save_for_backward(q, k, v, w, pz if plan.need_pz else torch.empty(0), a_kkt)
        ctx.mark_non_differentiable(alpha)
        return y, alpha

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy, _g_alpha):
        q, k, v, w, pz, a_kkt = ctx.saved_tensors
        plan = ctx.plan
        B, H, T, n, J = plan.B, plan.H, plan.T, plan.n, plan.J
        dq, dk, dv, dgate = readout_backward(gy, q, k, v, w, pz if plan.need_pz else None, plan.chunk)
        if dgate is None:
            return dq, dk, dv, None
        # the unfused graph's backward, step by step: the concatenation and the pad (slices), the view,
        # the warm-up selection (zero where a row is uniform), then the KKT solve and the Gram
        ga = dgate[:, :, 1:, :n].reshape(B * H, J, n)
        if plan.uniform is not None:
            ga = torch.where(plan.warm.unsqueeze(-1), torch.zeros_like(ga), ga)
        gK, _, _ = compiled_kkt_backward(ctx.state, a_kkt, ga, None, True)
        dX = gram_backward(plan.Xf, plan.K, plan.keep, gK, plan.sigma, True).view(B, H, n, -1)
        dk = dk + nn.functional.pad(dX, (0, 0, 0, T - n))
        return dq, dk, dv, None


def fused_hybrid_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk: int, C: float, sigma: float,
                        iters: int, tol: float | None, ridge: float, fista_dtype: torch.dtype | None,
                        fista_backend: str) -> tuple[torch.Tensor, Mapping] | None:
    """The hybrid readout (B, H, T, d_v) of q, k, v (B, H, T, d; contiguous) with the chunk-frozen gate,
    and the gate's diagnostics (as `prefix_gate_batched` returns them); None when the fused path does not
    take the batch (fewer than two chunks, or the compiled KKT solve cannot: see the module)."""
    B, H, T, d = k.shape
    starts = chunk_starts(T, chunk)
    if len(starts) <= 1:
        return None
    C = check_box(C)
    n, J, P = starts[-1], len(starts) - 1, B * H
    plan = _Plan()
    plan.B, plan.H, plan.T, plan.n, plan.J, plan.chunk = B, H, T, n, J, int(chunk)
    plan.C, plan.sigma, plan.ridge = C, float(sigma), float(ridge)
    with torch.no_grad():
        plan.Xf = k.detach()[:, :, :n].reshape(P, n, d)
        K, plan.keep = gram_forward(plan.Xf, plan.sigma)
        mask = prefix_masks(B, H, starts, k.device)
        nvalid = mask.sum(-1)
        warm = nvalid < warmup_threshold(C)
        solve_mask = mask & ~warm.unsqueeze(-1)
        Kf = K if fista_dtype is None else K.to(fista_dtype)
        a_est, info = fista_svdd(Kf, C, solve_mask, iters=iters, tol=tol, check_every=2, return_info=True,
                                 backend=fista_backend)
        S, E = partition_masks(a_est.to(K.dtype), C, solve_mask, None)
        if needs_interval_rho(S, solve_mask):
            return None  # a problem whose rho comes from its KKT interval: the unfused path's reference solve
        plan.K, plan.S, plan.E, plan.warm = K, S, E, warm
        plan.uniform = (mask.to(K.dtype) / nvalid.clamp_min(1).to(K.dtype).unsqueeze(-1)) if any_true(warm) else None
    plan.need_pz = torch.is_grad_enabled() and k.requires_grad
    try:
        y, alpha = _FusedHybrid.apply(q, k, v, plan)
    except FactorFailed:
        return None
    return y, gate_stats(S, E, mask, warm, alpha, C, info.iterations)
