"""The active-set machinery of the certified solve (:mod:`sv_core.certified`): kernel access
for one problem, the bordered margin system, the partition read-off, the primal active-set repair
and the KKT check on the recomputed gradient. See :mod:`sv_core.certified` for the method.
"""
from __future__ import annotations

import warnings

import numpy as np

from sv_core._gate_exact import consolidate_repeats
from sv_core._state import ERROR, MARGIN, RESERVE, SNAP_TOL
from sv_core.kernels import rbf_kernel, rbf_matvec, sq_dists
from sv_core.refit import TWIN_TOL
from sv_core.smo import gradient
from sv_core.solver import rho_midpoint


class Problem:
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
            return -2.0 * np.expm1(-sq_dists(self.X[rows], self.X[cols]) / self.sigma**2)
        Kb = self.K[np.ix_(rows, cols)]
        return self.diag(rows)[:, None] + self.diag(cols)[None, :] - 2.0 * Kb


def bordered_solve(p: Problem, alpha: np.ndarray, status: np.ndarray) -> tuple[np.ndarray, float, float]:
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


def kkt_violations(alpha: np.ndarray, g: np.ndarray, status: np.ndarray, C: float) -> dict[str, float]:
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


def twin_fill(p: Problem, alpha: np.ndarray, G: np.ndarray, status: np.ndarray) -> None:
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


def read_off(p: Problem, alpha: np.ndarray, G: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Partition from SMO coefficients: within ``SNAP_TOL·C`` of a bound (or past it) is at the
    bound, repeated keys consolidated, near-twins in S filled one per group. Returns ``(alpha,
    G, status)``: alpha feasible, exactly at its bound off S, and G updated for every change."""
    C = p.C
    snap = SNAP_TOL * C
    a = np.clip(alpha, 0.0, C)
    a[a <= snap] = 0.0
    a[a >= C - snap] = C
    status = np.where(a <= 0.0, RESERVE, np.where(a >= C, ERROR, MARGIN)).astype(np.int8)
    a, status = consolidate_repeats(p.X, a, status, C)
    a = np.array(a)
    twin_fill(p, a, G, status)
    d = np.flatnonzero(a != alpha)
    if d.size:
        G = G + 2.0 * p.matvec(d, a[d] - alpha[d])
    return a, G, status


def enter_margin(p: Problem, alpha: np.ndarray, G: np.ndarray, status: np.ndarray, keys: np.ndarray,
           refilled: set[int]) -> np.ndarray:
    """Keys (at their bounds) join S (``status``/``alpha`` in place). A key next to a near-twin
    already in S does not join beside it (a near-singular margin system): the twin's whole group
    (every key within ``TWIN_TOL`` of it) is refilled as the refit's read-off does -- its mass
    kept, members at C in increasing-gradient order, one margin member with the remainder, the
    rest reserve -- which leaves at most one margin member. A group is refilled once per repair
    (``refilled`` holds its smallest member): tight groups whose optimum has several margin
    members (gradient differences of second order in their distance) would cycle, so later, and
    when a refill changes nothing, the key joins beside its twin. Returns the keys whose
    coefficient changed (their G must be updated by the caller)."""
    C = p.C
    tol = SNAP_TOL * C
    S = np.flatnonzero(status == MARGIN)
    changed: list[int] = []
    close = p.fd2(keys, S) <= TWIN_TOL if S.size else np.zeros((keys.size, 0), dtype=bool)
    for r, k in enumerate(keys):
        mates = S[close[r]]
        if mates.size == 0:
            status[k] = MARGIN
            continue
        j = int(mates[0])
        mem = np.flatnonzero(p.fd2(np.array([j]), np.arange(p.n))[0] <= TWIN_TOL)
        if int(mem[0]) in refilled:
            if status[k] != MARGIN and k not in changed:
                status[k] = MARGIN
            continue
        refilled.add(int(mem[0]))
        mem = mem[np.lexsort((mem, G[mem]))]
        a_old, st_old = alpha[mem].copy(), status[mem].copy()
        rem = float(a_old.sum())
        for m_ in mem:
            if rem >= C - tol:
                alpha[m_], status[m_] = C, ERROR
                rem -= C
            elif rem > tol:
                alpha[m_], status[m_] = rem, MARGIN
                rem = 0.0
            else:
                alpha[m_], status[m_] = 0.0, RESERVE
        if np.array_equal(st_old, status[mem]) and np.array_equal(a_old, alpha[mem]):
            status[k] = MARGIN
        else:
            changed += [int(m_) for m_ in mem[alpha[mem] != a_old]]
    return np.asarray(changed, dtype=np.int64)


def repair(p: Problem, alpha: np.ndarray, G: np.ndarray, status: np.ndarray, target: float,
            max_rounds: int) -> tuple[np.ndarray, float, np.ndarray, np.ndarray, float, int, int]:
    """Primal active-set rounds from a feasible ``alpha`` (exactly at its bound off S) with
    ``G = 2 K alpha − diag K`` and ``status``: step towards the margin-system solution until a
    margin coefficient reaches a bound (it leaves S), else take it whole, snap margin coefficients
    within ``SNAP_TOL·C`` of a bound, and let keys whose gradient has the wrong sign (beyond
    ``target``) join S -- all of them, or the worst one alone after a zero-length step. The
    objective never increases and the iterate stays feasible. Returns the best full-step state:
    ``(alpha, rho, status, G, margin-system residual, rounds, moves)``."""
    C = p.C
    snap = SNAP_TOL * C
    alpha, status = alpha.copy(), status.copy()
    best = None
    moves = 0
    snapped: set[int] = set()
    refilled: set[int] = set()
    single = False
    rho, resid = float("nan"), 0.0
    for rounds in range(1, max_rounds + 1):  # noqa: B007  (the count is returned)
        a_new, rho, resid = bordered_solve(p, alpha, status)
        S = np.flatnonzero(status == MARGIN)
        D = a_new - alpha
        t, blockers = 1.0, S[:0]
        if S.size:
            dS, aS = D[S], alpha[S]
            with np.errstate(divide="ignore", invalid="ignore"):
                tm = np.where(dS < 0.0, aS / -dS, np.where(dS > 0.0, (C - aS) / dS, np.inf))
            tmin = float(tm.min())
            if tmin < 1.0:
                t = max(tmin, 0.0)
                blockers = S[tm <= tmin]
        if t >= 1.0:
            step = a_new
        else:
            step = alpha + t * D
            up = D[blockers] > 0.0
            step[blockers] = np.where(up, C, 0.0)
            status[blockers] = np.where(up, ERROR, RESERVE)
            moves += blockers.size
            single = single or t == 0.0
        d = np.flatnonzero(step != alpha)
        if d.size:
            G = G + 2.0 * p.matvec(d, step[d] - alpha[d])
        alpha = step
        if t < 1.0:
            continue
        # the margin system's solution is in the box: the bound-snap convention, then KKT signs
        S = np.flatnonzero(status == MARGIN)
        near = S[(alpha[S] <= snap) | (alpha[S] >= C - snap)]
        if near.size:
            new = np.where(alpha[near] >= C - snap, C, 0.0)
            G = G + 2.0 * p.matvec(near, new - alpha[near])
            alpha[near] = new
            status[near] = np.where(new > 0.0, ERROR, RESERVE)
            snapped.update(int(k) for k in near)
            moves += near.size
            continue
        if S.size == 0:
            rho = rho_midpoint(G, status, np.arange(p.n))
        g = rho + G
        v = kkt_violations(alpha, g, status, C)["max"]
        if best is None or v < best[0]:
            best = (v, alpha.copy(), rho, status.copy(), G.copy(), resid)
        viol = np.where(status == ERROR, g, np.where(status == RESERVE, -g, 0.0))
        # a key snapped to its bound here re-enters only if it violates by more than the snap moved
        limit = np.full(p.n, target)
        if snapped:
            limit[list(snapped)] = max(target, 4.0 * snap)
        cand = np.flatnonzero(viol > limit)
        if cand.size == 0:
            break
        if single:
            cand = cand[[int(np.argmax(viol[cand]))]]
        single = False
        before = alpha.copy()
        ch = enter_margin(p, alpha, G, status, cand, refilled)
        if ch.size:  # a near-twin group refilled: keep G consistent with the moved mass
            G = G + 2.0 * p.matvec(ch, alpha[ch] - before[ch])
        moves += cand.size
    if best is None:
        g = (rho if np.isfinite(rho) else 0.0) + G
        best = (kkt_violations(alpha, g, status, C)["max"], alpha, rho if np.isfinite(rho) else 0.0, status, G, resid)
    _, alpha, rho, status, G, resid = best
    return alpha, rho, status, G, resid, rounds, moves


def certify(p: Problem, alpha: np.ndarray, rho: float, status: np.ndarray) -> tuple[dict, np.ndarray]:
    """KKT on the gradient recomputed from scratch (blocked); returns (violations, G)."""
    G = gradient(p.X, alpha, p.sigma, p.K)
    return kkt_violations(alpha, rho + G, status, p.C), G


def margin_residual(p: Problem, alpha: np.ndarray, rho: float, status: np.ndarray) -> float:
    S = np.flatnonzero(status == MARGIN)
    if S.size == 0:
        return 0.0
    E = np.flatnonzero(status == ERROR)
    r0 = abs(float(alpha[S].sum()) - (1.0 - E.size * p.C))
    KS = 2.0 * p.block(S, S) @ alpha[S] + rho
    cS = p.diag(S) - (2.0 * p.C * p.matvec(E, np.ones(E.size), rows=S) if E.size else 0.0)
    return max(r0, float(np.abs(KS - cS).max()))
