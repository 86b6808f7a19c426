"""Batched, approximate SVDD gate for training (no deletion certificate).

This is the *training* path of SPEC §1 ("Batched training path"; preprint 001, Appendix B): many
independent SVDD problems (one per sequence x head x chunk) are packed into one padded batch of
Gram matrices with a per-row validity mask and solved together.

Pipeline::

    K (G, n, n), mask (G, n)
      -> fista_svdd         accelerated projected gradient, no autograd (partition finder)
      -> partition_masks    margin S = {0 < a < C}, bound E = {a = C} (per row, tolerance tol)
      -> ridged_kkt_solve   bordered system M u = c with ridge on the margin diagonal,
                            torch.linalg.solve, differentiable by autograd
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
from dataclasses import dataclass, field

import torch

__all__ = [
    "BatchedGateError",
    "BatchedGateResult",
    "AlphaReport",
    "warmup_threshold",
    "torch_rbf",
    "lambda_max_upper",
    "project_capped_simplex",
    "fista_svdd",
    "FistaInfo",
    "partition_masks",
    "ridged_kkt_solve",
    "validate_alpha",
    "batched_gate",
]


class BatchedGateError(ValueError):
    """Bad input to the batched gate (shapes, dtypes, box C, masks)."""


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def warmup_threshold(C: float) -> int:
    """Smallest number of keys for which the gate is solved: ``ceil(1/C) + 2`` (SPEC §1).

    A small epsilon guards against ``1/C`` landing just above an integer in floating point
    (``C = 0.25`` gives 4 + 2 = 6).
    """
    if not (C > 0):
        raise BatchedGateError(f"box C must be positive, got {C!r}")
    return int(math.ceil(1.0 / C - 1e-9)) + 2


def torch_rbf(A: torch.Tensor, B: torch.Tensor, sigma: float) -> torch.Tensor:
    """RBF Gram ``exp(-||a - b||^2 / sigma^2)`` with the squared distance clamped at 0.

    Uses ``sv_core.torch_kernel`` (the project's one kernel) when it is available, otherwise
    an identical private torch implementation.

    Parameters
    ----------
    A : tensor of shape (..., n, d)
    B : tensor of shape (..., m, d)
    sigma : float, bandwidth (not 2 sigma^2).

    Returns
    -------
    tensor of shape (..., n, m)
    """
    try:  # the lead's shared kernel, once it exists
        from sv_core import torch_kernel as _shared  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - depends on the lead's module
        _shared = None
    if _shared is not None:
        return _shared(A, B, sigma)
    return _private_torch_rbf(A, B, sigma)


def _private_torch_rbf(A: torch.Tensor, B: torch.Tensor, sigma: float) -> torch.Tensor:
    sq = (
        (A * A).sum(-1).unsqueeze(-1)
        + (B * B).sum(-1).unsqueeze(-2)
        - 2.0 * (A @ B.transpose(-1, -2))
    )
    return torch.exp(-sq.clamp_min(0.0) / (sigma * sigma))


def _check_problem(K: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if not isinstance(K, torch.Tensor) or not isinstance(mask, torch.Tensor):
        raise BatchedGateError("K and mask must be torch tensors")
    if K.dim() != 3 or K.shape[-1] != K.shape[-2]:
        raise BatchedGateError(f"K must have shape (G, n, n), got {tuple(K.shape)}")
    if not K.is_floating_point():
        raise BatchedGateError(f"K must be a floating tensor, got {K.dtype}")
    if tuple(mask.shape) != tuple(K.shape[:2]):
        raise BatchedGateError(
            f"mask must have shape (G, n) = {tuple(K.shape[:2])}, got {tuple(mask.shape)}"
        )
    return mask.to(device=K.device, dtype=torch.bool)


def _check_C(C: float) -> float:
    C = float(C)
    if not (C > 0) or not math.isfinite(C):
        raise BatchedGateError(f"box C must be a positive finite number, got {C!r}")
    return C


# --------------------------------------------------------------------------------------------
# Lipschitz constant
# --------------------------------------------------------------------------------------------


def lambda_max_upper(K: torch.Tensor, mask: torch.Tensor, iters: int = 12) -> torch.Tensor:
    """Upper estimate of the largest eigenvalue of each masked Gram matrix.

    Batched power iteration from the all-ones vector on the valid block. For entry-wise
    non-negative K (any RBF Gram) the Collatz-Wielandt ratio ``max_i (K v)_i / v_i`` of the
    positive iterate is a *guaranteed* upper bound of lambda_max, so ``L = 2 * bound`` is a safe
    FISTA step. For other K the Rayleigh quotient is inflated by 10 % as a safety margin.

    Parameters
    ----------
    K : tensor (G, n, n), symmetric PSD on the valid block.
    mask : bool tensor (G, n).
    iters : power-iteration steps.

    Returns
    -------
    tensor (G,), at least a tiny positive number (no division by zero downstream).
    """
    m = mask.to(K.dtype)
    Km = K * m.unsqueeze(-1) * m.unsqueeze(-2)
    v = m.clone()
    for _ in range(iters):
        w = torch.bmm(Km, v.unsqueeze(-1)).squeeze(-1)
        v = w / w.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    w = torch.bmm(Km, v.unsqueeze(-1)).squeeze(-1)
    tiny = torch.finfo(K.dtype).tiny
    if bool((K >= 0).all()):
        ratio = torch.where(mask & (v > 1e-12), w / v.clamp_min(1e-30), torch.zeros_like(w))
        lam = ratio.amax(dim=-1)
    else:
        lam = 1.1 * (v * w).sum(-1) / (v * v).sum(-1).clamp_min(tiny)
    return lam.clamp_min(1e-12)


# --------------------------------------------------------------------------------------------
# capped-simplex projection
# --------------------------------------------------------------------------------------------


def project_capped_simplex(
    z: torch.Tensor, C: float, mask: torch.Tensor, bisect_iters: int = 24
) -> torch.Tensor:
    """Euclidean projection of each row onto ``{a : sum a = 1, 0 <= a <= C, a = 0 off mask}``.

    The solution is ``a_i = clip(z_i - tau, 0, C)`` for the shift tau with
    ``f(tau) = sum_mask clip(z_i - tau, 0, C) = 1``. f is continuous, piecewise linear and
    non-increasing, so tau is bracketed by ``[min z - C, max z]`` and found by bisection; a final
    exact step solves the linear piece identified by the bracket midpoint (free set F, capped
    set U: ``tau = (sum_F z - (1 - |U| C)) / |F|``), which makes the result exact to rounding
    once the bracket lies within one linear piece. The better of the polished and plain
    bisection answers (smaller ``|sum - 1|``) is kept per row.

    Rows with ``n_valid * C < 1`` are infeasible; they come back with every valid entry at C
    (sum < 1) - callers apply the warm-up rule before relying on them.

    Parameters
    ----------
    z : tensor (G, n)
    C : float box
    mask : bool tensor (G, n)
    bisect_iters : bisection steps before the exact polish.

    Returns
    -------
    tensor (G, n), same dtype/device as z, zero off the mask.
    """
    C = float(C)
    big = torch.finfo(z.dtype).max / 8
    valid_any = mask.any(dim=-1)
    zmax = torch.where(mask, z, torch.full_like(z, -big)).amax(-1)
    zmin = torch.where(mask, z, torch.full_like(z, big)).amin(-1)
    zmax = torch.where(valid_any, zmax, torch.zeros_like(zmax))
    zmin = torch.where(valid_any, zmin, torch.zeros_like(zmin))
    # Padded slots sit far below every valid value: they clip to 0 for every tau in the bracket.
    span = (zmax - zmin).amax() if z.numel() else z.new_tensor(0.0)
    floor = (zmin - 2.0 * C - 2.0 * span - 1.0).unsqueeze(-1)
    zz = torch.where(mask, z, floor.expand_as(z))
    lo = zmin - C  # f(lo) = n_valid * C >= 1
    hi = zmax.clone()  # f(hi) = 0
    for _ in range(bisect_iters):
        mid = 0.5 * (lo + hi)
        s = (zz - mid.unsqueeze(-1)).clamp_(0.0, C).sum(-1)
        above = s > 1.0
        lo = torch.where(above, mid, lo)
        hi = torch.where(above, hi, mid)
    mid = 0.5 * (lo + hi)
    d = zz - mid.unsqueeze(-1)
    free = (d > 0) & (d < C) & mask
    capped = (d >= C) & mask
    nf = free.sum(-1)
    tau_exact = ((zz * free).sum(-1) - (1.0 - C * capped.sum(-1).to(z.dtype))) / nf.clamp_min(1).to(
        z.dtype
    )
    a_bis = (zz - mid.unsqueeze(-1)).clamp(0.0, C)
    a_pol = (zz - tau_exact.unsqueeze(-1)).clamp(0.0, C)
    err_bis = (a_bis.sum(-1) - 1.0).abs()
    err_pol = (a_pol.sum(-1) - 1.0).abs()
    use_pol = (nf > 0) & (err_pol <= err_bis)
    a = torch.where(use_pol.unsqueeze(-1), a_pol, a_bis)
    return a * mask.to(a.dtype)


# --------------------------------------------------------------------------------------------
# FISTA partition finder
# --------------------------------------------------------------------------------------------


@dataclass
class FistaInfo:
    """Diagnostics of one batched FISTA run.

    Attributes
    ----------
    iterations : int, iterations actually run (<= iters when early exit triggered).
    residual : tensor (G,), projected-gradient residual ``max_i |a - P(a - grad/L)|`` at the
        last check (``nan`` when no check ran).
    converged : bool, every row below ``tol`` at the last check.
    lipschitz : tensor (G,), the L used.
    """

    iterations: int
    residual: torch.Tensor
    converged: bool
    lipschitz: torch.Tensor


def _grad(K: torch.Tensor, diagK: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 2.0 * torch.bmm(K, y.unsqueeze(-1)).squeeze(-1) - diagK


@torch.no_grad()
def fista_svdd(
    K: torch.Tensor,
    C: float,
    mask: torch.Tensor,
    iters: int = 80,
    tol: float | None = None,
    check_every: int = 10,
    bisect_iters: int = 24,
    return_info: bool = False,
):
    """Estimate SVDD coefficients for a batch of masked problems by FISTA (Algorithm 1).

    ``L = 2 lambda_max(K)`` (power iteration); start ``a = mask / sum(mask)``; each step
    ``g = 2 K y - diag K``, ``a' = P(y - g / L)`` (capped-simplex projection on the mask),
    ``t' = (1 + sqrt(1 + 4 t^2)) / 2``, ``y = a' + (t - 1)/t' (a' - a)`` - the fixed momentum
    schedule of the seed. Improvement over the seed: with ``tol`` set, every ``check_every``
    iterations the projected-gradient (fixed-point) residual
    ``r = max_i |a - P(a - grad f(a) / L)|`` is computed and the loop exits once every row has
    ``r < tol``.

    Runs without autograd: the output is a partition estimate, gradients flow through
    `ridged_kkt_solve`.

    Parameters
    ----------
    K : tensor (G, n, n), symmetric PSD Gram matrices (padding entries arbitrary).
    C : float, box (rows need ``n_valid * C >= 1``; others are returned but meaningless).
    mask : bool tensor (G, n), valid keys.
    iters : maximum iterations (80 in the seed's language-model runs).
    tol : early-exit tolerance on the projected-gradient residual, or None (fixed ``iters``).
    check_every : iterations between residual checks.
    bisect_iters : bisection steps of each projection.
    return_info : also return a `FistaInfo`.

    Returns
    -------
    alpha_est : tensor (G, n), zero off the mask; or ``(alpha_est, FistaInfo)``.
    """
    mask = _check_problem(K, mask)
    C = _check_C(C)
    if iters < 0:
        raise BatchedGateError(f"iters must be >= 0, got {iters}")
    K = K.detach()
    m = mask.to(K.dtype)
    Km = K * m.unsqueeze(-1) * m.unsqueeze(-2)
    diagK = torch.diagonal(Km, dim1=-2, dim2=-1)
    L = 2.0 * lambda_max_upper(Km, mask)
    invL = (1.0 / L).unsqueeze(-1)
    a = m / m.sum(-1, keepdim=True).clamp_min(1.0)
    y = a
    t = 1.0
    residual = torch.full((K.shape[0],), float("nan"), dtype=K.dtype, device=K.device)
    converged = False
    done = 0
    for k in range(1, iters + 1):
        a_new = project_capped_simplex(y - _grad(Km, diagK, y) * invL, C, mask, bisect_iters)
        t_new = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * t * t))
        y = a_new + ((t - 1.0) / t_new) * (a_new - a)
        a, t = a_new, t_new
        done = k
        if tol is not None and (k % check_every == 0 or k == iters):
            step = project_capped_simplex(a - _grad(Km, diagK, a) * invL, C, mask, bisect_iters)
            residual = (step - a).abs().amax(-1)
            if bool((residual < tol).all()):
                converged = True
                break
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
    alpha : tensor (G, n)
    C : float box
    mask : bool tensor (G, n)
    tol : float, default ``1e-3 * C`` (a fraction of the box, so it scales with 1/n).

    Returns
    -------
    S_mask, E_mask : bool tensors (G, n)
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


def ridged_kkt_solve(
    K: torch.Tensor,
    C: float,
    S_mask: torch.Tensor,
    E_mask: torch.Tensor,
    ridge: float = 1e-3,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Solve the padded bordered KKT systems of a fixed partition (SPEC §1, 001 eq. 7).

    For each row ``g``, with margin set S and bound set E::

        M~ = [[0, 1_S^T], [1_S, 2 K_SS + ridge I_S]],   u = [rho; alpha_S],
        c  = [1 - |E| C;  diag(K)_S - 2 C K_SE 1]

    Non-margin slots are padded with identity rows (``u_i = 0``), so all rows share one
    ``(n+1) x (n+1)`` system and one ``torch.linalg.solve`` call; autograd differentiates it.
    A row with empty S cannot fix rho from the system; rho is then the midpoint of its KKT
    interval ``[max_R h_i, min_E h_i]`` with ``h_i = K_ii - 2 (K alpha)_i`` (``alpha = C`` on E),
    also differentiable.

    Parameters
    ----------
    K : tensor (G, n, n)
    C : float box
    S_mask, E_mask : bool tensors (G, n), disjoint.
    ridge : float, added to the margin diagonal (1e-3 in the seed).
    mask : optional bool tensor (G, n) of valid keys; only used to pick the reserve set of
        empty-S rows (default: every slot outside S and E is reserve).

    Returns
    -------
    alpha : tensor (G, n): C on E, the solved alpha_S on S, 0 elsewhere.
    rho : tensor (G,)
    """
    if K.dim() != 3 or K.shape[-1] != K.shape[-2]:
        raise BatchedGateError(f"K must have shape (G, n, n), got {tuple(K.shape)}")
    S = S_mask.to(device=K.device, dtype=torch.bool)
    E = E_mask.to(device=K.device, dtype=torch.bool)
    if S.shape != K.shape[:2] or E.shape != K.shape[:2]:
        raise BatchedGateError("S_mask and E_mask must have shape (G, n)")
    if bool((S & E).any()):
        raise BatchedGateError("S_mask and E_mask must be disjoint")
    C = _check_C(C)
    G, n, _ = K.shape
    dt = K.dtype
    s = S.to(dt)
    e = E.to(dt)
    diagK = torch.diagonal(K, dim1=-2, dim2=-1)
    empty = ~S.any(-1)  # (G,)

    # h_i = K_ii - 2 (K alpha_E)_i with alpha_E = C on E: the margin right-hand side.
    KE1 = torch.bmm(K, e.unsqueeze(-1)).squeeze(-1)  # (G, n) = K_{:,E} 1
    h = diagK - 2.0 * C * KE1
    nE = e.sum(-1)

    block = 2.0 * K * s.unsqueeze(-1) * s.unsqueeze(-2)
    block = block + torch.diag_embed(ridge * s + (1.0 - s))
    top = torch.cat([empty.to(dt).unsqueeze(-1), s], dim=-1).unsqueeze(-2)  # (G, 1, n+1)
    lower = torch.cat([s.unsqueeze(-1), block], dim=-1)  # (G, n, n+1)
    M = torch.cat([top, lower], dim=-2)

    # rho fallback for empty S (value used only where empty is True).
    big = torch.finfo(dt).max / 8
    R = (~S) & (~E)
    if mask is not None:
        R = R & mask.to(device=K.device, dtype=torch.bool)
    lowR = torch.where(R, h, torch.full_like(h, -big)).amax(-1)
    upE = torch.where(E, h, torch.full_like(h, big)).amin(-1)
    lowR_ok = lowR > -big / 2
    upE_ok = upE < big / 2
    rho_fb = torch.where(
        lowR_ok & upE_ok,
        0.5 * (lowR + upE),
        torch.where(upE_ok, upE, torch.where(lowR_ok, lowR, torch.zeros_like(lowR))),
    )
    c0 = torch.where(empty, rho_fb, 1.0 - C * nE)
    c = torch.cat([c0.unsqueeze(-1), h * s], dim=-1).unsqueeze(-1)  # (G, n+1, 1)
    u = torch.linalg.solve(M, c).squeeze(-1)
    rho = u[:, 0]
    alpha = u[:, 1:] * s + C * e
    return alpha, rho


# --------------------------------------------------------------------------------------------
# validation & top level
# --------------------------------------------------------------------------------------------


@dataclass
class AlphaReport:
    """Constraint violations of coefficients (never raises; a diagnostic).

    Attributes (all tensors of shape (G,) except the float maxima)
    ----------
    box_violation : max over valid i of ``max(-alpha_i, alpha_i - C, 0)``
    sum_violation : ``|sum_valid alpha - 1|``
    padding_mass : ``max |alpha_i|`` over padded slots
    max_box, max_sum, max_padding : float maxima over the batch
    """

    box_violation: torch.Tensor
    sum_violation: torch.Tensor
    padding_mass: torch.Tensor
    max_box: float
    max_sum: float
    max_padding: float

    @property
    def ok(self) -> bool:
        return max(self.max_box, self.max_sum, self.max_padding) <= 1e-6


def validate_alpha(alpha: torch.Tensor, C: float, mask: torch.Tensor) -> AlphaReport:
    """Report box, sum and padding violations of a batch of coefficient vectors.

    Parameters
    ----------
    alpha : tensor (G, n)
    C : float box
    mask : bool tensor (G, n)
    """
    C = _check_C(C)
    if alpha.shape != mask.shape:
        raise BatchedGateError(f"alpha {tuple(alpha.shape)} and mask {tuple(mask.shape)} differ")
    a = alpha.detach()
    mask = mask.to(device=a.device, dtype=torch.bool)
    zero = torch.zeros_like(a)
    viol = torch.maximum(torch.maximum(-a, a - C), zero)
    box = torch.where(mask, viol, zero).amax(-1) if a.shape[-1] else a.new_zeros(a.shape[0])
    sums = torch.where(mask, a, zero).sum(-1)
    sumv = (sums - 1.0).abs()
    pad = torch.where(mask, zero, a.abs()).amax(-1) if a.shape[-1] else a.new_zeros(a.shape[0])

    def _mx(t: torch.Tensor) -> float:
        return float(t.max()) if t.numel() else 0.0

    return AlphaReport(box, sumv, pad, _mx(box), _mx(sumv), _mx(pad))


@dataclass
class BatchedGateResult:
    """Output of `batched_gate`.

    Attributes
    ----------
    alpha : tensor (G, n), differentiable w.r.t. K (except warm-up rows: uniform, constant).
    rho : tensor (G,), nan on warm-up rows (no gate, no score offset).
    S, E : bool tensors (G, n), estimated margin / bound masks (False on warm-up rows).
    warmup : bool tensor (G,), rows served ungated (fewer than ``warmup_threshold(C)`` keys).
    fista : FistaInfo
    report : AlphaReport of the returned alpha
    """

    alpha: torch.Tensor
    rho: torch.Tensor
    S: torch.Tensor
    E: torch.Tensor
    warmup: torch.Tensor
    fista: FistaInfo
    report: AlphaReport
    extras: dict = field(default_factory=dict)

    @property
    def active_count(self) -> torch.Tensor:
        """|S u E| per row, (G,)."""
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
    check_every: int = 10,
) -> BatchedGateResult:
    """Batched approximate SVDD gate: FISTA partition, ridged KKT solve, diagnostics.

    Parameters
    ----------
    K : tensor (G, n, n), Gram matrices (may require grad).
    C : float box.
    mask : bool tensor (G, n).
    iters, tol, check_every : FISTA settings (see `fista_svdd`).
    ridge : margin-diagonal ridge of the KKT solve.
    partition_tol : tolerance of `partition_masks`.
    fista_dtype : dtype for the FISTA partition finder (default: K's dtype); e.g.
        ``torch.float32`` for the seed's single-precision finder under a float64 solve.

    Returns
    -------
    BatchedGateResult
    """
    mask = _check_problem(K, mask)
    C = _check_C(C)
    nvalid = mask.sum(-1)
    warm = nvalid < warmup_threshold(C)
    solve_mask = mask & ~warm.unsqueeze(-1)
    Kf = K.detach() if fista_dtype is None else K.detach().to(fista_dtype)
    a_est, info = fista_svdd(
        Kf, C, solve_mask, iters=iters, tol=tol, check_every=check_every, return_info=True
    )
    S, E = partition_masks(a_est.to(K.dtype), C, solve_mask, partition_tol)
    alpha, rho = ridged_kkt_solve(K, C, S, E, ridge=ridge, mask=solve_mask)
    uniform = mask.to(K.dtype) / nvalid.clamp_min(1).to(K.dtype).unsqueeze(-1)
    alpha = torch.where(warm.unsqueeze(-1), uniform, alpha)
    rho = torch.where(warm, torch.full_like(rho, float("nan")), rho)
    report = validate_alpha(alpha, C, mask)
    return BatchedGateResult(
        alpha=alpha,
        rho=rho,
        S=S,
        E=E,
        warmup=warm,
        fista=info,
        report=report,
        extras={"alpha_fista": a_est},
    )
