"""Certified solve of the fixed-C SVDD dual without a second solver (SPEC §1, §3b).

:func:`solve` finds the partition with a fast SMO (:mod:`sv_core.smo`), then makes the solution
exact and proves it: read the partition off the SMO coefficients, solve the bordered KKT system on
the margin set in fp64, repair by a primal active-set method, and certify on a gradient recomputed
from scratch over all n keys (every KKT condition checked). The KKT conditions are sufficient for
this convex QP, so a state that passes the check is the optimum whatever found it; a state that
fails falls back to the maintained C&P path and says so in the certificate. The independent refit
(:func:`sv_core.refit`) stays the audit oracle; it is never called here except through that
fallback.
"""
from __future__ import annotations

import numpy as np

from sv_core._gate_exact import KKT_GUARD, consolidate_repeats
from sv_core.calibrate import warmup_size
from sv_core.certified_core import (
    MAX_ROUNDS,
    POLISH_TOL,
    SMALL_N,
    TARGET_KKT,
    CertifiedSolution,
    SolveCertificate,
    attempt,
    certified_solution,
    load_certified,
    not_certified_reason,
    recertify,
)
from sv_core.errors import PathError
from sv_core.gate import Gate
from sv_core.refit import refit
from sv_core.smo import CACHE_BYTES, SMO_TOL

__all__ = ["MAX_ROUNDS", "POLISH_TOL", "SMALL_N", "TARGET_KKT", "CertifiedSolution", "SolveCertificate",
           "load_certified", "solve"]


def _fallback(X: np.ndarray, C: float, sigma: float) -> tuple[np.ndarray, float, np.ndarray, str]:
    """The maintained C&P path (keys settled one by one; its guard ends in the refit), or the
    refit itself below the gate's warm-up size."""
    if X.shape[0] >= warmup_size(C):
        g = Gate(C, sigma, cold_solve="path")
        g.admit(X)
        st = g.to_state()
        return st["alpha"], st["rho"], st["status"], "fallback:cp"
    a, rho, info = refit(X, C=C, sigma=sigma, return_info=True)
    a, st = consolidate_repeats(X, a, info["status"], C)
    return a, rho, st, "fallback:refit"


def solve(X, C: float, sigma: float, *, kkt_tol: float = KKT_GUARD, target: float = TARGET_KKT,
          smo_tol: float = SMO_TOL, cache_bytes: int = CACHE_BYTES, method: str = "auto",
          fallback: bool = True, gram: np.ndarray | None = None) -> CertifiedSolution:
    """Certified solve of the fixed-C SVDD dual ``min αᵀKα − diag(K)ᵀα, Σα = 1, 0 ≤ α ≤ C``.

    Parameters
    ----------
    X : (n, d) keys;  C : the fixed box (``n C >= 1``);  sigma : RBF bandwidth
    kkt_tol : largest accepted KKT violation (default the gate's guard, 1e-9); above it the
        fallback is taken (or, with ``fallback=False``, :class:`PathError` is raised)
    target : the violation the repair aims at (1e-12)
    smo_tol : stopping gap of the SMO;  cache_bytes : memory of its kernel-column cache
    method : SMO implementation, "auto" | "compiled" | "reference"
    gram : (n, n) ``rbf_kernel(X, X, sigma)`` when the caller already holds it (read, not copied);
        computed here up to ``SMALL_N`` keys, never above

    Returns
    -------
    :class:`CertifiedSolution` with ``alpha`` (n,), ``rho``, ``status`` (n,) and ``certificate``.

    Raises
    ------
    InvalidKeysError, InvalidParameterError : bad keys, gram, C, sigma, tolerances or method
    InfeasibleError : ``n C < 1``
    PathError : not certified and ``fallback=False``

    Steps:

    1. read the partition off the SMO coefficients (within ``SNAP_TOL·C`` of 0: reserve R, of C:
       error E, otherwise margin S); bit-identical keys are consolidated and near-twins in S are
       filled as the refit does (:func:`sv_core.refit.read_off_partition`'s rule), so the margin
       system is non-singular;
    2. solve the bordered KKT system ``M u = c`` on S in fp64 (with iterative refinement), ``ρ`` at
       the midpoint of its KKT interval when S is empty (:func:`sv_core.solver.rho_midpoint`), margin
       coefficients within ``SNAP_TOL·C`` of a bound snapped to it (the maintained gate's and the
       refit's conventions, so gate scores and partitions are comparable);
    3. repair (a primal active-set method from the feasible SMO point): step towards the margin
       system's solution until a margin coefficient reaches a bound (it leaves S), else take it
       whole; then the keys whose gradient has the wrong sign beyond the target join S (a key next
       to a near-twin in S refills that twin group instead, once). The objective never increases and
       the iterate stays feasible; the gradient is updated over the keys whose coefficient changed;
    4. certify: the gradient ``g = ρ − diag K + 2 K α`` is recomputed from scratch over all n keys
       in blocks (:func:`sv_core.kernels.rbf_matvec`: O(block) memory, never the n x n matrix) and
       every KKT condition is checked: ``|Σα − 1|``, the box, ``|g_S|``, ``g_E <= 0``, ``g_R >= 0``
       (absolute, as :func:`sv_core.refit.kkt_violation` and ``Gate.kkt_residual``).

    Above ``target`` a warm SMO polish to a tighter gap and a second repair are tried; above
    ``kkt_tol`` (the maintained gate's guard) the solve falls back to the maintained C&P path
    (:class:`sv_core.Gate` settling keys one by one, whose own guard ends in the independent refit).
    """
    at = attempt(X, C, sigma, kkt_tol=kkt_tol, target=target, smo_tol=smo_tol, cache_bytes=cache_bytes,
                 method=method, gram=gram)
    reason = not_certified_reason(at, kkt_tol)
    if reason is None:
        return certified_solution(at, kkt_tol=kkt_tol, target=target)
    if not fallback:
        raise PathError(reason)
    alpha, rho, status, how = _fallback(at.p.X, at.p.C, at.p.sigma)
    recertify(at, alpha, rho, status)
    return certified_solution(at, kkt_tol=kkt_tol, target=target, how=how, reason=reason, fallbacks=1)
