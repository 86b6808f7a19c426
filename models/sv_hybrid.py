"""Causal SV hybrid attention: chunk-frozen support-vector gate + dense local softmax path.

SPEC §1 "Causal hybrid layer" (preprint 000 §3.5, 001 §3.4):

* Chunk-frozen gate: the sequence is cut into chunks of length ``chunk``; queries in chunk
  ``[s, e)`` read the SVDD gate fit on the keys ``[0, s)`` (RBF kernel, bandwidth sigma, box C).
  In training every (batch, head, chunk) problem is solved at once by the batched approximate
  path (`sv_core.batched.batched_gate`: FISTA partition + ridged KKT solve, autograd).
* Local path: a query at t attends with softmax ``q.k / sqrt(d)`` over ``[0, t]``; prefix weights
  are multiplied by the gate alpha, current-chunk weights by 1, then renormalised.
* Warm-up: a prefix with fewer than ``ceil(1/C) + 2`` keys is read ungated (uniform alpha).
* Deletion (`ExactHybridMemory.forget`, :mod:`models.sv_hybrid_memory`): a token admitted to the
  long-range gate is removed by the exact fp64 decremental path (`sv_core.Gate.forget`) on the
  frozen keys - a certified fixed-C deletion; its current-chunk slot is masked and the local
  weights renormalised - direct cache deletion, no support-vector certificate.

LM configuration: chunk 64, C = 0.25, sigma = 2. Fast paths, each tested against its
reference: :class:`SVHybridAttention`.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from models.multihead import AttentionConfigError, MultiHeadIO
from models.sv_hybrid_fused import fused_applicable, fused_hybrid_attend
from models.sv_hybrid_memory import ExactHybridMemory, ForgetRecord, HybridDeletionError
from models.sv_hybrid_readout import (
    DENSE_READOUT_MIN_CHUNKS,
    chunk_starts,
    gate_rows,
    hybrid_attend,
    hybrid_attend_chunked,
    hybrid_attend_compiled,
    hybrid_attend_dense,
    hybrid_weights,
    prefix_masks,
)
from sv_core.batched import (
    FISTA_BACKENDS,
    KKT_SOLVERS,
    GateStats,
    batched_gate,
    gate_stats,
    rbf_gram,
    warmup_threshold,
)

__all__ = ["DENSE_READOUT_MIN_CHUNKS", "ExactHybridMemory", "ForgetRecord", "GateStats", "HybridDeletionError",
           "SVHybridAttention",
           "chunk_starts", "hybrid_attend", "hybrid_attend_chunked", "hybrid_attend_compiled", "hybrid_attend_dense",
           "hybrid_weights", "prefix_gate_batched", "prefix_gate_exact"]


# --------------------------------------------------------------------------------------------
# gate construction
# --------------------------------------------------------------------------------------------


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
    kkt_solver: str = "auto",
    fista_backend: str = "auto",
) -> tuple[torch.Tensor, GateStats]:
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
    kkt_solver : "auto" (default: compiled on CPU when built, else "cholesky"), "compiled",
        "cholesky" (Schur-complement path) or "lu" (the SPEC reference ``torch.linalg.solve``);
        see `sv_core.batched.ridged_kkt_solve`.
    fista_backend : "auto" (the compiled loop for CPU tensors when built), "torch" (reference)
        or "compiled"; see `sv_core.batched.fista_svdd`.

    Returns
    -------
    gate : tensor (B, H, n_chunks, T): ``gate[b, h, j, i] = alpha_j[i]`` for ``i < s_j``, else 0.
    stats : `GateStats`, detached diagnostics computed on first read (``active`` (G,), ``prefix``
        (G,), ``warmup`` (G,), ``fista_iterations``, ``max_box``, ``max_sum``).
    """
    B, H, T, d = k.shape
    starts = chunk_starts(T, chunk)
    nc = len(starts)
    if nc <= 1:
        return k.new_zeros(B, H, nc, T), GateStats(active=lambda: k.new_zeros(0), prefix=lambda: k.new_zeros(0),
                                                   warmup=lambda: k.new_zeros(0))
    n = starts[-1]
    kp = k[:, :, :n]
    # one Gram shared by the nested prefixes; rbf_gram = torch_kernel(kp, kp, sigma) with an analytic backward
    Kfull = rbf_gram(kp, sigma).reshape(B * H, n, n)
    mask = prefix_masks(B, H, starts, k.device, keep)
    res = batched_gate(Kfull, C, mask, iters=iters, tol=tol, ridge=ridge, fista_dtype=fista_dtype,
                       kkt_solver=kkt_solver, fista_backend=fista_backend)
    return gate_rows(res.alpha, B, H, T), gate_stats(res.S, res.E, mask, res.warmup, res.alpha, C,
                                                     res.fista.iterations)


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
    kkt_solver : "auto" (default: compiled on CPU when built, else "cholesky"), "compiled",
        "cholesky" (Schur-complement path) or "lu" (reference ``torch.linalg.solve``) for the
        ridged KKT solve.
    fused_readout : use a readout with a hand-written backward when no deletion mask is given
        (`hybrid_attend`: `hybrid_attend_compiled` on CPU when built, else `hybrid_attend_dense`
        for many chunks, else `hybrid_attend_chunked`);
        False: the reference ``hybrid_weights(...) @ v``.
    fista_backend : partition finder of the batched gate: "auto" (compiled loop on CPU when
        built), "torch" (reference) or "compiled".
    fused : run the gate and the readout as one autograd node when it applies
        (`models.sv_hybrid_fused`: no deletion mask, ``fused_readout``, the compiled backends, CPU
        float32 / float64): the same loops in the same order, the same bits as False (the unfused
        path, its reference), without the orchestration between them.

    Attributes
    ----------
    last_stats : mapping of diagnostics of the latest forward (`GateStats`, see `prefix_gate_batched`).

    Fast paths: the shared Gram of the prefixes is `sv_core.batched.rbf_gram` (reference
    `sv_core.torch_kernel`; hand-written backward, compiled loops on CPU tensors when
    ``sv_core._batchfast`` is built); the FISTA partition finder (with its step bound) and the ridged
    KKT solve (with its right-hand side and its backward) run as compiled loops on CPU tensors when
    ``sv_core._batchfast`` is built (``fista_backend="auto"``, ``kkt_solver="auto"``; references
    ``"torch"`` and ``"cholesky"`` / ``"lu"`` = ``torch.linalg.solve`` as in the SPEC; on CUDA the
    Schur-complement Cholesky solve); without a deletion mask the readout has a hand-written backward:
    compiled loops over each query's visible keys on CPU float32 / float64 tensors when
    ``sv_core._batchfast`` is built (`sv_core.batched.readout`), else chunk by chunk over the visible
    keys or over the whole score matrix when chunks are many (`models.sv_hybrid_readout`; reference
    `hybrid_weights` @ v, ``fused_readout=False``).
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
        kkt_solver: str = "auto",
        fused_readout: bool = True,
        fista_backend: str = "auto",
        fused: bool = True,
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
        if fista_backend not in FISTA_BACKENDS:
            raise AttentionConfigError(f"fista_backend must be one of {FISTA_BACKENDS}, got {fista_backend!r}")
        self.fista_backend = fista_backend
        self.fused = bool(fused)
        self.last_stats: Mapping = {}

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
            fista_backend=self.fista_backend,
        )
        return gate

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, d_model) [+ keep (B, T) bool] -> (B, T, d_model)."""
        q, k, v = self.io.split(x)
        # the head views are strided columns of the qkv projection; the Gram and the readout both
        # read rows, so each view is copied once here rather than once per reader
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        if self.fused and self.gate_mode == "batched" and self.fused_readout and fused_applicable(
                q, k, v, keep, self.kkt_solver, self.fista_backend):
            out = fused_hybrid_attend(q, k, v, self.chunk, self.C, self.sigma, self.fista_iters, self.fista_tol,
                                      self.ridge, self.fista_dtype, self.fista_backend)
            if out is not None:
                y, self.last_stats = out
                return self.io.merge(y)
        gate = self.compute_gate(k, keep)
        return self.io.merge(hybrid_attend(q, k, v, gate, self.chunk, keep, self.fused_readout))

    @torch.no_grad()
    def freeze(self, x: torch.Tensor) -> ExactHybridMemory:
        """Exact fp64 inference memory for one sequence ``x`` of shape (1, T, d_model) or
        (T, d_model), with maintained gates per chunk boundary (supports `forget`)."""
        if x.dim() == 2:
            x = x.unsqueeze(0)
        if x.shape[0] != 1:
            raise AttentionConfigError("freeze expects a single sequence")
        q, k, v = self.io.split(x)
        return ExactHybridMemory(q[0], k[0], v[0], self.chunk, self.C, self.sigma)
