"""Readout of the causal SV hybrid layer (:mod:`models.sv_hybrid`): the attention weights
(`hybrid_weights`, the reference), and three fast ``weights @ v`` paths with hand-written backwards
tested against it — compiled loops over the visible keys of each query (`hybrid_attend_compiled`,
CPU float32 / float64 when ``sv_core._batchfast`` is built; `sv_core.batched.readout`), chunk by
chunk over the visible keys (`hybrid_attend_chunked`), or the whole score matrix at once
(`hybrid_attend_dense`); `hybrid_attend` picks one."""
from __future__ import annotations

import functools
import math

import torch
from torch import nn

from models.multihead import AttentionConfigError
from sv_core.batched.readout import compiled_readout_applicable, readout_backward, readout_forward


def chunk_starts(T: int, chunk: int) -> list[int]:
    """Start positions ``s_j = j * chunk`` of the chunks of a length-T sequence."""
    if chunk < 1:
        raise AttentionConfigError(f"chunk must be >= 1, got {chunk}")
    return list(range(0, T, chunk))


def prefix_masks(B: int, H: int, starts: list[int], device, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Bool (B * H, J, n) masks of the nested prefixes ``[0, s_j)``, j = 1 .. J, of the chunk starts
    ``starts`` (J = len(starts) - 1, n = starts[-1]); with ``keep`` (B, T) bool, False slots are out."""
    n, J = starts[-1], len(starts) - 1
    pos = torch.arange(n, device=device)
    s_j = torch.tensor(starts[1:], device=device)
    mask = (pos.unsqueeze(0) < s_j.unsqueeze(1)).view(1, 1, J, n).expand(B, H, J, n)
    if keep is not None:
        mask = mask & keep[:, :n].to(torch.bool).view(B, 1, 1, n)
    return mask.reshape(B * H, J, n)


def gate_rows(alpha: torch.Tensor, B: int, H: int, T: int) -> torch.Tensor:
    """The gate tensor (B, H, n_chunks, T) the readout reads from the prefix coefficients alpha
    (B * H, J, n): row 0 (the first chunk, no prefix) zero, row j = alpha_j padded to T."""
    J, n = alpha.shape[-2:]
    return torch.cat([alpha.new_zeros(B, H, 1, T), nn.functional.pad(alpha.view(B, H, J, n), (0, T - n))], dim=2)


def hybrid_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    gate: torch.Tensor,
    chunk: int,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention weights of the hybrid layer.

    ``w[t, j] ∝ exp(q_t.k_j / sqrt(d)) * m[t, j]`` over ``j <= t`` with ``m = alpha_{c(t)}[j]``
    for prefix keys (``j < s_{c(t)}``) and ``m = 1`` for current-chunk keys, normalised per row.

    Parameters
    ----------
    q, k : tensors (B, H, T, d)
    gate : tensor (B, H, n_chunks, T) from `prefix_gate_batched` / `prefix_gate_exact`.
    chunk : int
    keep : optional bool tensor (B, T); False slots get weight 0 (local-path deletion mask).

    Returns
    -------
    tensor (B, H, T, T), rows sum to 1 (0 where nothing is visible).
    """
    B, H, T, d = q.shape
    idx = torch.arange(T, device=q.device)
    cid = idx // chunk
    start = cid * chunk
    local = (idx.unsqueeze(0) >= start.unsqueeze(1)) & (idx.unsqueeze(0) <= idx.unsqueeze(1))
    mult = gate.index_select(2, cid) + local.to(gate.dtype)  # gate is 0 outside the prefix
    if keep is not None:
        mult = mult * keep.to(gate.dtype).view(B, 1, 1, T)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    causal = idx.unsqueeze(0) <= idx.unsqueeze(1)
    scores = scores.masked_fill(~causal, float("-inf"))
    p = torch.exp(scores - scores.amax(-1, keepdim=True).detach()) * mult  # shift-invariant
    return p / p.sum(-1, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny)


class _ChunkedHybridReadout(torch.autograd.Function):
    """Chunk-by-chunk hybrid readout with a hand-written backward (see `hybrid_attend_chunked`).

    For query chunk c (rows ``[s, e)``) only keys ``[0, e)`` are visible, so scores are formed
    for those columns only (about ``(n_chunks + 1) / (2 n_chunks)`` of the dense T x T work).
    With ``p = exp(score - max)``, ``Z = sum_j p_j m_j`` and ``w = p m / Z``::

        dL/dscore_j = w_j (g_j - r),   dL/dm_j = (p_j / Z) (g_j - r),   r = sum_j w_j g_j

    where ``g = dL/dw = dy v^T``; the gate gradient of chunk c sums dL/dm over its queries on the
    prefix columns ``[0, s)`` (the gate is zero elsewhere by contract).
    """

    @staticmethod
    def forward(ctx, q, k, v, gate, chunk):
        B, H, T, d = q.shape
        scale = 1.0 / math.sqrt(d)
        need_gate = ctx.needs_input_grad[3]
        y = q.new_empty(B, H, T, v.shape[-1])
        ws, pzs = [], []
        for c, s in enumerate(chunk_starts(T, chunk)):
            e = min(s + chunk, T)
            qc = q[:, :, s:e]
            sc = (qc * scale) @ k[:, :, :e].transpose(-1, -2)  # (B, H, L, e)
            L = e - s
            tri = torch.ones(L, L, dtype=torch.bool, device=q.device).triu_(1)
            sc[..., s:e].masked_fill_(tri, float("-inf"))
            sc.sub_(sc.amax(-1, keepdim=True)).exp_()  # p
            if s > 0:
                g = gate[:, :, c, :s].unsqueeze(-2)
                if need_gate:
                    pref = sc[..., :s].clone()
                sc[..., :s].mul_(g)
            Z = sc.sum(-1, keepdim=True).clamp_min_(torch.finfo(sc.dtype).tiny)
            sc.div_(Z)  # w
            if s > 0 and need_gate:
                pzs.append(pref.div_(Z))
            else:
                pzs.append(None)
            y[:, :, s:e] = sc @ v[:, :, :e]
            ws.append(sc)
        ctx.chunk, ctx.scale = chunk, scale
        ctx.ws, ctx.pzs = ws, pzs
        ctx.save_for_backward(q, k, v)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy):
        q, k, v = ctx.saved_tensors
        B, H, T, d = q.shape
        chunk, scale = ctx.chunk, ctx.scale
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dgate = q.new_zeros(B, H, len(ctx.ws), T) if ctx.needs_input_grad[3] else None
        for c, s in enumerate(chunk_starts(T, chunk)):
            e = min(s + chunk, T)
            w, pz = ctx.ws[c], ctx.pzs[c]
            gyc = gy[:, :, s:e]
            dv[:, :, :e] += w.transpose(-1, -2) @ gyc
            gw = gyc @ v[:, :, :e].transpose(-1, -2)  # (B, H, L, e)
            r = (w * gw).sum(-1, keepdim=True)
            gw.sub_(r)
            if dgate is not None and pz is not None:
                dgate[:, :, c, :s] = (pz * gw[..., :s]).sum(-2)
            gw.mul_(w)  # dL/dscore
            dq[:, :, s:e] = (gw @ k[:, :, :e]) * scale
            dk[:, :, :e] += (gw.transpose(-1, -2) @ q[:, :, s:e]) * scale
        return dq, dk, dv, dgate, None


def hybrid_attend_chunked(q, k, v, gate, chunk) -> torch.Tensor:
    """Fast hybrid readout (no deletion mask): same value and gradients as
    ``hybrid_weights(q, k, gate, chunk) @ v`` (the reference), computed one query chunk at a
    time over its visible keys with a hand-written backward (first-order autograd only).

    Parameters
    ----------
    q, k : tensors (B, H, T, d); v : tensor (B, H, T, d_v)
    gate : tensor (B, H, n_chunks, T), zero outside each chunk's prefix ``[0, s_c)`` (as built
        by `prefix_gate_batched` / `prefix_gate_exact`; entries outside are ignored here).
    chunk : int

    Returns
    -------
    tensor (B, H, T, d_v)
    """
    if chunk < 1:
        raise AttentionConfigError(f"chunk must be >= 1, got {chunk}")
    return _ChunkedHybridReadout.apply(q, k, v, gate, int(chunk))


@functools.lru_cache(maxsize=64)
def dense_masks(T: int, chunk: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """The (T, T) position masks of the dense readout, built once per (T, chunk, device): the chunk
    index of each position (T,), the current-chunk keys ``local`` (``s_c(t) <= j <= t``), the
    ``future`` keys (``j > t``) and ``outside`` the prefix (``local | future``). Read-only."""
    idx = torch.arange(T, device=device)
    cid = idx // chunk
    local = (idx.unsqueeze(0) >= (cid * chunk).unsqueeze(1)) & (idx.unsqueeze(0) <= idx.unsqueeze(1))
    future = idx.unsqueeze(0) > idx.unsqueeze(1)
    return cid, local, future, local | future


class _DenseHybridReadout(torch.autograd.Function):
    """Whole-sequence hybrid readout with a hand-written backward (see `hybrid_attend_dense`):
    the T x T scores at once, the chunk gates gathered into a (B, H, T, T) multiplier; the same
    formulas as `_ChunkedHybridReadout` (``dL/dscore = w (g - r)``, ``dL/dm = (p / Z)(g - r)``),
    the gate gradient summed over each chunk's queries. A dozen tensor operations each way
    instead of a dozen per chunk: faster when chunks are many and short."""

    @staticmethod
    def forward(ctx, q, k, v, gate, chunk):
        B, H, T, d = q.shape
        scale = 1.0 / math.sqrt(d)
        nc = gate.shape[2]
        cid, local, future, outside = dense_masks(T, chunk, q.device)
        sc = (q * scale) @ k.transpose(-1, -2)  # (B, H, T, T)
        sc.masked_fill_(future, float("-inf"))
        sc.sub_(sc.amax(-1, keepdim=True)).exp_()  # p
        mult = gate.index_select(2, cid)  # zero outside each chunk's prefix, by contract
        mult.masked_fill_(local, 1.0)
        need_gate = ctx.needs_input_grad[3]
        pz = sc.masked_fill(outside, 0.0) if need_gate else None  # p on the prefix columns only
        sc.mul_(mult)
        Z = sc.sum(-1, keepdim=True).clamp_min_(torch.finfo(sc.dtype).tiny)
        sc.div_(Z)  # w
        if need_gate:
            pz.div_(Z)  # p / Z on the prefix columns (0 / Z = 0 elsewhere)
        ctx.chunk, ctx.scale, ctx.nc = chunk, scale, nc
        ctx.save_for_backward(q, k, v, sc, pz if need_gate else torch.empty(0))
        return sc @ v

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy):
        q, k, v, w, pz = ctx.saved_tensors
        B, H, T, d = q.shape
        chunk, scale, nc = ctx.chunk, ctx.scale, ctx.nc
        dv = w.transpose(-1, -2) @ gy
        g = gy @ v.transpose(-1, -2)  # dL/dw
        g.sub_((w * g).sum(-1, keepdim=True))
        dgate = None
        if ctx.needs_input_grad[3]:
            dm = pz * g
            pad = nc * chunk - T
            if pad:
                dm = nn.functional.pad(dm, (0, 0, 0, pad))
            dgate = dm.view(B, H, nc, chunk, T).sum(3)
        g.mul_(w)  # dL/dscore
        dq = (g @ k) * scale
        dk = (g.transpose(-1, -2) @ q) * scale
        return dq, dk, dv, dgate, None


def hybrid_attend_dense(q, k, v, gate, chunk) -> torch.Tensor:
    """Fast hybrid readout (no deletion mask) over the whole T x T score matrix at once, with a
    hand-written backward: same value and gradients as ``hybrid_weights(q, k, gate, chunk) @ v``
    (the reference) and `hybrid_attend_chunked`; fewer, larger operations (the better choice
    for many short chunks). Shapes as `hybrid_attend_chunked`."""
    if chunk < 1:
        raise AttentionConfigError(f"chunk must be >= 1, got {chunk}")
    return _DenseHybridReadout.apply(q, k, v, gate, int(chunk))


class _CompiledHybridReadout(torch.autograd.Function):
    """Hybrid readout in the compiled loops of `sv_core.batched.readout` (the formulas of
    `_ChunkedHybridReadout`, future keys never formed); stores the weights (and ``p / Z`` on the
    prefix columns when the gate needs a gradient) for the backward."""

    @staticmethod
    def forward(ctx, q, k, v, gate, chunk):
        need_gate = ctx.needs_input_grad[3]
        # the loops read contiguous rows: copy the head views once here and keep the copies for
        # the backward (which would otherwise copy them again)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        y, w, pz = readout_forward(q, k, v, gate, chunk, need_pz=need_gate)
        ctx.chunk = chunk
        ctx.save_for_backward(q, k, v, w, pz if need_gate else torch.empty(0))
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy):
        q, k, v, w, pz = ctx.saved_tensors
        dq, dk, dv, dgate = readout_backward(gy, q, k, v, w, pz if ctx.needs_input_grad[3] else None, ctx.chunk)
        return dq, dk, dv, dgate, None


def hybrid_attend_compiled(q, k, v, gate, chunk) -> torch.Tensor:
    """Fast hybrid readout (no deletion mask) in compiled loops (`sv_core.batched.readout`; CPU
    float32 / float64 tensors of one dtype, ``sv_core._batchfast`` built): same value and
    gradients as ``hybrid_weights(q, k, gate, chunk) @ v`` (the reference) up to rounding, first-
    order autograd only; thread count does not change the result. Shapes as `hybrid_attend_chunked`."""
    if chunk < 1:
        raise AttentionConfigError(f"chunk must be >= 1, got {chunk}")
    return _CompiledHybridReadout.apply(q, k, v, gate, int(chunk))


#: `hybrid_attend` reads the whole score matrix at once from this many chunks on (with many small
#: chunks the dense form beats the chunk loop; with few large chunks the chunk loop skips the upper
#: blocks and wins)
DENSE_READOUT_MIN_CHUNKS = 6


def hybrid_attend(q, k, v, gate, chunk, keep=None, fused: bool = True) -> torch.Tensor:
    """Hybrid readout ``weights @ v``: (B, H, T, d) x3 + gate -> (B, H, T, d_v).

    Without a deletion mask and with ``fused=True`` this is `hybrid_attend_compiled` when it
    applies (CPU float32 / float64, compiled loops built), else `hybrid_attend_dense` when the
    sequence has at least :data:`DENSE_READOUT_MIN_CHUNKS` chunks, else `hybrid_attend_chunked`;
    otherwise the dense reference ``hybrid_weights(...) @ v``.
    """
    if keep is None and fused:
        if compiled_readout_applicable(q, k, v, gate):
            return hybrid_attend_compiled(q, k, v, gate, chunk)
        if -(-q.shape[2] // int(chunk)) >= DENSE_READOUT_MIN_CHUNKS:
            return hybrid_attend_dense(q, k, v, gate, chunk)
        return hybrid_attend_chunked(q, k, v, gate, chunk)
    return hybrid_weights(q, k, gate, chunk, keep) @ v
