"""Certified solve of the fixed-C SVDD dual without a second solver (SPEC §1, §3b).

:func:`solve` finds the partition with a fast SMO (:mod:`sv_core.smo`), then makes the solution
exact and proves it:

1. read the partition off the SMO coefficients (within ``SNAP_TOL·C`` of 0: reserve R, of C:
   error E, otherwise margin S); bit-identical keys are consolidated and near-twins in S are
   filled as the refit does
   (:func:`sv_core.refit.read_off_partition`'s rule), so the margin system is non-singular;
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

The KKT conditions are sufficient for this convex QP, so a state that passes the check is the
optimum whatever found it. Above the target (``1e-12``) a warm SMO polish to a tighter gap and a
second repair are tried; above ``kkt_tol`` (the maintained gate's guard, ``1e-9``) the solve
falls back to the maintained C&P path (:class:`sv_core.Gate` settling keys one by one, whose own
guard ends in the independent refit) and says so in the certificate. The independent refit
(:func:`sv_core.refit`) stays the audit oracle; it is never called here except through that
fallback.
"""
from __future__ import annotations

import numbers
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ._active_set import Problem, certify, margin_residual, read_off, repair
from ._blas import single_thread
from ._gate_exact import KKT_GUARD, consolidate_repeats
from ._state import ERROR, MARGIN, RESERVE
from .errors import InfeasibleError, InvalidKeysError, InvalidParameterError, PathError
from .kernels import rbf_kernel
from .refit import TIGHT_KKT
from .smo import CACHE_BYTES, SMO_TOL, fast_smo_available, smo
from .validation import as_keys, check_params

#: the solve aims at this largest KKT violation (repairs and a warm polish are tried above it)
TARGET_KKT = TIGHT_KKT
#: active-set rounds of the repair before the warm SMO polish is tried
MAX_ROUNDS = 100
#: gap of the warm SMO polish tried when the repair does not reach the target
POLISH_TOL = 1e-13
#: up to this many keys the whole Gram matrix (at most 1.2 MB) is computed in one call and every
#: kernel access reads it (faster than several blocked calls at this size); above it, kernel
#: columns and blocks are computed on demand (memory O(block + cache), never the n x n matrix)
SMALL_N = 384

_NAMES = {MARGIN: "margin", ERROR: "error", RESERVE: "reserve"}


@dataclass
class SolveCertificate:
    """Evidence that a :func:`solve` result is the fixed-C optimum (JSON-serialisable).

    Attributes
    ----------
    kkt_violation : largest KKT violation on the exactly recomputed gradient
    kkt : the violation of each condition (sum, box, margin/error/reserve gradient)
    margin_residual : ``max |M u − c|`` of the bordered system on the margin set
    certified : ``kkt_violation <= kkt_tol``;  meets_target : ``kkt_violation <= target``
    method : "smo+bordered" (the fast path), or "fallback:cp" / "fallback:refit"
    smo_method, smo_iterations, smo_status : the SMO run ("compiled" or "reference")
    repair_rounds, moves : active-set rounds taken and keys moved between sets
    polished : a warm SMO polish was needed;  fallbacks : 1 when the fallback was taken
    fallback_reason : why (None on the fast path)
    counts : sizes of the margin, error and reserve sets;  seconds : wall time of the solve
    """

    kkt_violation: float
    kkt: dict
    margin_residual: float
    certified: bool
    meets_target: bool
    kkt_tol: float
    target: float
    method: str
    smo_method: str
    smo_iterations: int
    smo_status: str
    repair_rounds: int
    moves: int
    polished: bool
    fallbacks: int
    fallback_reason: str | None
    counts: dict = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class CertifiedSolution:
    """Result of :func:`solve`: ``alpha`` (n,), ``rho``, ``status`` (n,) int8 (``MARGIN``, ``ERROR``,
    ``RESERVE`` codes of :mod:`sv_core.solver`) and the :class:`SolveCertificate`."""

    alpha: np.ndarray
    rho: float
    status: np.ndarray
    certificate: SolveCertificate

    def partition(self) -> dict[str, np.ndarray]:
        """Row indices of the margin (0<α<C), error (α=C) and reserve (α=0) sets."""
        return {name: np.flatnonzero(self.status == code) for code, name in _NAMES.items()}


def _fallback(X: np.ndarray, C: float, sigma: float) -> tuple[np.ndarray, float, np.ndarray, str]:
    """The maintained C&P path (keys settled one by one; its guard ends in the refit), or the
    refit itself below the gate's warm-up size."""
    from .calibrate import warmup_size
    from .gate import Gate
    from .refit import refit

    if X.shape[0] >= warmup_size(C):
        g = Gate(C, sigma, cold_solve="path")
        g.admit(X)
        slots = g._live_slots()
        return g.alpha, g.rho, g._solver.status[slots].copy(), "fallback:cp"
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
    """
    t0 = time.perf_counter()
    C, sigma = check_params(C, sigma)
    if method not in ("auto", "compiled", "reference"):
        raise InvalidParameterError(f"method must be 'auto', 'compiled' or 'reference', got {method!r}")
    if method == "compiled" and not fast_smo_available():
        raise InvalidParameterError("method='compiled' but the compiled SMO is not built (or FORGETFUL_SOLVER)")
    for name, v in (("kkt_tol", kkt_tol), ("target", target), ("smo_tol", smo_tol), ("cache_bytes", cache_bytes)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 < v < float("inf"):
            raise InvalidParameterError(f"{name} must be a finite positive number, got {v!r}")
    X = np.ascontiguousarray(as_keys(X))
    n = X.shape[0]
    if n == 0:
        raise InvalidKeysError("keys are empty (n = 0)")
    if n * C < 1.0 - 1e-12:
        raise InfeasibleError(f"n*C = {n * C:.6g} < 1: the fixed-C problem is infeasible")
    if gram is not None:
        gram = np.asarray(gram, dtype=np.float64)
        if gram.shape != (n, n) or not np.isfinite(gram).all():
            raise InvalidKeysError(f"gram must be a finite ({n}, {n}) array, got shape {gram.shape}")
    with single_thread(n):
        if gram is None and n <= SMALL_N:
            gram = rbf_kernel(X, X, sigma)  # <= SMALL_N^2 entries (1.2 MB): one call beats many
        p = Problem(X, C, sigma, gram)
        r = smo(X, C, sigma, tol=smo_tol, cache_bytes=cache_bytes, K=gram, method=method)
        alpha, G, status = read_off(p, r.alpha, r.G)
        alpha, rho, status, G, resid, rounds, moves = repair(p, alpha, G, status, target, MAX_ROUNDS)
        kkt, G = certify(p, alpha, rho, status)
        polished = False
        if kkt["max"] > target:
            # a second repair from the exact gradient, then a warm SMO polish to a tighter gap
            a2, rho2, st2, _, res2, r2, m2 = repair(p, alpha, G, status, target, MAX_ROUNDS)
            rounds, moves = rounds + r2, moves + m2
            k2, G2 = certify(p, a2, rho2, st2)
            if k2["max"] < kkt["max"]:
                alpha, rho, status, kkt, G, resid = a2, rho2, st2, k2, G2, res2
        if kkt["max"] > target:
            polished = True
            rp = smo(X, C, sigma, alpha0=alpha, tol=POLISH_TOL, cache_bytes=cache_bytes, K=gram, method=method)
            a2, G2, st2 = read_off(p, rp.alpha, rp.G)
            a2, rho2, st2, _, res2, r2, m2 = repair(p, a2, G2, st2, target, MAX_ROUNDS)
            rounds, moves = rounds + r2, moves + m2
            k2, _ = certify(p, a2, rho2, st2)
            if k2["max"] < kkt["max"]:
                alpha, rho, status, kkt, resid = a2, rho2, st2, k2, res2
    how, reason, fallbacks = "smo+bordered", None, 0
    if not kkt["max"] <= kkt_tol:
        reason = f"certified solve reached KKT violation {kkt['max']:.3g} > {kkt_tol:g}"
        if not fallback:
            raise PathError(reason)
        alpha, rho, status, how = _fallback(X, C, sigma)
        fallbacks = 1
        with single_thread(n):
            kkt, _ = certify(p, alpha, rho, status)
            resid = margin_residual(p, alpha, rho, status)
    cert = SolveCertificate(
        kkt_violation=kkt["max"], kkt={k: v for k, v in kkt.items() if k != "max"}, margin_residual=resid,
        certified=bool(kkt["max"] <= kkt_tol), meets_target=bool(kkt["max"] <= target), kkt_tol=kkt_tol,
        target=target, method=how, smo_method=r.method, smo_iterations=r.iterations, smo_status=r.status,
        repair_rounds=rounds, moves=moves, polished=polished, fallbacks=fallbacks, fallback_reason=reason,
        counts={name: int(np.count_nonzero(status == code)) for code, name in _NAMES.items()},
        seconds=time.perf_counter() - t0,
    )
    return CertifiedSolution(np.clip(alpha, 0.0, C), float(rho), status.astype(np.int8), cert)


def load_certified(core) -> SolveCertificate:
    """First solve of a cold maintained solver (:class:`sv_core.solver.MaintainedSVDD`): the
    certified solve of its live keys over the Gram matrix it stores, then the maintained state
    (margin set, bordered inverse, exact gradient) rebuilt from the solution. Raises
    :class:`PathError` (the core untouched) when the solve cannot certify."""
    live = core.live()
    n = live.size
    if n and live[-1] == n - 1:
        K = core.K[:n, :n]  # a view: rows are read in place
    else:
        K = core.K[np.ix_(live, live)]
    sol = solve(core.X[live], core.C, core.sigma, gram=K, fallback=False)
    core.load_solution(live, sol.alpha, sol.status, sol.rho)
    core.solved = True
    return sol.certificate
