"""FISTA partition finder of the batched SVDD gate (:mod:`sv_core.batched`): Lipschitz bound,
capped-simplex projection, the accelerated projected-gradient loop (torch reference, and the
compiled loop ``sv_core._batchfast.fista`` for CPU tensors), and the margin / bound partition."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from sv_core.batched import common as batched_common
from sv_core.batched.common import BatchedGateError, as_problems, check_box, compiled_applicable, kmul

FISTA_BACKENDS = ("auto", "torch", "compiled")

# --------------------------------------------------------------------------------------------
# Lipschitz constant
# --------------------------------------------------------------------------------------------


def lambda_max_upper(
    K: torch.Tensor, mask: torch.Tensor, iters: int = 4, nonnegative: bool | None = None
) -> torch.Tensor:
    """Upper estimate of the largest eigenvalue of every masked principal block.

    Batched power iteration from the all-ones vector on the valid block. For entry-wise
    non-negative K (any RBF Gram) the Collatz-Wielandt ratio ``max_i (K v)_i / v_i`` of the
    positive iterate is a *guaranteed* upper bound of lambda_max, so ``L = 2 * bound`` is a safe
    FISTA step. For other K the Rayleigh quotient is inflated by 10 % as a safety margin.

    Parameters
    ----------
    K : tensor (P, n, n), symmetric PSD on the valid blocks.
    mask : bool tensor (P, n) or (P, J, n).
    iters : power-iteration steps.
    nonnegative : whether K is entry-wise non-negative (None: checked here).

    Returns
    -------
    tensor of shape mask.shape[:-1], at least 1e-12.
    """
    m3, flat = as_problems(K, mask)
    m = m3.to(K.dtype)
    v = m.clone()
    for _ in range(iters):
        w = kmul(K, v) * m
        v = w / w.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    w = kmul(K, v) * m
    if nonnegative is None:
        nonnegative = bool((K >= 0).all())
    if nonnegative:
        ratio = torch.where(m3 & (v > 1e-12), w / v.clamp_min(1e-30), torch.zeros_like(w))
        lam = ratio.amax(dim=-1)
    else:
        lam = 1.1 * (v * w).sum(-1) / (v * v).sum(-1).clamp_min(1e-30)
    lam = lam.clamp_min(1e-12)
    return lam.squeeze(1) if flat else lam


def fista_lipschitz(K: torch.Tensor, mask: torch.Tensor, power_iters: int | None = None) -> torch.Tensor:
    """FISTA's Lipschitz constant ``L = 2 * lambda_max_upper(K, mask)`` (shared by the torch and
    MLX finders). ``power_iters`` defaults to 1 for entry-wise non-negative K (the
    Collatz-Wielandt bound is guaranteed after any number of steps; one step is within a few
    per cent on RBF Grams) and 4 otherwise. Returns a tensor of shape mask.shape[:-1]."""
    nonneg = bool((K >= 0).all())
    if power_iters is None:
        power_iters = 1 if nonneg else 4
    return 2.0 * lambda_max_upper(K, mask, iters=power_iters, nonnegative=nonneg)


# --------------------------------------------------------------------------------------------
# capped-simplex projection
# --------------------------------------------------------------------------------------------


def project_capped_simplex(
    z: torch.Tensor,
    C: float,
    mask: torch.Tensor,
    max_iter: int = 60,
    newton: bool = True,
    tau0: torch.Tensor | None = None,
    return_tau: bool = False,
):
    """Euclidean projection of each row onto ``{a : sum a = 1, 0 <= a <= C, a = 0 off mask}``.

    The solution is ``a_i = clip(z_i - tau, 0, C)`` for the shift tau solving
    ``f(tau) = sum_mask clip(z_i - tau, 0, C) = 1``. f is continuous, piecewise linear and
    non-increasing, so tau is bracketed by ``[min z - C, max z]`` and found by bisection on the
    shift. With ``newton=True`` (default) each bisection step is replaced by the exact solve of
    the current linear piece (``tau + (f(tau) - 1) / |F(tau)|``, F the free set) whenever that
    point lies strictly inside the bracket - a safeguarded Newton-bisection that terminates
    exactly (to rounding) once it reaches the right piece, usually in 2-4 steps, and in 1 when
    warm-started from the previous FISTA step's shift (``tau0``). The bracket is kept, so the
    worst case is plain bisection. Rows stop at ``|f - 1| <= 16 eps`` or a collapsed bracket.

    Rows with ``n_valid * C < 1`` are infeasible; they come back with every valid entry at C
    (sum < 1) - callers apply the warm-up rule before relying on them.

    Parameters
    ----------
    z : tensor (..., n)
    C : float box
    mask : bool tensor (..., n), same shape as z.
    max_iter : maximum bracketing steps.
    newton : use exact piecewise-linear steps inside the bracket (False: pure bisection).
    tau0 : optional tensor z.shape[:-1], warm start for the shift.
    return_tau : also return the shift (same shape as z.shape[:-1]).

    Returns
    -------
    a : tensor (..., n), zero off the mask; and tau when ``return_tau``.
    """
    C = float(C)
    dt = z.dtype
    big = torch.finfo(dt).max / 8
    eps = 16.0 * torch.finfo(dt).eps
    mask = mask.to(torch.bool)
    valid_any = mask.any(dim=-1)
    zmax = torch.where(mask, z, torch.full_like(z, -big)).amax(-1)
    zmin = torch.where(mask, z, torch.full_like(z, big)).amin(-1)
    zmax = torch.where(valid_any, zmax, torch.zeros_like(zmax))
    zmin = torch.where(valid_any, zmin, torch.zeros_like(zmin))
    # Padded slots sit far below every valid value: they clip to 0 for every tau in the bracket.
    zz = torch.where(mask, z, (zmin - 4.0 * C - 1.0 - (zmax - zmin)).unsqueeze(-1).expand_as(z))
    lo = zmin - C  # f(lo) = n_valid * C >= 1
    hi = zmax.clone()  # f(hi) = 0
    if tau0 is not None:
        tau = torch.where((tau0 > lo) & (tau0 < hi), tau0.to(dt), 0.5 * (lo + hi))
    else:
        tau = 0.5 * (lo + hi)
    done = ~valid_any
    a = torch.zeros_like(z)
    for _ in range(max_iter):
        d = zz - tau.unsqueeze(-1)
        a = d.clamp(0.0, C)
        err = a.sum(-1) - 1.0
        scale = eps * (1.0 + tau.abs())
        done = done | (err.abs() <= eps) | ((hi - lo) <= scale)
        if newton:
            nf = ((d > 0) & (d < C)).sum(-1)
            step = err / nf.clamp_min(1).to(dt)
            # the exact step of this linear piece is below rounding: tau is the root
            done = done | ((nf > 0) & (step.abs() <= scale))
        if bool(done.all()):
            break
        above = err > 0  # too much mass: the shift must grow
        lo = torch.where(above, tau, lo)
        hi = torch.where(above, hi, tau)
        nxt = 0.5 * (lo + hi)
        if newton:
            tn = tau + step
            nxt = torch.where((nf > 0) & (tn > lo) & (tn < hi), tn, nxt)
        tau = torch.where(done, tau, nxt)
    a = a * mask.to(dt)
    return (a, tau) if return_tau else a


# --------------------------------------------------------------------------------------------
# FISTA partition finder
# --------------------------------------------------------------------------------------------


@dataclass
class FistaInfo:
    """Diagnostics of one batched FISTA run.

    Attributes
    ----------
    iterations : int, iterations actually run (<= iters when early exit triggered).
    residual : tensor mask.shape[:-1], projected-gradient residual
        ``max_i |a - P(a - grad/L)|`` at the last check (``nan`` when no check ran).
    converged : bool, every problem below ``tol`` at the last check.
    lipschitz : tensor mask.shape[:-1], the L used.
    """

    iterations: int
    residual: torch.Tensor
    converged: bool
    lipschitz: torch.Tensor


@torch.no_grad()
def fista_svdd(
    K: torch.Tensor,
    C: float,
    mask: torch.Tensor,
    iters: int = 80,
    tol: float | None = None,
    check_every: int = 2,
    return_info: bool = False,
    power_iters: int | None = None,
    backend: str = "auto",
):
    """Estimate SVDD coefficients for a batch of masked problems by FISTA (001 Algorithm 1).

    ``L = 2 lambda_max(K)`` (power iteration); start ``a = mask / sum(mask)``; each step
    ``g = 2 K y - diag K``, ``a' = P(y - g / L)`` (capped-simplex projection on the mask),
    ``t' = (1 + sqrt(1 + 4 t^2)) / 2``, ``y = a' + (t - 1)/t' (a' - a)`` - the fixed momentum
    schedule of the seed. Improvement over the seed: with ``tol`` set, every ``check_every``
    iterations the projected-gradient (fixed-point) residual
    ``r = max_i |a - P(a - grad f(a) / L)|`` is computed and the loop exits once every problem
    has ``r < tol``. Projections are warm-started from the previous step's shift.

    Runs without autograd: the output is a partition estimate; gradients flow through
    `ridged_kkt_solve`.

    Parameters
    ----------
    K : tensor (P, n, n), symmetric PSD Gram matrices (entries outside the masks arbitrary).
    C : float, box (problems need ``n_valid * C >= 1``; others are returned but meaningless).
    mask : bool tensor (P, n) or (P, J, n), valid keys of each problem.
    iters : maximum iterations (80 in the seed's language-model runs).
    tol : early-exit tolerance on the projected-gradient residual, or None (fixed ``iters``).
    check_every : iterations between residual checks (each check costs one projection, no
        Gram product: the gradient at the iterate is carried along).
    return_info : also return a `FistaInfo`.
    power_iters : power-iteration steps of `lambda_max_upper` for the step size; default 1
        for an entry-wise non-negative K (any RBF Gram: the Collatz-Wielandt bound is then a
        guaranteed upper bound after any number of steps, and one step is within a few per cent
        of lambda_max), 4 otherwise.
    backend : "torch" (the reference: the loop above over the whole padded batch, any device),
        "compiled" (``sv_core._batchfast``, CPU float32/float64 tensors: the same loop per problem on
        its own keys, ``K a`` over the non-zero entries of ``a`` only, with ``tol`` in segments of
        ``check_every`` iterations and the same lockstep stop; equal to the reference to rounding) or
        "auto" (compiled when built and applicable, else torch).

    Returns
    -------
    alpha_est : tensor of mask's shape, zero off the mask; or ``(alpha_est, FistaInfo)``.
    """
    m3, flat = as_problems(K, mask)
    C = check_box(C)
    if iters < 0:
        raise BatchedGateError(f"iters must be >= 0, got {iters}")
    if check_every < 1:
        raise BatchedGateError(f"check_every must be >= 1, got {check_every}")
    if backend not in FISTA_BACKENDS:
        raise BatchedGateError(f"backend must be one of {FISTA_BACKENDS}, got {backend!r}")
    K = K.detach()
    m3 = m3.contiguous()  # an expanded (stride-0) mask sends every reduction down a slow path
    compiled_ok = compiled_applicable(K)
    if backend == "compiled" and not compiled_ok:
        raise BatchedGateError("the compiled FISTA loop needs sv_core._batchfast built and CPU float32/float64 K")
    if backend != "torch" and compiled_ok:
        L0 = None if power_iters is None else fista_lipschitz(K, m3, power_iters)
        if tol is None:
            a, L = _fista_compiled(K, m3, L0, C, int(iters))
            residual = torch.full(m3.shape[:-1], float("nan"), dtype=K.dtype, device=K.device)
            done, converged = int(iters), False
        else:
            a, L, residual, done, converged = _fista_compiled_tol(K, m3, L0, C, int(iters), float(tol),
                                                                  int(check_every))
        if flat:
            a, residual, L = a.squeeze(1), residual.squeeze(1), L.squeeze(1)
        if return_info:
            return a, FistaInfo(iterations=done, residual=residual, converged=converged, lipschitz=L)
        return a
    L = fista_lipschitz(K, m3, power_iters)  # (P, J)
    m = m3.to(K.dtype)
    diagK = torch.diagonal(K, dim1=-2, dim2=-1).unsqueeze(1)  # (P, 1, n)
    invL = (1.0 / L).unsqueeze(-1)
    a = m / m.sum(-1, keepdim=True).clamp_min(1.0)
    # K y is never formed directly: y is a linear combination of the last two iterates, so
    # K y = (1 + beta) K a_new - beta K a. One Gram product per step (the memory-bound part),
    # and the gradient at a_new - needed by the residual check - comes for free.
    Ka = kmul(K, a)
    Ky = Ka
    y = a
    t = 1.0
    tau = None
    residual = torch.full(m3.shape[:-1], float("nan"), dtype=K.dtype, device=K.device)
    converged = False
    done = 0
    for k in range(1, iters + 1):
        z = y - (2.0 * Ky - diagK) * invL
        a_new, tau = project_capped_simplex(z, C, m3, tau0=tau, return_tau=True)
        Ka_new = kmul(K, a_new)
        t_new = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * t * t))
        beta = (t - 1.0) / t_new
        y = a_new + beta * (a_new - a)
        Ky = Ka_new + beta * (Ka_new - Ka)
        a, Ka, t = a_new, Ka_new, t_new
        done = k
        if tol is not None and (k % check_every == 0 or k == iters):
            z = a - (2.0 * Ka - diagK) * invL
            step = project_capped_simplex(z, C, m3, tau0=tau)
            residual = (step - a).abs().amax(-1)
            if bool((residual < tol).all()):
                converged = True
                break
    if flat:
        a, residual, L = a.squeeze(1), residual.squeeze(1), L.squeeze(1)
    if return_info:
        return a, FistaInfo(iterations=done, residual=residual, converged=converged, lipschitz=L)
    return a


def _fista_compiled(K: torch.Tensor, m3: torch.Tensor, L: torch.Tensor | None, C: float, iters: int,
                    stop_when_fixed: bool = True, sparse: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the compiled loop on CPU tensors K (P, n, n), mask (P, J, n) bool; returns the estimate
    (P, J, n) and L (P, J). ``L`` (P, J): the Lipschitz bounds (step 1/L); None: computed in the loop by the
    bound of `fista_lipschitz` (one power step, for entry-wise non-negative K; K with a negative
    entry gets the torch bound). ``stop_when_fixed``: leave a problem at a bit-for-bit fixed
    point (same result, see the C). ``sparse``: form ``K a'`` over the non-zero entries of the
    iterate only, for a finite block (same result, see ``kmul`` in the C); False: every column."""
    P, J, n = m3.shape
    Kc = K.contiguous()
    mk = m3.to(torch.uint8).contiguous()
    out = torch.empty(P, J, n, dtype=K.dtype)
    ext = batched_common.batchfast
    assert ext is not None
    args = (Kc.numpy(), mk.numpy())
    rest = (P, J, n, float(C), int(iters), K.dtype == torch.float64, bool(stop_when_fixed),
            batched_common.compiled_threads())
    if L is None:
        L = torch.empty(P, J, dtype=K.dtype)
        if ext.fista(*args, L.numpy(), out.numpy(), *rest, True, bool(sparse)) == 0:
            return out, L
        L = fista_lipschitz(K, m3, 4)  # a negative entry: the Rayleigh bound (power_iters' default then)
    il = (1.0 / L).to(K.dtype).contiguous()
    ext.fista(*args, il.numpy(), out.numpy(), *rest, False, bool(sparse))
    return out, L


def _fista_compiled_tol(K: torch.Tensor, m3: torch.Tensor, L: torch.Tensor | None, C: float, iters: int, tol: float,
                        check_every: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, bool]:
    """The compiled loop with the reference's early exit: every problem advances in segments of
    ``check_every`` iterations (``_batchfast.fista_segment``, each problem's state kept between
    segments), and after each segment - the reference's checkpoints ``k % check_every == 0`` or
    ``k == iters`` - the loop stops once every problem's projected-gradient residual is below ``tol``.
    So every problem stops at the same iteration as in the reference (lockstep), its iterate equal
    to the reference's to rounding. Returns the estimate (P, J, n), L (P, J), the residual at the
    last check (P, J), the iterations run and whether it converged."""
    if iters == 0:  # no iteration, no check
        a, L = _fista_compiled(K, m3, L, C, 0)
        return a, L, torch.full(m3.shape[:-1], float("nan"), dtype=K.dtype), 0, False
    P, J, n = m3.shape
    Kc = K.contiguous()
    mk = m3.to(torch.uint8).contiguous()
    ext = batched_common.batchfast
    assert ext is not None
    dt = K.dtype
    out = torch.empty(P, J, n, dtype=dt)
    sa, sKa, sz = (torch.empty(P, J, n, dtype=dt) for _ in range(3))
    stau, sres = torch.empty(P, J, dtype=dt), torch.empty(P, J, dtype=dt)
    sint = torch.zeros(P, J, 2, dtype=torch.int32)
    own = L is None
    lip = torch.empty(P, J, dtype=dt) if L is None else torch.reciprocal(L).to(dt).contiguous()
    state = (sa.numpy(), sKa.numpy(), sz.numpy(), stau.numpy(), sres.numpy(), sint.numpy())
    k, converged = 0, False
    while k < iters:
        k1 = min(iters, (k // check_every + 1) * check_every)
        code = ext.fista_segment(Kc.numpy(), mk.numpy(), lip.numpy(), out.numpy(), *state, P, J, n, float(C), k, k1,
                                 dt == torch.float64, True, batched_common.compiled_threads(), own, True)
        if code:  # a negative entry (only checked at the start): the Rayleigh bound, given to the loop
            own = False
            L = fista_lipschitz(K, m3, 4)
            lip = torch.reciprocal(L).to(dt).contiguous()
            continue
        k = k1
        if bool((sres < tol).all()):
            converged = True
            break
    return out, lip if L is None else L, sres, k, converged


def partition_masks(
    alpha: torch.Tensor, C: float, mask: torch.Tensor, tol: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Margin and bound masks from (estimated) coefficients.

    ``E = {alpha >= C - tol}``, ``S = {tol < alpha < C - tol}`` (both inside the mask); the rest
    of the mask is the reserve R.

    Parameters
    ----------
    alpha : tensor (..., n)
    C : float box
    mask : bool tensor (..., n)
    tol : float, default ``1e-3 * C`` (a fraction of the box).

    Returns
    -------
    S_mask, E_mask : bool tensors (..., n)
    """
    C = check_box(C)
    if tol is None:
        tol = 1e-3 * C
    mask = mask.to(device=alpha.device, dtype=torch.bool)
    E = mask & (alpha >= C - tol)
    S = mask & ~E & (alpha > tol)
    return S, E
