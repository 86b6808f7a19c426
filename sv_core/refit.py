"""The independent reference solve: a from-scratch interior-point QP, polished to KKT.

Algorithm (different from the maintained C&P path): Clarabel (called directly) solves

    min 1/2 a^T (2K) a - diag(K)^T a   s.t.  1^T a = 1,  0 <= a <= C

with tight fp64 tolerances. The partition is read off the interior-point solution, the bordered
KKT system is re-solved on its margin set, and a short primal-dual active-set repair moves keys
whose bound or gradient sign is violated. KKT is then verified in this module's own code;
:class:`RefitError` is raised if it does not hold to ``kkt_tol``.

Near-twins (keys closer than ``TWIN_TOL`` in feature space) make the bordered system
near-singular when several of them sit in the margin set, and an interior-point method spreads
mass evenly over them. At the optimum, though, a group of near-twins has at most one margin
member (generically): their gradients differ at first order in their distance while mass moved
between them changes that difference only at second order. The read-off therefore fills each
group in increasing-gradient order (members at C, then one margin member, then reserve), and the
repair swaps a group member into the margin set in place of its margin mate instead of adding a
second one. Exact duplicates are the zero-distance case (the optimum is then not unique; any
split of their mass is optimal). This is a choice of starting partition and of repair moves
only: the result is accepted on the same KKT check of the full problem.
"""
from __future__ import annotations

import numpy as np

from sv_core.errors import InfeasibleError, RefitError
from sv_core.kernels import rbf_kernel, sq_dists
from sv_core.solver import ERROR, MARGIN, RESERVE, SNAP_TOL, rho_midpoint
from sv_core.validation import as_keys, check_params


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


#: a result with KKT violation above this (even within ``kkt_tol``) is tightened by SMO: on
#: ill-conditioned (near-duplicate) problems a 1e-10 residual moves off-data scores by ~1e-6
TIGHT_KKT = 1e-12
#: feature-space squared distance ``2 - 2 k(x_i, x_j)`` below which keys are grouped as near-twins
TWIN_TOL = 1e-8


def twin_groups(X: np.ndarray, sigma: float, tol: float = TWIN_TOL) -> np.ndarray:
    """Group labels of near-twin keys (single linkage on feature-space distance).

    Parameters
    ----------
    X : (n, d) keys;  sigma : RBF bandwidth;  tol : feature-space squared-distance threshold

    Returns
    -------
    labels : (n,) int array; keys ``i`` and ``j`` share a label when a chain of keys joins them
        with every link at feature-space squared distance ``2 (1 - k) <= tol``. The label of a
        group is its smallest member index.
    """
    n = X.shape[0]
    # 2 - 2 exp(-d2/s^2) computed without cancellation
    fd2 = -2.0 * np.expm1(-sq_dists(X, X) / sigma**2)
    parent = np.arange(n)

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return int(i)

    ii, jj = np.nonzero(np.triu(fd2 <= tol, k=1))
    for i, j in zip(ii, jj):
        ri, rj = find(int(i)), find(int(j))
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)
    return np.array([find(i) for i in range(n)], dtype=np.int64)


def read_off_partition(K: np.ndarray, C: float, a0: np.ndarray, groups: np.ndarray,
                       tol: float) -> np.ndarray:
    """Partition from an (interior-point) solution ``a0`` (n,), one margin key per twin group.

    Singletons are classified by their coefficient (``<= tol`` reserve, ``>= C - tol`` error).
    A group of near-twins keeps its total mass ``m`` and is filled in increasing-gradient order
    (ties by index): members at C while ``m`` allows, one margin member with the remainder
    (if above ``tol``), the rest reserve.
    """
    status = np.where(a0 <= tol, RESERVE, np.where(a0 >= C - tol, ERROR, MARGIN)).astype(np.int8)
    h = 2.0 * K @ a0 - np.diag(K)  # gradient up to the common offset rho
    labels, counts = np.unique(groups, return_counts=True)
    for lab in labels[counts > 1]:
        mem = np.flatnonzero(groups == lab)
        mem = mem[np.lexsort((mem, h[mem]))]
        rem = float(a0[mem].sum())
        for k in mem:
            if rem >= C - tol:
                status[k] = ERROR
                rem -= C
            elif rem > tol:
                status[k] = MARGIN
                rem = 0.0
            else:
                status[k] = RESERVE
    return status


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


def _neighbourhood_search(K, C, a, rho, status, viol, kkt_tol, passes: int = 30, width: int = 12):
    """Last-resort polish for degenerate (near-vertex, near-duplicate) problems: try every
    single-key status change, and every pair of bound keys entering the margin set together,
    among the ``width`` keys closest to their KKT boundary (smallest |g| or coefficient nearest a
    bound); keep the best partition and repeat while it improves."""
    n = K.shape[0]
    for _ in range(passes):
        if viol <= kkt_tol:
            break
        g = rho - np.diag(K) + 2.0 * K @ a
        near = np.minimum(np.abs(g), np.minimum(np.abs(a), np.abs(C - a)))
        cand = np.argsort(near)[: min(width, n)]
        best = (viol, a, rho, status)
        for i in cand:
            for new in (RESERVE, MARGIN, ERROR):
                if new == status[i]:
                    continue
                st2 = status.copy()
                st2[i] = new
                a2, rho2 = solve_on_partition(K, C, st2)
                v2 = kkt_violation(K, C, a2, rho2, st2)
                if v2 < best[0]:
                    best = (v2, a2, rho2, st2)
        # near a vertex, two bound keys may have to enter the margin set together
        bound = [i for i in cand if status[i] != MARGIN]
        for x in range(len(bound)):
            for y in range(x + 1, len(bound)):
                st2 = status.copy()
                st2[[bound[x], bound[y]]] = MARGIN
                a2, rho2 = solve_on_partition(K, C, st2)
                v2 = kkt_violation(K, C, a2, rho2, st2)
                if v2 < best[0]:
                    best = (v2, a2, rho2, st2)
        if best[0] >= viol:
            break
        viol, a, rho, status = best
    return a, rho, status, viol


def smo_polish(K: np.ndarray, C: float, a0: np.ndarray, gap_tol: float = 1e-13,
               max_iter: int = 200_000):
    """Second-order SMO (Fan, Chen and Lin 2005 working-set selection) from a feasible start.

    A third algorithm, with no bordered systems: it stays well defined on (near-)singular
    kernels, which is where the partition read-off and repair above can stall. Iterates pairwise
    exact line searches until ``max_{a_i>0} grad_i - min_{a_j<C} grad_j <= gap_tol`` (``grad =
    2 K a - diag K``). Returns ``(alpha, rho, status)`` with ``rho`` at the midpoint of its KKT
    interval, and ``status`` read off exactly (0 reserve, C error, otherwise margin).
    """
    n = K.shape[0]
    d = np.diag(K).copy()
    a = np.clip(np.asarray(a0, dtype=np.float64), 0.0, C)
    # make the start feasible: sum(a) = 1 (scale within the box, then fill or drain greedily)
    s = a.sum()
    if s > 0:
        a *= 1.0 / s
        a = np.minimum(a, C)
    rem = 1.0 - a.sum()
    for i in range(n):
        if abs(rem) <= 1e-15:
            break
        step = min(C - a[i], rem) if rem > 0 else max(-a[i], rem)
        a[i] += step
        rem -= step
    grad = 2.0 * K @ a - d
    for it in range(max_iter):
        if it % 512 == 511:
            grad = 2.0 * K @ a - d
        up = a < C   # may increase
        dn = a > 0.0  # may decrease
        gi = np.where(dn, grad, -np.inf)
        i = int(np.argmax(gi))
        gmin = np.where(up, grad, np.inf).min()
        if gi[i] - gmin <= gap_tol:
            break
        diff = gi[i] - grad  # > 0 for useful j
        eta = np.maximum(d[i] + d - 2.0 * K[i], 1e-300)
        score = np.where(up & (diff > 0), diff * diff / eta, -np.inf)
        j = int(np.argmax(score))
        delta = diff[j] / (2.0 * eta[j])
        delta = min(delta, a[i], C - a[j])
        if delta <= 0.0:
            break
        a[i] -= delta
        a[j] += delta
        if a[i] < 1e-300:
            a[i] = 0.0
        if C - a[j] < 1e-18 * C:
            a[j] = C
        grad += 2.0 * delta * (K[:, j] - K[:, i])
    grad = 2.0 * K @ a - d
    hi = grad[a > 0.0].max(initial=-np.inf)
    lo = grad[a < C].min(initial=np.inf)
    if np.isfinite(hi) and np.isfinite(lo):
        rho = -0.5 * (hi + lo)
    else:
        rho = -(hi if np.isfinite(hi) else lo)
    status = np.where(a <= 0.0, RESERVE, np.where(a >= C, ERROR, MARGIN)).astype(np.int8)
    return a, float(rho), status


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
    C, sigma = check_params(C, sigma)
    X = as_keys(X)
    n = X.shape[0]
    if n * C < 1.0 - 1e-12:
        raise InfeasibleError(f"n*C = {n * C:.6g} < 1: the fixed-C problem is infeasible")
    K = rbf_kernel(X, X, sigma)
    a0 = _clarabel(K, C)
    tol = 1e-7 * C
    groups = twin_groups(X, sigma)
    status = read_off_partition(K, C, a0, groups, tol)
    best: tuple[float, np.ndarray, float, np.ndarray, int] | None = None
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
        if new == MARGIN:
            mate = np.flatnonzero((groups == groups[k]) & (status == MARGIN))
            if mate.size:
                # a near-twin is already in the margin set: swap roles instead of adding a second
                status[mate] = status[k]
        status[k] = new
    assert best is not None  # the loop runs at least once
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
        # near-vertex optima: margin coefficients within rounding of a bound leave a residual the
        # one-key repair cannot remove; try the bound-snapped partition (accepted only if it is KKT)
        for wide in (1e-8, 1e-6):
            st2 = status.copy()
            S = np.flatnonzero(st2 == MARGIN)
            st2[S[a[S] <= wide * C]] = RESERVE
            st2[S[a[S] >= C - wide * C]] = ERROR
            if np.array_equal(st2, status):
                continue
            a2, rho2 = solve_on_partition(K, C, st2)
            v2 = kkt_violation(K, C, a2, rho2, st2)
            if v2 < viol:
                a, rho, status, viol = a2, rho2, st2, v2
            if viol <= kkt_tol:
                break
    if viol > kkt_tol:
        a, rho, status, viol = _neighbourhood_search(K, C, a, rho, status, viol, kkt_tol)
    used_smo = False
    if viol > min(kkt_tol, TIGHT_KKT):
        # degenerate (near-singular) problems: a pairwise SMO from the best point so far
        a2, rho2, st2 = smo_polish(K, C, a)
        v2 = kkt_violation(K, C, a2, rho2, st2)
        if v2 < viol:
            a, rho, status, viol, used_smo = a2, rho2, st2, v2, True
    if viol > kkt_tol:
        raise RefitError(f"refit did not reach KKT tolerance {kkt_tol:g} (violation {viol:.3g})")
    a = np.clip(a, 0.0, C)
    if return_info:
        return a, rho, {"kkt_violation": viol, "polish_iterations": iters, "status": status,
                        "smo": used_smo}
    return a, rho
