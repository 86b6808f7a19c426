"""Compiled hybrid readout of the causal SV layer: the loops ``readout_forward`` /
``readout_backward`` of ``sv_core._batchfast`` (``sv_core/_readout_body.h``) behind a validated
interface. The autograd wrapper and the torch references (``hybrid_weights(q, k, gate, chunk) @ v``
and its dense / chunked fast forms) are in ``models.sv_hybrid_readout``.

Without a deletion mask, query ``t`` of chunk ``c = t // chunk`` (start ``s = c * chunk``) reads

    w[t, j] = p_j m_j / Z,  p_j = exp(q_t.k_j / sqrt(d) - max),  Z = sum_{j <= t} p_j m_j,

with ``m_j = gate[c, j]`` for prefix keys ``j < s`` and ``1`` for current-chunk keys ``s <= j <= t``;
future keys are never formed. The (B, H) problems are split over `compiled_threads` threads, each
computed by the same loop, so the result does not depend on the thread count.
"""
from __future__ import annotations

import math
import types

import torch

from sv_core.batched import common as batched_common
from sv_core.batched.common import BatchedGateError, compiled_threads


def compiled_readout_applicable(*tensors: torch.Tensor) -> bool:
    """The compiled readout is built and takes these tensors: CPU, one dtype, float32 / float64."""
    if batched_common.batchfast is None or not tensors:
        return False
    dt = tensors[0].dtype
    return dt in (torch.float32, torch.float64) and all(t.device.type == "cpu" and t.dtype == dt for t in tensors)


def _ext() -> types.ModuleType:
    ext = batched_common.batchfast
    if ext is None:
        raise BatchedGateError("the compiled readout is not built (python setup.py build_ext --inplace)")
    return ext


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor, chunk: int) -> tuple[int, ...]:
    if batched_common.batchfast is None:
        raise BatchedGateError("the compiled readout is not built (python setup.py build_ext --inplace)")
    if not compiled_readout_applicable(q, k, v, gate):
        raise BatchedGateError("q, k, v and gate must be CPU tensors of one dtype, float32 or float64")
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise BatchedGateError(f"q, k must be (B, H, T, d) and v (B, H, T, d_v); got {tuple(q.shape)}, "
                               f"{tuple(k.shape)}, {tuple(v.shape)}")
    if int(chunk) < 1:
        raise BatchedGateError(f"chunk must be >= 1, got {chunk}")
    B, H, T, d = q.shape
    nc = -(-T // int(chunk))
    if gate.shape != (B, H, nc, T):
        raise BatchedGateError(f"gate must have shape {(B, H, nc, T)}, got {tuple(gate.shape)}")
    if d < 1 or v.shape[-1] < 1:
        raise BatchedGateError("head dimensions must be >= 1")
    return B, H, T, d, v.shape[-1], nc


def _np(t: torch.Tensor):
    return t.detach().contiguous().numpy()


def readout_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor, chunk: int, need_pz: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Hybrid readout forward (no autograd).

    Parameters
    ----------
    q, k : tensors (B, H, T, d); v : tensor (B, H, T, d_v)
    gate : tensor (B, H, n_chunks, T), read on each chunk's prefix ``[0, s_c)`` only.
    chunk : int
    need_pz : also return ``p / Z`` on the prefix columns (what the gate gradient needs).

    Returns
    -------
    y : tensor (B, H, T, d_v), the readout ``w @ v``.
    w : tensor (B, H, T, T), the weights; only ``j <= t`` is written (the rest is undefined).
    pz : tensor (B, H, T, T) with ``p / Z`` on ``j < s_c(t)`` only (the rest undefined), or None.
    """
    B, H, T, d, dv, nc = _check(q, k, v, gate, chunk)
    y = q.new_empty(B, H, T, dv)
    w = q.new_empty(B, H, T, T)
    pz = q.new_empty(B, H, T, T) if need_pz else None
    ext = _ext()
    ext.readout_forward(_np(q), _np(k), _np(v), _np(gate), y.numpy(), w.numpy(),
                        (pz if pz is not None else q.new_empty(0)).numpy(), B * H, T, d, dv, nc, int(chunk),
                        1.0 / math.sqrt(d), q.dtype == torch.float64, compiled_threads())
    return y, w, pz


def readout_backward(
    gy: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor,
    pz: torch.Tensor | None, chunk: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Gradients of the hybrid readout from the upstream ``gy`` (B, H, T, d_v) and the forward's
    ``w`` and ``pz`` (`readout_forward`): ``(dq, dk, dv, dgate)``, dgate (B, H, n_chunks, T) zero
    outside each chunk's prefix, or None when ``pz`` is None."""
    gate_shape = (q.shape[0], q.shape[1], -(-q.shape[2] // max(int(chunk), 1)), q.shape[2])
    B, H, T, d, dv, nc = _check(q, k, v, q.new_empty(gate_shape), chunk)
    if gy.shape != v.shape or gy.dtype != q.dtype or w.shape != (B, H, T, T) or (
            pz is not None and pz.shape != w.shape):
        raise BatchedGateError("gy must match v, and w, pz must be (B, H, T, T) from readout_forward")
    dq, dk, dvv = q.new_empty(q.shape), q.new_empty(k.shape), q.new_empty(v.shape)
    dgate = q.new_empty(B, H, nc, T) if pz is not None else None
    empty = q.new_empty(0).numpy()
    ext = _ext()
    ext.readout_backward(_np(q), _np(k), _np(v), _np(w), empty if pz is None else _np(pz), _np(gy), dq.numpy(),
                         dk.numpy(), dvv.numpy(), empty if dgate is None else dgate.numpy(), B * H, T, d, dv, nc,
                         int(chunk), 1.0 / math.sqrt(d), q.dtype == torch.float64, compiled_threads())
    return dq, dk, dvv, dgate
