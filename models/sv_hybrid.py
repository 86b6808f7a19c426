"""Causal SV hybrid attention: chunk-frozen support-vector gate + dense local softmax path.

SPEC §1 "Causal hybrid layer" (preprint 000 §3.5, 001 §3.4):

* Chunk-frozen gate: the sequence is cut into chunks of length ``chunk``; queries in chunk
  ``[s, e)`` read the SVDD gate fit on the keys ``[0, s)`` (RBF kernel, bandwidth sigma, box C).
  In training every (batch, head, chunk) problem is solved at once by the batched approximate
  path (`sv_core.batched.batched_gate`: FISTA partition + 1e-3-ridged KKT solve, autograd).
* Local path: a query at t attends with softmax ``q.k / sqrt(d)`` over ``[0, t]``; prefix weights
  are multiplied by the gate alpha, current-chunk weights by 1, then renormalised.
* Warm-up: a prefix with fewer than ``ceil(1/C) + 2`` keys is read ungated (uniform alpha).
* Deletion (`ExactHybridMemory.forget`): a token admitted to the long-range gate is removed by
  the exact fp64 decremental path (`sv_core.Gate.forget`) on the frozen keys - a certified
  fixed-C deletion; its current-chunk slot is masked and the local weights renormalised - direct
  cache deletion, no support-vector certificate.

LM configuration: chunk 64, C = 0.25, sigma = 2.

Fast paths (each tested against its reference): the ridged KKT solve defaults to the
Schur-complement Cholesky solve (``kkt_solver="cholesky"``; reference ``"lu"`` =
``torch.linalg.solve`` as in the SPEC), and without a deletion mask the readout is computed chunk
by chunk over the visible keys only, with a hand-written backward (`hybrid_attend_chunked`;
reference `hybrid_weights` @ v, ``fused_readout=False``).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from models.multihead import AttentionConfigError, MultiHeadIO
from sv_core import torch_kernel
from sv_core.batched import KKT_SOLVERS, batched_gate, warmup_threshold


class HybridDeletionError(ValueError):
    """A deletion request the hybrid memory cannot honour (bad position, already deleted)."""


# --------------------------------------------------------------------------------------------
# gate construction
# --------------------------------------------------------------------------------------------


def chunk_starts(T: int, chunk: int) -> list[int]:
    """Start positions ``s_j = j * chunk`` of the chunks of a length-T sequence."""
    if chunk < 1:
        raise AttentionConfigError(f"chunk must be >= 1, got {chunk}")
    return list(range(0, T, chunk))


def prefix_gate_batched(
    k: torch.Tensor,
    chunk: int,
    C: float,
    sigma: float,
    iters: int = 80,
    tol: float | None = None,
    ridge: float = 1e-3,
    fista_dtype: torch.dtype | None = torch.float32,
    keep: torch.Tensor | None = None,
    kkt_solver: str = "cholesky",
) -> tuple[torch.Tensor, dict]:
    """Chunk-frozen gate coefficients for every (batch, head, chunk), solved as one batch.

    The prefix of chunk j is ``[0, s_j)``; the ``n_chunks - 1`` nested prefixes of one
    (batch, head) share the Gram matrix of the longest prefix ``n = s_last`` and differ by
    their masks, so all ``B * H * (n_chunks - 1)`` problems are one batched solve over
    ``B * H`` Gram matrices.

    Parameters
    ----------
    k : tensor (B, H, T, d), keys (gradients flow through the ridged solve).
    chunk, C, sigma : gate configuration.
    iters, tol, ridge, fista_dtype : batched-solver settings.
    keep : optional bool tensor (B, T); False slots are excluded from every prefix.
    kkt_solver : "cholesky" (fast Schur-complement path, default) or "lu" (the SPEC reference
        ``torch.linalg.solve``); see `sv_core.batched.ridged_kkt_solve`.

    Returns
    -------
    gate : tensor (B, H, n_chunks, T): ``gate[b, h, j, i] = alpha_j[i]`` for ``i < s_j``, else 0.
    stats : dict of detached diagnostics (``active`` (G,), ``prefix`` (G,), ``warmup`` (G,),
        ``fista_iterations``, ``max_box``, ``max_sum``).
    """
    B, H, T, d = k.shape
    starts = chunk_starts(T, chunk)
    nc = len(starts)
    gate = k.new_zeros(B, H, nc, T)
    if nc <= 1:
        return gate, {"active": k.new_zeros(0), "prefix": k.new_zeros(0), "warmup": k.new_zeros(0)}
    n = starts[-1]
    J = nc - 1
    kp = k[:, :, :n]
    Kfull = torch_kernel(kp, kp, sigma).reshape(B * H, n, n)  # one Gram shared by J prefixes
    pos = torch.arange(n, device=k.device)
    s_j = torch.tensor(starts[1:], device=k.device)
    mask = (pos.unsqueeze(0) < s_j.unsqueeze(1)).view(1, 1, J, n).expand(B, H, J, n)
    if keep is not None:
        mask = mask & keep[:, :n].to(torch.bool).view(B, 1, 1, n)
    mask = mask.reshape(B * H, J, n)
    res = batched_gate(Kfull, C, mask, iters=iters, tol=tol, ridge=ridge, fista_dtype=fista_dtype,
                       kkt_solver=kkt_solver)
    alpha = res.alpha.view(B, H, J, n)
    gate = torch.cat([k.new_zeros(B, H, 1, T), nn.functional.pad(alpha, (0, T - n))], dim=2)
    stats = {
        "active": res.active_count.detach().reshape(-1),
        "prefix": mask.sum(-1).detach().reshape(-1),
        "warmup": res.warmup.detach().reshape(-1),
        "fista_iterations": res.fista.iterations,
        "max_box": res.report.max_box,
        "max_sum": res.report.max_sum,
    }
    return gate, stats


def prefix_gate_exact(
    k: torch.Tensor, chunk: int, C: float, sigma: float, keep: torch.Tensor | None = None
) -> torch.Tensor:
    """Same contract as `prefix_gate_batched` but every prefix solved by the exact fp64
    reference `sv_core.refit` (no gradient; for audits and agreement tests).

    Returns
    -------
    gate : tensor (B, H, n_chunks, T) in k's dtype, constant (no autograd).
    """
    from sv_core import refit

    B, H, T, d = k.shape
    starts = chunk_starts(T, chunk)
    gate = np.zeros((B, H, len(starts), T))
    kn = k.detach().cpu().double().numpy()
    kp = np.ones((B, T), dtype=bool) if keep is None else keep.detach().cpu().numpy().astype(bool)
    thr = warmup_threshold(C)
    for b in range(B):
        for j, s in enumerate(starts):
            if j == 0:
                continue
            idx = np.flatnonzero(kp[b, :s])
            if idx.size == 0:
                continue
            for h in range(H):
                if idx.size < thr:
                    gate[b, h, j, idx] = 1.0 / idx.size
                else:
                    alpha, _ = refit(kn[b, h, idx], C=C, sigma=sigma)
                    gate[b, h, j, idx] = np.asarray(alpha, dtype=float)
    return torch.as_tensor(gate, dtype=k.dtype, device=k.device)


# --------------------------------------------------------------------------------------------
# readout
# --------------------------------------------------------------------------------------------


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


def hybrid_attend(q, k, v, gate, chunk, keep=None, fused: bool = True) -> torch.Tensor:
    """Hybrid readout ``weights @ v``: (B, H, T, d) x3 + gate -> (B, H, T, d_v).

    Without a deletion mask and with ``fused=True`` this is `hybrid_attend_chunked`; otherwise
    the dense reference ``hybrid_weights(...) @ v``.
    """
    if keep is None and fused:
        return hybrid_attend_chunked(q, k, v, gate, chunk)
    return hybrid_weights(q, k, gate, chunk, keep) @ v


class SVHybridAttention(nn.Module):
    """Multi-head causal SV hybrid attention layer (batched approximate gate in training).

    Parameters
    ----------
    d_model, n_heads, block_size : common attention signature.
    chunk : gate chunk length (64 in the LM runs).
    C : fixed box (0.25 in the LM runs).
    sigma : RBF bandwidth (2.0).
    fista_iters, fista_tol : batched FISTA iterations / optional early-exit tolerance.
    ridge : KKT ridge (1e-3).
    gate : "batched" (training path) or "exact" (fp64 `sv_core.refit` per prefix, no gradient
        through the gate).
    fista_dtype : dtype of the partition finder (float32 as in the seed; None = model dtype).
    kkt_solver : "cholesky" (default: Schur-complement fast path) or "lu" (reference
        ``torch.linalg.solve``) for the ridged KKT solve.
    fused_readout : use the chunked readout with a hand-written backward
        (`hybrid_attend_chunked`) when no deletion mask is given; False: dense reference.

    Attributes
    ----------
    last_stats : dict of diagnostics of the latest forward (see `prefix_gate_batched`).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        block_size: int = 256,
        chunk: int = 64,
        C: float = 0.25,
        sigma: float = 2.0,
        fista_iters: int = 80,
        fista_tol: float | None = None,
        ridge: float = 1e-3,
        gate: str = "batched",
        fista_dtype: torch.dtype | None = torch.float32,
        bias: bool = True,
        kkt_solver: str = "cholesky",
        fused_readout: bool = True,
    ):
        super().__init__()
        if gate not in ("batched", "exact"):
            raise AttentionConfigError(f"gate must be 'batched' or 'exact', got {gate!r}")
        if not (C > 0) or not (sigma > 0):
            raise AttentionConfigError(f"C and sigma must be positive, got C={C}, sigma={sigma}")
        if chunk < 1:
            raise AttentionConfigError(f"chunk must be >= 1, got {chunk}")
        self.io = MultiHeadIO(d_model, n_heads, bias)
        self.chunk, self.C, self.sigma = int(chunk), float(C), float(sigma)
        self.fista_iters, self.fista_tol, self.ridge = int(fista_iters), fista_tol, float(ridge)
        self.gate_mode, self.fista_dtype = gate, fista_dtype
        if kkt_solver not in KKT_SOLVERS:
            raise AttentionConfigError(f"kkt_solver must be one of {KKT_SOLVERS}, got {kkt_solver!r}")
        self.kkt_solver, self.fused_readout = kkt_solver, bool(fused_readout)
        self.last_stats: dict = {}

    def compute_gate(self, k: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """Gate tensor (B, H, n_chunks, T) for keys (B, H, T, d)."""
        if self.gate_mode == "exact":
            self.last_stats = {}
            return prefix_gate_exact(k, self.chunk, self.C, self.sigma, keep)
        gate, self.last_stats = prefix_gate_batched(
            k,
            self.chunk,
            self.C,
            self.sigma,
            iters=self.fista_iters,
            tol=self.fista_tol,
            ridge=self.ridge,
            fista_dtype=self.fista_dtype,
            keep=keep,
            kkt_solver=self.kkt_solver,
        )
        return gate

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, d_model) [+ keep (B, T) bool] -> (B, T, d_model)."""
        q, k, v = self.io.split(x)
        gate = self.compute_gate(k, keep)
        return self.io.merge(hybrid_attend(q, k, v, gate, self.chunk, keep, self.fused_readout))

    @torch.no_grad()
    def freeze(self, x: torch.Tensor) -> "ExactHybridMemory":
        """Exact fp64 inference memory for one sequence ``x`` of shape (1, T, d_model) or
        (T, d_model), with maintained gates per chunk boundary (supports `forget`)."""
        if x.dim() == 2:
            x = x.unsqueeze(0)
        if x.shape[0] != 1:
            raise AttentionConfigError("freeze expects a single sequence")
        q, k, v = self.io.split(x)
        return ExactHybridMemory(q[0], k[0], v[0], self.chunk, self.C, self.sigma)


# --------------------------------------------------------------------------------------------
# exact inference memory with deletion
# --------------------------------------------------------------------------------------------


@dataclass
class ForgetRecord:
    """What `ExactHybridMemory.forget` did.

    Attributes
    ----------
    position : deleted position.
    certified_gates : (head, chunk) pairs whose long-range gate was decremented exactly by
        `sv_core.Gate.forget` (fixed-C, fp64) - covered by the SV certificate.
    warmup_gates : (head, chunk) pairs that fell below the warm-up size and are now read
        ungated (no certificate).
    local_masked : the slot was masked in the dense local path of its own chunk (no
        certificate: direct cache deletion and renormalisation).
    receipts : the `sv_core.Receipt` of every certified gate decrement.
    """

    position: int
    certified_gates: list = field(default_factory=list)
    warmup_gates: list = field(default_factory=list)
    local_masked: bool = True
    receipts: list = field(default_factory=list)


class ExactHybridMemory:
    """fp64 hybrid readout of one frozen sequence with exact maintained gates.

    Parameters
    ----------
    q, k, v : tensors or arrays (H, T, d) of one sequence.
    chunk, C, sigma : gate configuration.

    Attributes
    ----------
    gates : dict ``(h, j) -> sv_core.Gate`` for every chunk j >= 1 whose prefix reaches the
        warm-up size; prefixes below it are read ungated.
    keep : bool array (T,), False at deleted positions.
    """

    def __init__(self, q, k, v, chunk: int, C: float, sigma: float):
        from sv_core import Gate

        self.q = torch.as_tensor(q).detach().double().cpu()
        self.k = torch.as_tensor(k).detach().double().cpu()
        self.v = torch.as_tensor(v).detach().double().cpu()
        if self.q.dim() != 3:
            raise AttentionConfigError("q, k, v must have shape (H, T, d)")
        self.H, self.T, _ = self.k.shape
        self.chunk, self.C, self.sigma = int(chunk), float(C), float(sigma)
        self.starts = chunk_starts(self.T, self.chunk)
        self.keep = np.ones(self.T, dtype=bool)
        self.thr = warmup_threshold(self.C)
        self.gates: dict = {}
        self._pos_of_id: dict = {}
        kn = self.k.numpy()
        for h in range(self.H):
            for j, s in enumerate(self.starts):
                if j == 0 or s < self.thr:
                    continue
                g = Gate(C=self.C, sigma=self.sigma)
                ids = list(np.asarray(g.admit(kn[h, :s])).tolist())
                self.gates[(h, j)] = g
                self._pos_of_id[(h, j)] = dict(zip(ids, range(s)))

    def gate_tensor(self) -> torch.Tensor:
        """(1, H, n_chunks, T) gate coefficients of the current (possibly decremented) state."""
        gate = torch.zeros(1, self.H, len(self.starts), self.T, dtype=torch.float64)
        for h in range(self.H):
            for j, s in enumerate(self.starts):
                if j == 0:
                    continue
                if (h, j) in self.gates:
                    g = self.gates[(h, j)]
                    pos = self._pos_of_id[(h, j)]
                    for tid, a in zip(np.asarray(g.ids).tolist(), np.asarray(g.alpha).tolist()):
                        gate[0, h, j, pos[tid]] = a
                else:
                    idx = np.flatnonzero(self.keep[:s])
                    if idx.size:
                        gate[0, h, j, torch.as_tensor(idx)] = 1.0 / idx.size
        return gate

    def weights(self) -> torch.Tensor:
        """(H, T, T) attention weights of the current state."""
        keep = torch.as_tensor(self.keep).view(1, self.T)
        return hybrid_weights(self.q[None], self.k[None], self.gate_tensor(), self.chunk, keep)[0]

    def readout(self) -> torch.Tensor:
        """(H, T, d_v) outputs of the current state."""
        return self.weights() @ self.v

    def forget(self, position: int) -> ForgetRecord:
        """Delete the token at ``position`` from every path that holds it.

        Long-range: every gate whose prefix contains the position is decremented by the exact
        fp64 path (`Gate.forget`); a gate that would drop below the warm-up size is retired and
        its prefix read ungated (flagged, no certificate). Local: the slot is masked and the
        local weights renormalised (no certificate).

        Raises
        ------
        HybridDeletionError : position out of range or already deleted (state unchanged).
        """
        p = int(position)
        if not (0 <= p < self.T):
            raise HybridDeletionError(f"position {p} outside [0, {self.T})")
        if not self.keep[p]:
            raise HybridDeletionError(f"position {p} was already deleted")
        rec = ForgetRecord(position=p)
        saved = {key: copy.deepcopy(g) for key, g in self.gates.items() if p < self.starts[key[1]]}
        try:
            for (h, j), g in list(self.gates.items()):
                if p >= self.starts[j]:
                    continue
                tid = next(t for t, q in self._pos_of_id[(h, j)].items() if q == p)
                if len(np.asarray(g.ids)) - 1 < self.thr:
                    del self.gates[(h, j)]
                    rec.warmup_gates.append((h, j))
                else:
                    rec.receipts.append(g.forget(tid))
                    rec.certified_gates.append((h, j))
        except Exception as exc:  # restore every gate touched so far: all-or-nothing
            self.gates.update(saved)
            raise HybridDeletionError(f"forgetting position {p} failed: {exc}") from exc
        self.keep[p] = False
        return rec
