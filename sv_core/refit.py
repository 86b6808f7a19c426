"""The independent reference solve: a from-scratch interior-point QP, polished to KKT.

Algorithm (different from the maintained C&P path): Clarabel (through ``qpsolvers``) solves

    min 1/2 a^T (2K) a - diag(K)^T a   s.t.  1^T a = 1,  0 <= a <= C

with tight fp64 tolerances. The partition is read off the interior-point solution, the bordered
KKT system is re-solved on its margin set, and a short primal-dual active-set repair moves keys
whose bound or gradient sign is violated. KKT is then verified in this module's own code;
:class:`RefitError` is raised if it does not hold to ``kkt_tol``.
"""
from __future__ import annotations

import numpy as np

from .errors import InfeasibleError, RefitError
from .gate import _check_params, as_keys
from .kernels import rbf_kernel
from .solver import ERROR, MARGIN, RESERVE, SNAP_TOL, rho_midpoint


def _clarabel(K: np.ndarray, C: float) -> np.ndarray:
    """Interior-point solve with Clarabel (fp64, tight tolerances); ``AlmostSolved`` is accepted
    because the active-set polish below re-solves the KKT system exactly."""
    import clarabel
    from scipy import sparse

    n = K.shape[0]
    P = sparse.triu(sparse.csc_matrix(2.0 * K), format="csc")
    q = -np.diag(K).copy()
    eye = sparse.identity(n, format="csc")
    A = sparse.vstack([sparse.csc_matrix(np.ones((1, n))), -eye, eye], format="csc")
    b = np.concatenate([[1.0], np.zeros(n), np.full(n, C)])
    cones = [clarabel.ZeroConeT(1), clarabel.NonnegativeConeT(2 * n)]
    settings = clarabel.DefaultSettings()
    settings.verbose = False
    settings.tol_gap_abs = 1e-12
    settings.tol_gap_rel = 1e-12
    settings.tol_feas = 1e-12
    settings.max_iter = 300
    sol = clarabel.DefaultSolver(P, q, A, b, cones, settings).solve()
    status = str(sol.status)
    if "Solved" not in status:  # Solved or AlmostSolved
        raise RefitError(f"Clarabel terminated with status {status}")
    return np.clip(np.asarray(sol.x, dtype=np.float64), 0.0, C)


def solve_on_partition(K: np.ndarray, C: float, status: np.ndarray):
    """Solve the bordered KKT system for (rho, alpha_S) given a partition; returns alpha, rho."""
    n = K.shape[0]
    d = np.diag(K)
    S = np.flatnonzero(status == MARGIN)
    E = np.flatnonzero(status == ERROR)
    a = np.zeros(n)
    a[E] = C
    if S.size == 0:
        g0 = -d + 2.0 * K[:, E] @ a[E]
        rho = rho_midpoint(g0, status, np.arange(n))
        return a, rho
    M = np.zeros((S.size + 1, S.size + 1))
    M[0, 1:] = 1.0
    M[1:, 0] = 1.0
    M[1:, 1:] = 2.0 * K[np.ix_(S, S)]
    c = np.empty(S.size + 1)
    c[0] = 1.0 - E.size * C
    c[1:] = d[S] - 2.0 * C * K[np.ix_(S, E)].sum(axis=1)
    try:
        u = np.linalg.solve(M, c)
    except np.linalg.LinAlgError:
        # exact duplicate keys in the margin set: the system is consistent but singular;
        # the minimum-norm solution splits their mass evenly (the optimum is not unique)
        u = np.linalg.lstsq(M, c, rcond=None)[0]
    a[S] = u[1:]
    return a, float(u[0])


def kkt_violation(K: np.ndarray, C: float, a: np.ndarray, rho: float, status: np.ndarray) -> float:
    """Largest KKT violation of (a, rho) for the given partition (independent check)."""
    g = rho - np.diag(K) + 2.0 * K @ a
    v = [abs(a.sum() - 1.0), max(0.0, -a.min()), max(0.0, (a - C).max())]
    if (status == MARGIN).any():
        v.append(np.abs(g[status == MARGIN]).max())
        v.append(max(0.0, -a[status == MARGIN].min()))
        v.append(max(0.0, (a[status == MARGIN] - C).max()))
    if (status == ERROR).any():
        v.append(max(0.0, g[status == ERROR].max()))
    if (status == RESERVE).any():
        v.append(max(0.0, -g[status == RESERVE].min()))
    return float(max(v))


def refit(X, C: float, sigma: float, kkt_tol: float = 1e-9, return_info: bool = False):
    """Independent from-scratch solve of the fixed-C SVDD dual.

    Parameters
    ----------
    X : (n, d) keys
    C, sigma : the fixed box and the RBF bandwidth
    kkt_tol : largest accepted KKT violation after polishing

    Returns
    -------
    alpha : (n,) coefficients;  rho : float offset;  (info dict if ``return_info``)
    """
    C, sigma = _check_params(C, sigma)
    X = as_keys(X)
    n = X.shape[0]
    if n * C < 1.0 - 1e-12:
        raise InfeasibleError(f"n*C = {n * C:.6g} < 1: the fixed-C problem is infeasible")
    K = rbf_kernel(X, X, sigma)
    a0 = _clarabel(K, C)
    tol = 1e-7 * C
    status = np.where(a0 <= tol, RESERVE, np.where(a0 >= C - tol, ERROR, MARGIN)).astype(np.int8)
    best = None
    for it in range(50):
        a, rho = solve_on_partition(K, C, status)
        g = rho - np.diag(K) + 2.0 * K @ a
        viol = kkt_violation(K, C, a, rho, status)
        if best is None or viol < best[0]:
            best = (viol, a.copy(), rho, status.copy(), it)
        if viol <= kkt_tol:
            break
        # active-set repair: move the single worst offender
        cand = []
        S = status == MARGIN
        if S.any():
            lo = np.where(S, -a, -np.inf); cand.append((lo.max(), int(lo.argmax()), RESERVE))
            hi = np.where(S, a - C, -np.inf); cand.append((hi.max(), int(hi.argmax()), ERROR))
        ge = np.where(status == ERROR, g, -np.inf); cand.append((ge.max(), int(ge.argmax()), MARGIN))
        gr = np.where(status == RESERVE, -g, -np.inf); cand.append((gr.max(), int(gr.argmax()), MARGIN))
        v, k, new = max(cand, key=lambda t: t[0])
        if v <= 0:
            break
        status[k] = new
    viol, a, rho, status, iters = best
    # degenerate margin keys on a bound do not pin rho: snap them (same convention as the gate)
    snap = SNAP_TOL * C
    while True:
        S = np.flatnonzero(status == MARGIN)
        on_lo = S[a[S] <= snap]
        on_hi = S[a[S] >= C - snap]
        if on_lo.size == 0 and on_hi.size == 0:
            break
        status[on_lo] = RESERVE
        status[on_hi] = ERROR
        a, rho = solve_on_partition(K, C, status)
        viol = kkt_violation(K, C, a, rho, status)
    if viol > kkt_tol:
        raise RefitError(f"refit did not reach KKT tolerance {kkt_tol:g} (violation {viol:.3g})")
    a = np.clip(a, 0.0, C)
    if return_info:
        return a, rho, {"kkt_violation": viol, "polish_iterations": iters, "status": status}
    return a, rho
