"""Batched, approximate SVDD gate for training (no deletion certificate).

The *training* path of SPEC §1 ("Batched training path"; preprint 001, Appendix B): many
independent SVDD problems (one per sequence x head x chunk) are packed into one padded batch of
Gram matrices ``K (P, n, n)`` with a per-row validity mask ``(P, n)`` or ``(P, J, n)`` and solved
together by :func:`batched_gate` (FISTA partition, ridged KKT solve, diagnostics). The
coefficients are the exact solution of the *ridged* packed system, a stabilised approximation of
the SVDD optimum; they are never used for deletion certificates, which come from the fp64
maintained solver (:class:`sv_core.Gate`). Every function accepts CPU or CUDA tensors of any
floating dtype. Layout: shared pieces in ``sv_core.batched.common``, the partition finder in
``sv_core.batched.fista``, the KKT solves in ``sv_core.batched.kkt``; this module re-exports them
and holds the diagnostics and :func:`batched_gate`.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from sv_core.batched.common import BatchedGateError, any_true, as_problems, check_box, rbf_gram, warmup_threshold
from sv_core.batched.fista import (
    FISTA_BACKENDS,
    FistaInfo,
    fista_lipschitz,
    fista_svdd,
    lambda_max_upper,
    partition_masks,
    project_capped_simplex,
)
from sv_core.batched.kkt import KKT_SOLVERS, bordered_matrix, bordered_spd_solve, ridged_kkt_solve
from sv_core.kernels import torch_kernel  # noqa: F401  (re-exported for the models)

__all__ = [
    "GateStats",
    "gate_stats",
    "FISTA_BACKENDS",
    "BatchedGateError",
    "BatchedGateResult",
    "AlphaReport",
    "warmup_threshold",
    "rbf_gram",
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


class GateStats(Mapping):
    """Read-only mapping of a forward's gate diagnostics, each computed on its first read (by the
    function given for its key) and kept."""

    def __init__(self, **getters: Callable[[], Any]):
        self._get = getters
        self._val: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        if key not in self._val:
            self._val[key] = self._get[key]()
        return self._val[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get)

    def __len__(self) -> int:
        return len(self._get)


def gate_stats(S: torch.Tensor, E: torch.Tensor, mask: torch.Tensor, warm: torch.Tensor, alpha: torch.Tensor,
               C: float, fista_iterations: int) -> GateStats:
    """The diagnostics of a batched gate solve as a `GateStats` (each computed on its first read; a
    training step reads none): ``active`` |S u E| and ``prefix`` (valid keys) per problem, ``warmup``,
    ``fista_iterations``, ``max_box`` and ``max_sum`` of the returned ``alpha`` (`validate_alpha`). The
    tensors are kept detached, so a kept mapping does not hold an autograd graph."""
    a = alpha.detach()
    report = GateStats(report=lambda: validate_alpha(a, C, mask))
    return GateStats(
        active=lambda: (S | E).sum(-1).reshape(-1),
        prefix=lambda: mask.sum(-1).reshape(-1),
        warmup=lambda: warm.detach().reshape(-1),
        fista_iterations=lambda: fista_iterations,
        max_box=lambda: report["report"].max_box,
        max_sum=lambda: report["report"].max_sum,
    )


def validate_alpha(alpha: torch.Tensor, C: float, mask: torch.Tensor) -> AlphaReport:
    """Report box, sum and padding violations of a batch of coefficient vectors.

    Parameters
    ----------
    alpha : tensor (..., n)
    C : float box
    mask : bool tensor (..., n), same shape.
    """
    C = check_box(C)
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
    alpha_fista : the FISTA estimate (detached) the partition came from.
    report : AlphaReport of the returned alpha (`validate_alpha`), computed on first access: a
        diagnostic that a training step need not pay for (about a tenth of the gate's time outside
        its compiled loops at the deterioration study's shapes).
    """

    alpha: torch.Tensor
    rho: torch.Tensor
    S: torch.Tensor
    E: torch.Tensor
    warmup: torch.Tensor
    fista: FistaInfo
    alpha_fista: torch.Tensor
    #: (C, the valid-key mask (P, J, n), whether the result was squeezed from (P, n) problems)
    report_of: tuple = field(default=(), repr=False, compare=False)
    _report: AlphaReport | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def report(self) -> AlphaReport:
        """Box, sum and padding violations of ``alpha`` (`validate_alpha`), computed once."""
        if self._report is None:
            C, m3, flat = self.report_of
            a = self.alpha.detach()
            rep = validate_alpha(a.unsqueeze(1) if flat else a, C, m3)
            if flat:
                rep = AlphaReport(rep.box_violation.squeeze(1), rep.sum_violation.squeeze(1),
                                  rep.padding_mass.squeeze(1), rep.max_box, rep.max_sum, rep.max_padding)
            self._report = rep
        return self._report

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
    fista_backend: str = "auto",
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
    fista_backend : "auto", "torch" (reference) or "compiled"; see `fista_svdd`.

    Returns
    -------
    BatchedGateResult

    Pipeline::

        K (P, n, n), mask (P, n) or (P, J, n)
          -> fista_svdd         accelerated projected gradient, no autograd (partition finder)
          -> partition_masks    margin S = {0 < a < C}, bound E = {a = C} (per row, tolerance tol)
          -> ridged_kkt_solve   bordered system M u = c with ridge on the margin diagonal,
                                torch.linalg.solve (reference), differentiable by autograd; or
                                solver="cholesky": the same system by the Schur complement of the
                                SPD margin block (batched Cholesky, analytic backward);
                                solver="compiled": one Cholesky per problem in sv_core._batchfast
          -> validate_alpha     box / sum / padding violations (diagnostics, never raises;
                                computed on the first read of ``report``)
    """
    m3, flat = as_problems(K, mask)
    C = check_box(C)
    nvalid = m3.sum(-1)
    warm = nvalid < warmup_threshold(C)
    solve_mask = m3 & ~warm.unsqueeze(-1)
    Kf = K.detach() if fista_dtype is None else K.detach().to(fista_dtype)
    a_est, info = fista_svdd(
        Kf, C, solve_mask, iters=iters, tol=tol, check_every=check_every, return_info=True, backend=fista_backend
    )
    S, E = partition_masks(a_est.to(K.dtype), C, solve_mask, partition_tol)
    alpha, rho = ridged_kkt_solve(K, C, S, E, ridge=ridge, mask=solve_mask, solver=kkt_solver)
    if any_true(warm):  # (no warm-up problem: both selections would return alpha and rho as they are)
        uniform = m3.to(K.dtype) / nvalid.clamp_min(1).to(K.dtype).unsqueeze(-1)
        alpha = torch.where(warm.unsqueeze(-1), uniform, alpha)
        rho = torch.where(warm, torch.full_like(rho, float("nan")), rho)
    if flat:
        alpha, rho, S, E, warm, a_est = (t.squeeze(1) for t in (alpha, rho, S, E, warm, a_est))
    return BatchedGateResult(alpha=alpha, rho=rho, S=S, E=E, warmup=warm, fista=info, alpha_fista=a_est,
                             report_of=(C, m3, flat))
