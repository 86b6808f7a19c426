"""The certified solve's computation and evidence (:mod:`sv_core.certified` is its public face).

:func:`attempt` validates the input and runs steps 1–4 of :mod:`sv_core.certified` (SMO, read
off the partition, bordered KKT repair, the exact KKT check, a warm polish when needed);
:func:`certified_solution` turns an attempt into the :class:`CertifiedSolution` with its
:class:`SolveCertificate`; :func:`load_certified` is the maintained gate's first solve (no
fallback: :class:`sv_core.Gate` settles the keys one by one itself when it cannot certify).
This module never imports the gate, so the gate can use it.
"""
from __future__ import annotations

import math
import numbers
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from sv_core._active_set import Problem, certify, margin_residual, read_off, repair
from sv_core._blas import single_thread
from sv_core._gate_exact import KKT_GUARD, consolidate_repeats
from sv_core._state import ERROR, MARGIN, RESERVE
from sv_core.errors import InfeasibleError, InvalidKeysError, InvalidParameterError, PathError
from sv_core.kernels import rbf_kernel
from sv_core.refit import TIGHT_KKT
from sv_core.smo import CACHE_BYTES, SMO_TOL, SMOResult, fast_smo_available, smo
from sv_core.validation import as_keys, check_params

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

_SET_NAMES = {MARGIN: "margin", ERROR: "error", RESERVE: "reserve"}


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
        return {name: np.flatnonzero(self.status == code) for code, name in _SET_NAMES.items()}


@dataclass
class Attempt:
    """One run of the fast path (:func:`attempt`): the problem ``p`` (:class:`sv_core._active_set.Problem`),
    the SMO result ``r``, ``alpha`` (n,), ``rho``, ``status`` (n,), ``kkt`` (the violation of each
    condition and ``"max"``), the margin ``resid``, repair ``rounds`` and ``moves``, whether a
    warm ``polished`` SMO was needed, and the start time ``t0`` (``time.perf_counter``)."""

    p: Problem
    r: SMOResult
    alpha: np.ndarray
    rho: float
    status: np.ndarray
    kkt: dict
    resid: float
    rounds: int
    moves: int
    polished: bool
    t0: float


def attempt(X, C: float, sigma: float, *, kkt_tol: float = KKT_GUARD, target: float = TARGET_KKT,
            smo_tol: float = SMO_TOL, cache_bytes: int = CACHE_BYTES, method: str = "auto",
            gram: np.ndarray | None = None) -> Attempt:
    """Validate the input (see :func:`sv_core.certified.solve` for the parameters and errors) and
    run the fast path: SMO, partition, bordered repair, exact KKT check, and when the target is
    missed a second repair and a warm SMO polish (the better of the tries is kept)."""
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
    return Attempt(p, r, alpha, rho, status, kkt, resid, rounds, moves, polished, t0)


def recertify(at: Attempt, alpha: np.ndarray, rho: float, status: np.ndarray) -> None:
    """Replace the attempt's solution by another one (a fallback's) and check it the same way:
    the KKT violations on the exactly recomputed gradient and the margin residual."""
    with single_thread(at.p.n):
        at.kkt, _ = certify(at.p, alpha, rho, status)
        at.resid = margin_residual(at.p, alpha, rho, status)
    at.alpha, at.rho, at.status = alpha, rho, status


def certified_solution(at: Attempt, *, kkt_tol: float, target: float, how: str = "smo+bordered",
                       reason: str | None = None, fallbacks: int = 0) -> CertifiedSolution:
    """The :class:`CertifiedSolution` of an attempt (alpha clipped to the box, status as int8)."""
    kkt, status = at.kkt, at.status
    cert = SolveCertificate(
        kkt_violation=kkt["max"], kkt={k: v for k, v in kkt.items() if k != "max"}, margin_residual=at.resid,
        certified=bool(kkt["max"] <= kkt_tol), meets_target=bool(kkt["max"] <= target), kkt_tol=kkt_tol,
        target=target, method=how, smo_method=at.r.method, smo_iterations=at.r.iterations, smo_status=at.r.status,
        repair_rounds=at.rounds, moves=at.moves, polished=at.polished, fallbacks=fallbacks, fallback_reason=reason,
        counts={name: int(np.count_nonzero(status == code)) for code, name in _SET_NAMES.items()},
        seconds=time.perf_counter() - at.t0,
    )
    return CertifiedSolution(np.clip(at.alpha, 0.0, at.p.C), float(at.rho), status.astype(np.int8), cert)


def not_certified_reason(at: Attempt, kkt_tol: float) -> str | None:
    """Why the attempt is not certified (None when it is)."""
    if at.kkt["max"] <= kkt_tol:
        return None
    return f"certified solve reached KKT violation {at.kkt['max']:.3g} > {kkt_tol:g}"


def load_certified(core) -> SolveCertificate:
    """First solve of a cold maintained solver (:class:`sv_core.solver.MaintainedSVDD`): the
    certified solve of its live keys (:func:`attempt`, exactly as :func:`sv_core.solve` of those
    keys), loaded *deferred*: the margin set, bordered inverse, kernel and gradient are built by
    ``core.materialise()`` when a C&P step first needs them. Raises :class:`PathError` (the core
    untouched) when the solve cannot certify."""
    live = core.live()
    n = live.size
    if n <= SMALL_N:
        # small: the solve reads the kernel exactly as the state builds it (same blocks, same bits),
        # so the partition it finds is the one the later C&P steps see; a kernel computed in other
        # blocks differs in the last bits, and bit-identical keys may then both land on the margin
        core.build_kernel()
        K = core.K[:n, :n] if n and live[-1] == n - 1 else core.K[np.ix_(live, live)]
        at = attempt(core.X[live], core.C, core.sigma, gram=K)
    else:
        # the SMO touches few distinct kernel columns (its working set is about the support): a
        # cache of ceil(1/C) columns (the error set's size) keeps the memory O(n |support|)
        cols = max(2, math.ceil(1.0 / core.C))
        at = attempt(core.X[live], core.C, core.sigma, cache_bytes=min(CACHE_BYTES, 8 * n * cols))
    reason = not_certified_reason(at, KKT_GUARD)
    if reason is not None:
        raise PathError(reason)
    sol = certified_solution(at, kkt_tol=KKT_GUARD, target=TARGET_KKT)
    alpha, status = sol.alpha, sol.status
    margin = status == MARGIN
    X = core.X[live]
    if np.count_nonzero(margin) > 1 and np.unique(X[margin], axis=0).shape[0] < np.count_nonzero(margin):
        # bit-identical keys on the margin: any split of their mass is optimal, but the bordered
        # system needs one of them (the same gathering the exact fallback applies)
        alpha, status = consolidate_repeats(X, alpha, status, core.C)
    core.load_deferred(live, alpha, status, sol.rho)
    core.defer()  # the kernel a small solve read is rebuilt, in the same blocks, by materialise
    return sol.certificate
