"""Batched, approximate SVDD gate for training (no deletion certificate).

This is the *training* path of SPEC §1 ("Batched training path"; preprint 001, Appendix B): many
independent SVDD problems (one per sequence x head x chunk) are packed into one padded batch of
Gram matrices with a per-row validity mask and solved together.

Pipeline::

    K (P, n, n), mask (P, n) or (P, J, n)
      -> fista_svdd         accelerated projected gradient, no autograd (partition finder)
      -> partition_masks    margin S = {0 < a < C}, bound E = {a = C} (per row, tolerance tol)
      -> ridged_kkt_solve   bordered system M u = c with ridge on the margin diagonal,
                            torch.linalg.solve (reference), differentiable by autograd; or
                            solver="cholesky": the same system by the Schur complement of the
                            SPD margin block (batched Cholesky, analytic backward)
      -> validate_alpha     box / sum / padding violations (diagnostics, never raises)

`batched_gate` runs the whole pipeline and applies the warm-up rule (fewer than
``ceil(1/C) + 2`` valid keys: ungated uniform weights, flagged, no solve).

The SVDD dual (SPEC §1)::

    min_a  a^T K a - diag(K)^T a    s.t.  sum(a) = 1,  0 <= a_i <= C     (feasible iff n C >= 1)

The coefficients returned here are the exact solution of the *ridged* packed system, which is a
stabilised approximation of the SVDD optimum (typically 1e-3-level differences). They are never
used for deletion certificates; those come from the fp64 maintained solver (`sv_core.Gate`).

Every function accepts CPU or CUDA tensors of any floating dtype.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from sv_core.calibrate import warmup_size
from sv_core.kernels import torch_kernel  # noqa: F401  (re-exported for the models)

__all__ = [
    "BatchedGateError",
    "BatchedGateResult",
    "AlphaReport",
    "warmup_threshold",
    "lambda_max_upper",
    "fista_lipschitz",
    "project_capped_simplex",
    "fista_svdd",
    "FistaInfo",
    "partition_masks",
    "ridged_kkt_solve",
    "bordered_spd_solve",
    "bordered_matrix",
    "KKT_SOLVERS",
    "validate_alpha",
    "batched_gate",
]


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


def _check_C(C: float) -> float:
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


def _as_problems(K: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, bool]:
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


def _kmul(K: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """``(K[p] @ Y[p, j])`` for Y (P, J, n) -> (P, J, n) in one batched mat-mat product."""
    return torch.matmul(Y, K.transpose(-1, -2))


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
    m3, flat = _as_problems(K, mask)
    m = m3.to(K.dtype)
    v = m.clone()
    for _ in range(iters):
        w = _kmul(K, v) * m
        v = w / w.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    w = _kmul(K, v) * m
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

    Returns
    -------
    alpha_est : tensor of mask's shape, zero off the mask; or ``(alpha_est, FistaInfo)``.
    """
    m3, flat = _as_problems(K, mask)
    C = _check_C(C)
    if iters < 0:
        raise BatchedGateError(f"iters must be >= 0, got {iters}")
    if check_every < 1:
        raise BatchedGateError(f"check_every must be >= 1, got {check_every}")
    K = K.detach()
    m3 = m3.contiguous()  # an expanded (stride-0) mask sends every reduction down a slow path
    m = m3.to(K.dtype)
    diagK = torch.diagonal(K, dim1=-2, dim2=-1).unsqueeze(1)  # (P, 1, n)
    L = fista_lipschitz(K, m3, power_iters)  # (P, J)
    invL = (1.0 / L).unsqueeze(-1)
    a = m / m.sum(-1, keepdim=True).clamp_min(1.0)
    # K y is never formed directly: y is a linear combination of the last two iterates, so
    # K y = (1 + beta) K a_new - beta K a. One Gram product per step (the memory-bound part),
    # and the gradient at a_new - needed by the residual check - comes for free.
    Ka = _kmul(K, a)
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
        Ka_new = _kmul(K, a_new)
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
    C = _check_C(C)
    if tol is None:
        tol = 1e-3 * C
    mask = mask.to(device=alpha.device, dtype=torch.bool)
    E = mask & (alpha >= C - tol)
    S = mask & ~E & (alpha > tol)
    return S, E


# --------------------------------------------------------------------------------------------
# ridged bordered KKT solve (differentiable)
# --------------------------------------------------------------------------------------------


KKT_SOLVERS = ("lu", "cholesky")


def bordered_matrix(A: torch.Tensor, s: torch.Tensor, empty: torch.Tensor) -> torch.Tensor:
    """The full bordered matrix ``[[empty, s^T], [s, A]]`` of shape (..., m+1, m+1).

    ``empty`` puts a 1 in the corner of problems without a margin set, so that their system
    reads ``rho = c0`` (the reference formulation of `ridged_kkt_solve`).
    """
    top = torch.cat([empty.to(A.dtype).unsqueeze(-1), s], dim=-1).unsqueeze(-2)
    lower = torch.cat([s.unsqueeze(-1), A], dim=-1)
    return torch.cat([top, lower], dim=-2)


def _schur_solve(L, x1, d, s, empty, r0, rhs):
    """Solve ``[[empty, s^T], [s, A]] [r; y] = [r0; rhs]`` given ``A = L L^T``, ``x1 = A^{-1} s``
    and ``d = s^T x1`` (Schur complement ``-d`` of the zero corner):
    ``r = (s^T A^{-1} rhs - r0) / d``, ``y = A^{-1} rhs - r x1``; empty problems: ``r = r0``."""
    x2 = torch.cholesky_solve(rhs.unsqueeze(-1), L).squeeze(-1)
    r = torch.where(empty, r0, ((s * x2).sum(-1) - r0) / torch.where(empty, torch.ones_like(d), d))
    return r, x2 - r.unsqueeze(-1) * x1


class _BorderedSPDSolve(torch.autograd.Function):
    """Autograd wrapper of the Schur-complement solve (see `bordered_spd_solve`).

    The bordered matrix M is symmetric, so with ``u = M^{-1} c`` and upstream gradient
    ``g_u``: ``g_c = M^{-1} g_u`` (one more Cholesky solve with the saved factor) and
    ``g_M = -g_c u^T``, whose margin block is ``g_A = -g_alpha alpha^T``. The border (``s``,
    ``empty``) is constant.
    """

    @staticmethod
    def forward(ctx, A, L, s, c0, hc, empty):
        x1 = torch.cholesky_solve(s.unsqueeze(-1), L).squeeze(-1)
        d = (s * x1).sum(-1)
        rho, a = _schur_solve(L, x1, d, s, empty, c0, hc)
        ctx.save_for_backward(L, x1, d, s, empty, a)
        return rho, a

    @staticmethod
    def backward(ctx, g_rho, g_a):
        L, x1, d, s, empty, a = ctx.saved_tensors
        if g_rho is None:
            g_rho = torch.zeros_like(d)
        if g_a is None:
            g_a = torch.zeros_like(a)
        g_c0, g_hc = _schur_solve(L, x1, d, s, empty, g_rho, g_a)
        g_A = (-g_hc).unsqueeze(-1) * a.unsqueeze(-2) if ctx.needs_input_grad[0] else None
        return g_A, None, None, g_c0, g_hc, None


def bordered_spd_solve(
    A: torch.Tensor, s: torch.Tensor, c0: torch.Tensor, hc: torch.Tensor, empty: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Solve ``[[e, s^T], [s, A]] [rho; a] = [c0; hc]`` for SPD A by the Schur complement.

    Mathematically identical to ``torch.linalg.solve(bordered_matrix(A, s, empty), [c0; hc])``
    (the reference of `ridged_kkt_solve`): with ``A = L L^T`` (batched Cholesky),
    ``x1 = A^{-1} s``, ``x2 = A^{-1} hc``::

        rho = (s^T x2 - c0) / (s^T x1),   a = x2 - rho x1          (e = 0, s != 0)
        rho = c0,                         a = A^{-1} hc             (e = 1, empty margin)

    One Cholesky factorisation (m^3/3 flops against 2 m^3/3 for LU of the bordered matrix) and
    an analytic backward that reuses the factor. Problems whose A is not numerically positive
    definite make the whole batch fall back to the reference LU solve (autograd through
    ``torch.linalg.solve``).

    Parameters
    ----------
    A : tensor (..., m, m), symmetric positive definite (padding rows/columns: identity).
    s : tensor (..., m), 1 on margin slots, 0 on padding.
    c0 : tensor (...), first right-hand side entry.
    hc : tensor (..., m), remaining right-hand side (0 on padding).
    empty : bool tensor (...), problems without margin slots (``s == 0``).

    Returns
    -------
    rho : tensor (...)
    a : tensor (..., m)
    """
    L, info = torch.linalg.cholesky_ex(A.detach())
    if bool((info != 0).any()):
        M = bordered_matrix(A, s, empty)
        c = torch.cat([c0.unsqueeze(-1), hc], dim=-1).unsqueeze(-1)
        u = torch.linalg.solve(M, c).squeeze(-1)
        return u[..., 0], u[..., 1:]
    return _BorderedSPDSolve.apply(A, L, s, c0, hc, empty)


def _pack_margin(S: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Indices of the margin slots packed to the front (padded to m = max |S|), their validity
    mask and m. S : bool (..., n) -> order (..., m) long, sb (..., m) bool."""
    m = int(S.sum(-1).max()) if S.numel() else 0
    order = torch.argsort((~S).to(torch.int8), dim=-1, stable=True)[..., :m]
    return order, S.gather(-1, order), m


def _packed_solve_lu(K, S, h, c0, empty, ridge):
    """Reference: gather K_SS row- then column-wise for every (P, J) problem, build the full
    bordered matrix and call ``torch.linalg.solve`` (autograd through everything)."""
    P, J, n = S.shape
    dt = K.dtype
    order, sb, m = _pack_margin(S)  # (P, J, m)
    s = sb.to(dt)
    hc = h.gather(-1, order) * s
    pair = sb.unsqueeze(-1) & sb.unsqueeze(-2)
    rows = torch.gather(
        K.unsqueeze(1).expand(P, J, n, n), 2, order.unsqueeze(-1).expand(P, J, m, n)
    )
    Kc = torch.gather(rows, 3, order.unsqueeze(-2).expand(P, J, m, m))  # (P, J, m, m)
    block = (2.0 * Kc).masked_fill(~pair, 0.0) + torch.diag_embed(ridge * s + (1.0 - s))
    M = bordered_matrix(block, s, empty)  # (P, J, m+1, m+1)
    c = torch.cat([c0.unsqueeze(-1), hc], dim=-1).unsqueeze(-1)  # (P, J, m+1, 1)
    u = torch.linalg.solve(M, c).squeeze(-1)
    alpha = torch.zeros(P, J, n, dtype=dt, device=K.device).scatter(-1, order, u[..., 1:] * s)
    return alpha, u[..., 0]


def _packed_solve_cholesky(K, S, h, c0, empty, ridge):
    """Fast path for one problem slot: S, h (P, n), c0, empty (P,). One flat gather of K_SS
    (its backward is a single scatter_add into (P, n*n)), then `bordered_spd_solve`."""
    P, n = S.shape
    dt = K.dtype
    order, sb, m = _pack_margin(S)  # (P, m)
    if m == 0:
        return torch.zeros(P, n, dtype=dt, device=K.device), c0
    s = sb.to(dt)
    hc = h.gather(-1, order) * s
    flat_idx = (order.unsqueeze(-1) * n + order.unsqueeze(-2)).reshape(P, m * m)
    Kc = K.reshape(P, n * n).gather(1, flat_idx).view(P, m, m)
    A = Kc * ((2.0 * s).unsqueeze(-1) * s.unsqueeze(-2))  # 2 K_SS, zero on padded pairs
    A.diagonal(dim1=-2, dim2=-1).add_(ridge * s + (1.0 - s))
    rho, a_packed = bordered_spd_solve(A, s, c0, hc, empty)
    alpha = torch.zeros(P, n, dtype=dt, device=K.device).scatter(-1, order, a_packed * s)
    return alpha, rho


def ridged_kkt_solve(
    K: torch.Tensor,
    C: float,
    S_mask: torch.Tensor,
    E_mask: torch.Tensor,
    ridge: float = 1e-3,
    mask: torch.Tensor | None = None,
    solver: str = "lu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Solve the bordered KKT systems of fixed partitions (SPEC §1, 001 eq. 7), autograd-ready.

    For each problem with margin set S and bound set E::

        M~ = [[0, 1_S^T], [1_S, 2 K_SS + ridge I_S]],   u = [rho; alpha_S],
        c  = [1 - |E| C;  diag(K)_S - 2 C K_SE 1]

    The margin indices of every problem are packed to the front and all systems padded to the
    largest |S| (padding rows are identity, ``u = 0``), so the whole batch is one
    ``torch.linalg.solve`` call of size ``max|S| + 1``; autograd differentiates the solve, the
    gathers and the scatter back. (The "cholesky" path pads per problem slot j instead: one
    batched solve of size ``max_p |S_pj|`` for each j.) A problem with empty S cannot fix rho
    from the system; rho is then the midpoint of its KKT interval ``[max_R h_i, min_E h_i]``
    with ``h_i = K_ii - 2 C (K_{:,E} 1)_i``, also differentiable.

    Parameters
    ----------
    K : tensor (P, n, n)
    C : float box
    S_mask, E_mask : disjoint bool tensors (P, n) or (P, J, n).
    ridge : float, added to the margin diagonal (1e-3 in the seed).
    mask : optional bool tensor like S_mask, the valid keys; only used to pick the reserve set
        of empty-S problems (default: every slot outside S and E).
    solver : "lu" (default, the SPEC reference: the full bordered matrix through
        ``torch.linalg.solve``) or "cholesky" (fast path, same system: the Schur complement of
        the SPD margin block ``A = 2 K_SS + ridge I`` solved by batched Cholesky, with an
        analytic backward - see `bordered_spd_solve`; problems whose Cholesky fails fall back to
        the reference solve).

    Returns
    -------
    alpha : tensor shaped like S_mask: C on E, the solved alpha_S on S, 0 elsewhere.
    rho : tensor S_mask.shape[:-1]
    """
    S, flat = _as_problems(K, S_mask)
    E, _ = _as_problems(K, E_mask)
    if S.shape != E.shape:
        raise BatchedGateError("S_mask and E_mask must have the same shape")
    if bool((S & E).any()):
        raise BatchedGateError("S_mask and E_mask must be disjoint")
    C = _check_C(C)
    if solver not in KKT_SOLVERS:
        raise BatchedGateError(f"solver must be one of {KKT_SOLVERS}, got {solver!r}")
    P, J, n = S.shape
    dt = K.dtype
    e = E.to(dt)
    diagK = torch.diagonal(K, dim1=-2, dim2=-1).unsqueeze(1)  # (P, 1, n)
    has_E = bool(E.any())
    h = diagK - 2.0 * C * _kmul(K, e) if has_E else diagK.expand(P, J, n)  # (P, J, n)
    nE = e.sum(-1)
    empty = ~S.any(-1)

    # rho fallback for problems with empty S (value used only where empty is True).
    if bool(empty.any()):
        big = torch.finfo(dt).max / 8
        R = ~S & ~E
        if mask is not None:
            R = R & _as_problems(K, mask)[0]
        lowR = torch.where(R, h, torch.full_like(h, -big)).amax(-1)
        upE = torch.where(E, h, torch.full_like(h, big)).amin(-1)
        lowR_ok, upE_ok = lowR > -big / 2, upE < big / 2
        rho_fb = torch.where(
            lowR_ok & upE_ok,
            0.5 * (lowR + upE),
            torch.where(upE_ok, upE, torch.where(lowR_ok, lowR, torch.zeros_like(lowR))),
        )
        c0 = torch.where(empty, rho_fb, 1.0 - C * nE)
    else:
        c0 = 1.0 - C * nE

    if solver == "lu":
        alpha, rho = _packed_solve_lu(K, S, h, c0, empty, ridge)
    else:
        # one packed solve per problem slot j: nested prefixes have very different |S|, and
        # padding every slot to the global max |S| would waste up to (m / m_j)^3 of the work
        out = [_packed_solve_cholesky(K, S[:, j], h[:, j], c0[:, j], empty[:, j], ridge)
               for j in range(J)]
        alpha = torch.stack([o[0] for o in out], dim=1)
        rho = torch.stack([o[1] for o in out], dim=1)
    if has_E:
        alpha = alpha + C * e
    if flat:
        return alpha.squeeze(1), rho.squeeze(1)
    return alpha, rho


# --------------------------------------------------------------------------------------------
# validation & top level
# --------------------------------------------------------------------------------------------


@dataclass
class AlphaReport:
    """Constraint violations of coefficients (a diagnostic; never raises).

    Attributes
    ----------
    box_violation : tensor mask.shape[:-1], max over valid i of ``max(-alpha_i, alpha_i - C, 0)``
    sum_violation : tensor mask.shape[:-1], ``|sum_valid alpha - 1|``
    padding_mass : tensor mask.shape[:-1], ``max |alpha_i|`` over padded slots
    max_box, max_sum, max_padding : float maxima over the batch
    """

    box_violation: torch.Tensor
    sum_violation: torch.Tensor
    padding_mass: torch.Tensor
    max_box: float
    max_sum: float
    max_padding: float

    def ok(self, tol: float = 1e-6) -> bool:
        """All violations at most ``tol``."""
        return max(self.max_box, self.max_sum, self.max_padding) <= tol


def validate_alpha(alpha: torch.Tensor, C: float, mask: torch.Tensor) -> AlphaReport:
    """Report box, sum and padding violations of a batch of coefficient vectors.

    Parameters
    ----------
    alpha : tensor (..., n)
    C : float box
    mask : bool tensor (..., n), same shape.
    """
    C = _check_C(C)
    if alpha.shape != mask.shape:
        raise BatchedGateError(f"alpha {tuple(alpha.shape)} and mask {tuple(mask.shape)} differ")
    a = alpha.detach()
    mask = mask.to(device=a.device, dtype=torch.bool)
    zero = torch.zeros_like(a)
    if a.shape[-1] == 0:
        z = a.new_zeros(a.shape[:-1])
        return AlphaReport(z, (z - 1.0).abs(), z, 0.0, 1.0 if z.numel() else 0.0, 0.0)
    viol = torch.maximum(torch.maximum(-a, a - C), zero)
    box = torch.where(mask, viol, zero).amax(-1)
    sumv = (torch.where(mask, a, zero).sum(-1) - 1.0).abs()
    pad = torch.where(mask, zero, a.abs()).amax(-1)

    def _mx(t: torch.Tensor) -> float:
        return float(t.max()) if t.numel() else 0.0

    return AlphaReport(box, sumv, pad, _mx(box), _mx(sumv), _mx(pad))


@dataclass
class BatchedGateResult:
    """Output of `batched_gate` (tensors shaped like the mask, or its leading dims).

    Attributes
    ----------
    alpha : coefficients, differentiable w.r.t. K (warm-up problems: uniform, constant).
    rho : offsets, nan on warm-up problems (no gate, no score offset).
    S, E : bool, estimated margin / bound masks (False on warm-up problems).
    warmup : bool, problems served ungated (fewer than ``warmup_threshold(C)`` keys).
    fista : FistaInfo
    report : AlphaReport of the returned alpha
    alpha_fista : the FISTA estimate (detached) the partition came from.
    """

    alpha: torch.Tensor
    rho: torch.Tensor
    S: torch.Tensor
    E: torch.Tensor
    warmup: torch.Tensor
    fista: FistaInfo
    report: AlphaReport
    alpha_fista: torch.Tensor

    @property
    def active_count(self) -> torch.Tensor:
        """|S u E| per problem."""
        return (self.S | self.E).sum(-1)


def batched_gate(
    K: torch.Tensor,
    C: float,
    mask: torch.Tensor,
    iters: int = 80,
    tol: float | None = None,
    ridge: float = 1e-3,
    partition_tol: float | None = None,
    fista_dtype: torch.dtype | None = None,
    check_every: int = 2,
    kkt_solver: str = "lu",
) -> BatchedGateResult:
    """Batched approximate SVDD gate: FISTA partition, ridged KKT solve, diagnostics.

    Problems with fewer than ``warmup_threshold(C) = ceil(1/C) + 2`` valid keys are not solved:
    they get uniform weights ``mask / n_valid`` (rho = nan) and ``warmup = True``.

    Parameters
    ----------
    K : tensor (P, n, n), Gram matrices (may require grad).
    C : float box.
    mask : bool tensor (P, n) or (P, J, n) (J problems sharing each Gram).
    iters, tol, check_every : FISTA settings (see `fista_svdd`).
    ridge : margin-diagonal ridge of the KKT solve.
    partition_tol : tolerance of `partition_masks`.
    fista_dtype : dtype of the FISTA partition finder (default: K's dtype); e.g.
        ``torch.float32`` for the seed's single-precision finder under a float64 solve.
    kkt_solver : "lu" (reference, ``torch.linalg.solve``) or "cholesky" (Schur-complement fast
        path); see `ridged_kkt_solve`.

    Returns
    -------
    BatchedGateResult
    """
    m3, flat = _as_problems(K, mask)
    C = _check_C(C)
    nvalid = m3.sum(-1)
    warm = nvalid < warmup_threshold(C)
    solve_mask = m3 & ~warm.unsqueeze(-1)
    Kf = K.detach() if fista_dtype is None else K.detach().to(fista_dtype)
    a_est, info = fista_svdd(
        Kf, C, solve_mask, iters=iters, tol=tol, check_every=check_every, return_info=True
    )
    S, E = partition_masks(a_est.to(K.dtype), C, solve_mask, partition_tol)
    alpha, rho = ridged_kkt_solve(K, C, S, E, ridge=ridge, mask=solve_mask, solver=kkt_solver)
    uniform = m3.to(K.dtype) / nvalid.clamp_min(1).to(K.dtype).unsqueeze(-1)
    alpha = torch.where(warm.unsqueeze(-1), uniform, alpha)
    rho = torch.where(warm, torch.full_like(rho, float("nan")), rho)
    report = validate_alpha(alpha, C, m3)
    if flat:
        alpha, rho, S, E, warm, a_est = (t.squeeze(1) for t in (alpha, rho, S, E, warm, a_est))
        report = AlphaReport(
            report.box_violation.squeeze(1), report.sum_violation.squeeze(1),
            report.padding_mass.squeeze(1), report.max_box, report.max_sum, report.max_padding,
        )
    return BatchedGateResult(
        alpha=alpha, rho=rho, S=S, E=E, warmup=warm, fista=info, report=report, alpha_fista=a_est
    )
