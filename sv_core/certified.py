"""Certified solve of the fixed-C SVDD dual without a second solver (SPEC §1, §3b).

:func:`solve` finds the partition with a fast SMO (:mod:`sv_core.smo`), then makes the solution
exact and proves it:

1. read the partition off the SMO coefficients (0: reserve R, C: error E, otherwise margin S);
   bit-identical keys are consolidated and near-twins in S are filled as the refit does
   (:func:`sv_core.refit.read_off_partition`'s rule), so the margin system is non-singular;
2. solve the bordered KKT system ``M u = c`` on S in fp64 (with iterative refinement), ``ρ`` at
   the midpoint of its KKT interval when S is empty (:func:`sv_core.solver.rho_midpoint`), margin
   coefficients within ``SNAP_TOL·C`` of a bound snapped to it (the maintained gate's and the
   refit's conventions, so gate scores and partitions are comparable);
3. repair: keys that violate their KKT condition by more than the target move between sets
   (all at once while that improves, then the worst one at a time; a near-twin of a margin key
   swaps with it), and the margin system is re-solved -- a few active-set rounds, the gradient
   updated over the keys whose coefficient changed;
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
import warnings
from dataclasses import asdict, dataclass, field

import numpy as np

from ._blas import single_thread
from ._gate_exact import KKT_GUARD, consolidate_repeats
from ._state import ERROR, MARGIN, RESERVE, SNAP_TOL
from .errors import InfeasibleError, InvalidKeysError, InvalidParameterError, PathError
from .kernels import rbf_kernel, rbf_matvec
from .refit import TIGHT_KKT, TWIN_TOL
from .smo import CACHE_BYTES, SMO_TOL, fast_smo_available, gradient, smo
from .solver import rho_midpoint
from .validation import as_keys, check_params

#: the solve aims at this largest KKT violation (repairs and a warm polish are tried above it)
TARGET_KKT = TIGHT_KKT
#: active-set rounds of the repair before the warm SMO polish is tried
MAX_ROUNDS = 30
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


class _Problem:
    """Kernel access for one solve: the stored Gram matrix when the caller has one, else kernel
    blocks computed on demand from the keys (never the n x n matrix)."""

    def __init__(self, X: np.ndarray, C: float, sigma: float, K: np.ndarray | None):
        self.X, self.C, self.sigma, self.K = X, C, sigma, K
        self.n = X.shape[0]

    def block(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        if self.K is not None:
            return self.K[np.ix_(rows, cols)]
        return rbf_kernel(self.X[rows], self.X[cols], self.sigma)

    def matvec(self, cols: np.ndarray, w: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """``K[rows, cols] @ w`` (all rows by default), in blocks."""
        if self.K is not None:
            Kr = self.K if rows is None else self.K[rows]
            return Kr[:, cols] @ w
        A = self.X if rows is None else self.X[rows]
        return rbf_matvec(A, self.X[cols], w, self.sigma)

    def diag(self, idx: np.ndarray) -> np.ndarray:
        return np.ones(idx.size) if self.K is None else np.diag(self.K)[idx]

    def fd2(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """Feature-space squared distances ``K_ii + K_jj − 2 K_ij`` (without cancellation for RBF)."""
        if self.K is None:
            from .kernels import sq_dists

            return -2.0 * np.expm1(-sq_dists(self.X[rows], self.X[cols]) / self.sigma**2)
        Kb = self.K[np.ix_(rows, cols)]
        return self.diag(rows)[:, None] + self.diag(cols)[None, :] - 2.0 * Kb


def _bordered(p: _Problem, alpha: np.ndarray, status: np.ndarray) -> tuple[np.ndarray, float, float]:
    """Solve the margin system on ``status``; returns (alpha, rho, residual). With S empty rho is
    left for the caller (NaN) and the residual is 0."""
    C = p.C
    S = np.flatnonzero(status == MARGIN)
    E = np.flatnonzero(status == ERROR)
    a = np.zeros(p.n)
    a[E] = C
    if S.size == 0:
        return a, float("nan"), 0.0
    M = np.empty((S.size + 1, S.size + 1))
    M[0, 0] = 0.0
    M[0, 1:] = 1.0
    M[1:, 0] = 1.0
    M[1:, 1:] = 2.0 * p.block(S, S)
    c = np.empty(S.size + 1)
    c[0] = 1.0 - E.size * C
    c[1:] = p.diag(S) - (2.0 * C * p.matvec(E, np.ones(E.size), rows=S) if E.size else 0.0)
    from scipy.linalg import LinAlgWarning, lu_factor, lu_solve

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", LinAlgWarning)
            lu = lu_factor(M, check_finite=False)
        u = lu_solve(lu, c, check_finite=False)
        for _ in range(2):  # iterative refinement on the one factorisation
            u += lu_solve(lu, c - M @ u, check_finite=False)
        if not np.isfinite(u).all():
            raise np.linalg.LinAlgError("singular margin system")
    except (np.linalg.LinAlgError, LinAlgWarning, ValueError):
        # (near-)duplicates left in S: consistent but singular; the minimum-norm split
        u = np.linalg.lstsq(M, c, rcond=None)[0]
    a[S] = u[1:]
    return a, float(u[0]), float(np.abs(c - M @ u).max())


def _kkt(alpha: np.ndarray, g: np.ndarray, status: np.ndarray, C: float) -> dict[str, float]:
    """Every KKT condition's violation (absolute, as ``refit.kkt_violation``)."""
    mar, err, res = status == MARGIN, status == ERROR, status == RESERVE
    out = {
        "sum": float(abs(alpha.sum() - 1.0)),
        "box": float(max(0.0, -alpha.min(initial=0.0), (alpha - C).max(initial=0.0))),
        "margin_gradient": float(np.abs(g[mar]).max(initial=0.0)),
        "error_gradient": float(np.maximum(g[err], 0.0).max(initial=0.0)),
        "reserve_gradient": float(np.maximum(-g[res], 0.0).max(initial=0.0)),
    }
    out["max"] = max(out.values())
    return out


def _twin_fill(p: _Problem, alpha: np.ndarray, G: np.ndarray, status: np.ndarray) -> None:
    """Near-twins (feature distance² <= ``TWIN_TOL``) both in S make the margin system
    near-singular; at the optimum a group has at most one margin member (generically). Fill each
    such group as the refit's read-off does: keep its mass, members at C in increasing-gradient
    order (ties by index), one margin member with the remainder, the rest reserve. In place."""
    S = np.flatnonzero(status == MARGIN)
    if S.size < 2:
        return
    close = np.triu(p.fd2(S, S) <= TWIN_TOL, k=1)
    if not close.any():
        return
    parent = np.arange(S.size)

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = int(parent[i])
        return int(i)

    for i, j in zip(*np.nonzero(close)):
        ri, rj = find(int(i)), find(int(j))
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)
    roots = np.array([find(i) for i in range(S.size)])
    tol = SNAP_TOL * p.C
    for r in np.unique(roots):
        mem = S[roots == r]
        if mem.size < 2:
            continue
        mem = mem[np.lexsort((mem, G[mem]))]
        rem = float(alpha[mem].sum())
        for k in mem:
            if rem >= p.C - tol:
                alpha[k], status[k] = p.C, ERROR
                rem -= p.C
            elif rem > tol:
                alpha[k], status[k] = rem, MARGIN
                rem = 0.0
            else:
                alpha[k], status[k] = 0.0, RESERVE


def _moves(p: _Problem, alpha: np.ndarray, g: np.ndarray, status: np.ndarray, target: float,
           worst_only: bool) -> int:
    """Move KKT violators between sets (``status`` in place; ``alpha`` is left to the next
    margin solve, so that it stays the state ``G`` was computed for); returns the keys moved."""
    C = p.C
    snap = SNAP_TOL * C
    viol = np.zeros(p.n)
    new = status.copy()
    mar = status == MARGIN
    lo = mar & (alpha <= snap)
    hi = mar & (alpha >= C - snap)
    viol[lo] = np.maximum(-alpha[lo], 0.0) + snap
    viol[hi] = np.maximum(alpha[hi] - C, 0.0) + snap
    new[lo], new[hi] = RESERVE, ERROR
    up = (status == ERROR) & (g > target)
    dn = (status == RESERVE) & (g < -target)
    viol[up], viol[dn] = g[up], -g[dn]
    new[up | dn] = MARGIN
    cand = np.flatnonzero(new != status)
    if cand.size == 0:
        return 0
    if worst_only:
        cand = cand[[int(np.argmax(viol[cand]))]]
    entering = cand[new[cand] == MARGIN]
    S = np.flatnonzero(mar & (new == MARGIN))
    if entering.size and S.size:
        # a key entering next to its near-twin swaps with it instead of joining beside it
        close = p.fd2(entering, S) <= TWIN_TOL
        for r, k in enumerate(entering):
            mates = S[close[r]]
            if mates.size:
                new[mates] = status[k]
    status[cand] = new[cand]
    return int(cand.size)


def _repair(p: _Problem, alpha: np.ndarray, G: np.ndarray, status: np.ndarray, target: float,
            max_rounds: int) -> tuple[np.ndarray, float, np.ndarray, np.ndarray, float, int, int]:
    """Active-set rounds from (alpha, G = 2 K alpha − diag K, status). Returns the best state seen:
    (alpha, rho, status, G, margin-system residual, rounds, moves)."""
    best = None
    rounds = moves = 0
    stale = 0
    worst_only = False
    for rounds in range(1, max_rounds + 1):  # noqa: B007  (the count is returned)
        a_new, rho, resid = _bordered(p, alpha, status)
        d = np.flatnonzero(a_new != alpha)
        if d.size:
            G = G + 2.0 * p.matvec(d, a_new[d] - alpha[d])
        alpha = a_new
        if not (status == MARGIN).any():
            rho = rho_midpoint(G, status, np.arange(p.n))
        g = rho + G
        v = _kkt(alpha, g, status, p.C)["max"]
        if best is None or v < best[0]:
            best = (v, alpha.copy(), rho, status.copy(), G.copy(), resid)
            stale = 0
        else:
            stale += 1
            if stale >= 3:
                worst_only = True
        m = _moves(p, alpha, g, status, target, worst_only)
        if m == 0:
            break
        moves += m
    assert best is not None
    _, alpha, rho, status, G, resid = best
    return alpha, rho, status, G, resid, rounds, moves


def _certify(p: _Problem, alpha: np.ndarray, rho: float, status: np.ndarray) -> tuple[dict, np.ndarray]:
    """KKT on the gradient recomputed from scratch (blocked); returns (violations, G)."""
    G = gradient(p.X, alpha, p.sigma, p.K)
    return _kkt(alpha, rho + G, status, p.C), G


def _residual(p: _Problem, alpha: np.ndarray, rho: float, status: np.ndarray) -> float:
    S = np.flatnonzero(status == MARGIN)
    if S.size == 0:
        return 0.0
    E = np.flatnonzero(status == ERROR)
    r0 = abs(float(alpha[S].sum()) - (1.0 - E.size * p.C))
    KS = 2.0 * p.block(S, S) @ alpha[S] + rho
    cS = p.diag(S) - (2.0 * p.C * p.matvec(E, np.ones(E.size), rows=S) if E.size else 0.0)
    return max(r0, float(np.abs(KS - cS).max()))


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
        p = _Problem(X, C, sigma, gram)
        r = smo(X, C, sigma, tol=smo_tol, cache_bytes=cache_bytes, K=gram, method=method)
        alpha, G = r.alpha, r.G
        status = np.where(alpha <= 0.0, RESERVE, np.where(alpha >= C, ERROR, MARGIN)).astype(np.int8)
        alpha, status = consolidate_repeats(X, alpha, status, C)
        _twin_fill(p, alpha, G, status)
        alpha, rho, status, G, resid, rounds, moves = _repair(p, alpha, G, status, target, MAX_ROUNDS)
        kkt, G = _certify(p, alpha, rho, status)
        polished = False
        if kkt["max"] > target:
            # a second repair from the exact gradient, then a warm SMO polish to a tighter gap
            a2, rho2, st2, _, res2, r2, m2 = _repair(p, alpha, G, status, target, MAX_ROUNDS)
            rounds, moves = rounds + r2, moves + m2
            k2, G2 = _certify(p, a2, rho2, st2)
            if k2["max"] < kkt["max"]:
                alpha, rho, status, kkt, G, resid = a2, rho2, st2, k2, G2, res2
        if kkt["max"] > target:
            polished = True
            rp = smo(X, C, sigma, alpha0=alpha, tol=POLISH_TOL, cache_bytes=cache_bytes, K=gram, method=method)
            st2 = np.where(rp.alpha <= 0.0, RESERVE, np.where(rp.alpha >= C, ERROR, MARGIN)).astype(np.int8)
            a2, st2 = consolidate_repeats(X, rp.alpha, st2, C)
            _twin_fill(p, a2, rp.G, st2)
            a2, rho2, st2, _, res2, r2, m2 = _repair(p, a2, rp.G, st2, target, MAX_ROUNDS)
            rounds, moves = rounds + r2, moves + m2
            k2, _ = _certify(p, a2, rho2, st2)
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
            kkt, _ = _certify(p, alpha, rho, status)
            resid = _residual(p, alpha, rho, status)
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
