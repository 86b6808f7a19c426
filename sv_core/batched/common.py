"""Shared pieces of the batched SVDD gate (:mod:`sv_core.batched`): its error type, the warm-up
size, the box check, the problem layout — a batch of P Gram matrices, each shared by J masked
problems — the batch's RBF Gram matrices with an analytic backward (`rbf_gram`, compiled or torch; reference
``sv_core.kernels.torch_kernel``) and the optional compiled loops ``sv_core._batchfast`` (``sv_core/_batchfast.c``,
built by ``setup.py``; the torch paths are their references)."""
from __future__ import annotations

import importlib
import math
import types

import torch

from sv_core.calibrate import warmup_size

batchfast: types.ModuleType | None
try:
    batchfast = importlib.import_module("sv_core._batchfast")
except ImportError:  # pragma: no cover - optional, built by setup.py
    batchfast = None
#: the interface version these modules speak (``BATCHFAST_ABI`` in the C file); a stale build is ignored
ABI = 5
if batchfast is not None and getattr(batchfast, "ABI", None) != ABI:  # pragma: no cover
    batchfast = None


def compiled_batch_available() -> bool:
    """Whether the compiled loops ``sv_core._batchfast`` are built (``setup.py build_ext``)."""
    return batchfast is not None


def compiled_build() -> dict:
    """What this process runs: ``{"built": bool, "openmp": bool}`` - whether ``sv_core._batchfast``
    is built, and whether it splits a batch over the OpenMP team (torch's runtime) rather than
    POSIX helper threads."""
    return {"built": batchfast is not None, "openmp": bool(getattr(batchfast, "OPENMP", 0))}


def compiled_threads() -> int:
    """Threads the compiled loops split a batch over: torch's intra-op thread count (one in the
    deterministic training mode). Problems of different Gram matrices are independent and each is
    computed by the same loop, so the result does not depend on it."""
    return max(1, int(torch.get_num_threads()))


def any_true(t: torch.Tensor) -> bool:
    """``bool(t.any())`` for a bool tensor, read as the maximum of its bytes: torch's bool reduction
    takes 20-60 us on a CPU tensor of a few thousand entries and the byte maximum about 4 us (measured
    here, 1 thread), and one training step of the SV layer makes several such checks."""
    if t.dtype != torch.bool:
        raise TypeError(f"any_true takes a bool tensor, got {t.dtype}")
    return t.numel() > 0 and bool(t.view(torch.uint8).max())


def compiled_applicable(K: torch.Tensor) -> bool:
    """The compiled loops are built and take ``K``: a CPU float32 / float64 tensor."""
    return batchfast is not None and K.device.type == "cpu" and K.dtype in (torch.float32, torch.float64)


class BatchedGateError(ValueError):
    """Bad input to the batched gate (shapes, dtypes, box C, masks)."""


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def warmup_threshold(C: float) -> int:
    """Smallest number of keys for which the gate is solved: ``ceil(1/C) + 2`` (SPEC §1);
    `sv_core.calibrate.warmup_size` with a typed error for a non-positive C."""
    if not (C > 0):
        raise BatchedGateError(f"box C must be positive, got {C!r}")
    return warmup_size(C)


def check_box(C: float) -> float:
    C = float(C)
    if not (C > 0) or not math.isfinite(C):
        raise BatchedGateError(f"box C must be a positive finite number, got {C!r}")
    return C


# --------------------------------------------------------------------------------------------
# shapes: a batch of P Gram matrices, each shared by J nested / masked problems
# --------------------------------------------------------------------------------------------
#
# Every function below takes K of shape (P, n, n) and masks of shape (P, n) (one problem per
# Gram) or (P, J, n) (J problems per Gram, e.g. the nested prefixes of one (sequence, head) in
# the causal layer). Problem j of Gram p is the principal block of K[p] on mask[p, j]. Sharing
# the Gram means one batched mat-mat product per FISTA step instead of J mat-vec products.


def as_problems(K: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """Validate shapes; return the mask as bool (P, J, n) and whether it was 2-D."""
    if not isinstance(K, torch.Tensor) or not isinstance(mask, torch.Tensor):
        raise BatchedGateError("K and mask must be torch tensors")
    if K.dim() != 3 or K.shape[-1] != K.shape[-2]:
        raise BatchedGateError(f"K must have shape (P, n, n), got {tuple(K.shape)}")
    if not K.is_floating_point():
        raise BatchedGateError(f"K must be a floating tensor, got {K.dtype}")
    P, n, _ = K.shape
    flat = mask.dim() == 2
    m3 = mask.unsqueeze(1) if flat else mask
    if m3.dim() != 3 or m3.shape[0] != P or m3.shape[-1] != n:
        raise BatchedGateError(
            f"mask must have shape (P, n) or (P, J, n) with P={P}, n={n}; got {tuple(mask.shape)}"
        )
    return m3.to(device=K.device, dtype=torch.bool), flat


def kmul(K: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """``(K[p] @ Y[p, j])`` for Y (P, J, n) -> (P, J, n) in one batched mat-mat product."""
    return torch.matmul(Y, K.transpose(-1, -2))


# --------------------------------------------------------------------------------------------
# the Gram matrices of the batch, with an analytic backward
# --------------------------------------------------------------------------------------------


class _RBFGram(torch.autograd.Function):
    """``K = exp(-max(D, 0) / sigma^2)``, ``D_ij = |x_i|^2 + |x_j|^2 - 2 x_i . x_j`` (one batched
    ``baddbmm``, the rest in place); backward ``dL/dD = -dL/dK * K / sigma^2`` where ``D >= 0`` (the
    clamp's pass-through set, as autograd of the reference), ``dL/dX = 2 (rowsum(G) X - G X)`` with
    ``G = dL/dD + dL/dD^T``: three full-size passes each way instead of about a dozen; with
    ``compiled`` the backward is one pass per row in ``sv_core._batchfast.gram_backward``."""

    @staticmethod
    def forward(ctx, X, sigma, compiled=False):
        lead, n, d = X.shape[:-2], X.shape[-2], X.shape[-1]
        Xf = X.reshape(-1, n, d)
        K, keep = gram_forward(Xf, sigma)
        ctx.sigma, ctx.lead_shape, ctx.compiled = sigma, X.shape, bool(compiled) and d >= 1
        ctx.save_for_backward(Xf, K, keep)
        return K.view(*lead, n, n)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gK):
        Xf, K, keep = ctx.saved_tensors
        return gram_backward(Xf, K, keep, gK, ctx.sigma, ctx.compiled).view(ctx.lead_shape), None, None


def gram_forward(Xf: torch.Tensor, sigma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward of `rbf_gram` without autograd: ``(K, keep)`` for Xf (P, n, d), K (P, n, n) and
    ``keep = D >= 0`` (the clamp's pass-through set) that `gram_backward` takes."""
    sq = (Xf * Xf).sum(-1)
    D = torch.baddbmm(sq.unsqueeze(-1) + sq.unsqueeze(-2), Xf, Xf.transpose(-1, -2), alpha=-2.0)
    keep = D >= 0
    return D.clamp_min_(0.0).mul_(-1.0 / (sigma * sigma)).exp_(), keep


def gram_backward(Xf: torch.Tensor, K: torch.Tensor, keep: torch.Tensor, gK: torch.Tensor, sigma: float,
                  compiled: bool) -> torch.Tensor:
    """``dL/dXf`` (P, n, d) from ``dL/dK`` (P, n, n) and the forward's ``Xf, K, keep`` (`gram_forward`):
    in the compiled loop when ``compiled`` (and built), else by batched torch operations."""
    ext = batchfast
    if compiled and ext is not None and Xf.shape[-1] >= 1:  # the same formulas, one pass per row (_gram_body.h)
        P, n, d = Xf.shape
        dX = Xf.new_empty(P, n, d)
        gKc = gK.reshape(K.shape).contiguous()
        ext.gram_backward(Xf.contiguous().numpy(), K.numpy(), keep.numpy(), gKc.numpy(), dX.numpy(), P, n, d,
                          sigma, Xf.dtype == torch.float64, compiled_threads())
        return dX
    G = (gK.reshape(K.shape) * K).masked_fill_(~keep, 0.0).mul_(-1.0 / (sigma * sigma))
    G = G + G.transpose(-1, -2)
    return torch.baddbmm(G.sum(-1, keepdim=True) * Xf, G, Xf, alpha=-1.0).mul_(2.0)


#: backends of `rbf_gram`'s backward
GRAM_BACKENDS = ("auto", "torch", "compiled")


def rbf_gram(X: torch.Tensor, sigma: float, backend: str = "auto") -> torch.Tensor:
    """RBF Gram matrices of a batch of key sets, differentiable: the value of
    ``sv_core.kernels.torch_kernel(X, X, sigma)`` (its reference; equal to rounding) with a
    hand-written backward (first-order autograd only).

    Parameters
    ----------
    X : tensor (..., n, d)
    sigma : float bandwidth
    backend : the backward's loops: "auto" (compiled for CPU float32 / float64 when
        ``sv_core._batchfast`` is built, else torch), "torch" (batched torch operations, the
        reference) or "compiled" (error when not applicable). The value is the same either way;
        the compiled gradient differs in summation order only and not with the thread count.

    Returns
    -------
    tensor (..., n, n)
    """
    if not isinstance(X, torch.Tensor) or X.dim() < 2 or not X.is_floating_point():
        raise BatchedGateError("X must be a floating tensor of shape (..., n, d)")
    if not (float(sigma) > 0) or not math.isfinite(float(sigma)):
        raise BatchedGateError(f"sigma must be a positive finite number, got {sigma!r}")
    if backend not in GRAM_BACKENDS:
        raise BatchedGateError(f"backend must be one of {GRAM_BACKENDS}, got {backend!r}")
    usable = compiled_applicable(X)
    if backend == "compiled" and not usable:
        raise BatchedGateError("the compiled Gram backward needs sv_core._batchfast built and a CPU float32/float64 X")
    return _RBFGram.apply(X, float(sigma), usable and backend != "torch")
