"""Bordered-inverse algebra of the maintained C&P solver (mixin of :class:`MaintainedSVDD`).

The margin system is ``M u = c`` with ``M = [[0, 1^T], [1, 2 K_SS]]``, ``u = (rho, alpha_S)``.
``Rinv = M^{-1}`` is kept by rank-one border updates when a key enters S and Schur downdates when
one leaves, with a refactorisation every ``refactor_every`` updates and whenever a conditioning
guard trips; :meth:`BorderedMixin.polish` re-solves the system (with one step of iterative
refinement) and applies the bound-snap and empty-margin rho conventions. The status codes and
tolerances live in :mod:`sv_core._state` (re-exported here and by :mod:`sv_core.solver`).
"""
from __future__ import annotations

import numpy as np

from sv_core._state import (
    DUPLICATE_TOL,
    ERROR,
    INVERSE_GUARD,
    MARGIN,
    POLISH_EVERY,
    RESERVE,
    SNAP_TOL,
    Degenerate,
    FloatArray,
    IntArray,
    SolverState,
)
from sv_core.errors import PathError
from sv_core.smo import gradient

_KEEP: dict[tuple[int, int], IntArray] = {}


def _drop(R: FloatArray, r: int) -> FloatArray:
    """``R`` (square) without row and column ``r``."""
    m = R.shape[0]
    keep = _KEEP.get((m, r))
    if keep is None:
        keep = np.delete(np.arange(m), r)
        if m <= 96:  # small margin systems recur: keep their index vectors
            _KEEP[(m, r)] = keep
    return R.take(keep, axis=0).take(keep, axis=1)


def rho_midpoint(g_at_rho0: FloatArray, status: np.ndarray, idx: np.ndarray) -> float:
    """Midpoint of the KKT interval for rho when the margin set is empty.

    ``g_at_rho0`` holds ``g_i`` evaluated at ``rho = 0``; reserve keys need ``rho >= -g_i``,
    error keys ``rho <= -g_i``.
    """
    st = status[idx]
    g0 = g_at_rho0[idx]
    lo = (-g0[st == RESERVE]).max(initial=-np.inf)
    hi = (-g0[st == ERROR]).min(initial=np.inf)
    if np.isfinite(lo) and np.isfinite(hi):
        return float(0.5 * (lo + hi))
    if np.isfinite(lo):
        return float(lo)
    if np.isfinite(hi):
        return float(hi)
    return 0.0


class BorderedMixin(SolverState):
    """Margin-system algebra over the solver's arrays (``K``, ``kd``, ``alpha``, ``g``, ``S``)."""

    def _cvec(self) -> FloatArray:
        """Right-hand side ``c`` of ``M u = c`` given all non-margin coefficients."""
        S, B = self.margin_rows()
        n = self.n_slots
        a = self.alpha[:n].copy()
        a[S] = 0.0  # fixed (non-margin) coefficients only; dead slots hold 0
        c = B @ a  # (sum a, 2 K[S, :] a)
        np.negative(c, out=c)
        c[0] += 1.0
        c[1:] += self.kd[S]
        return c

    def _bordered(self) -> FloatArray:
        S, B = self.margin_rows()
        m = S.size
        M = np.empty((m + 1, m + 1))
        M[:, 1:] = B[:, S]
        M[1:, 0] = 1.0
        M[0, 0] = 0.0
        return M

    def refactor(self) -> None:
        """Recompute ``Rinv = M^{-1}`` from scratch."""
        M = self._bordered()
        try:
            self.Rinv = np.asarray(np.linalg.inv(M), dtype=np.float64)
        except np.linalg.LinAlgError as exc:  # pragma: no cover - guarded by callers
            raise PathError(f"bordered KKT matrix is singular with |S|={len(self.S)}") from exc
        self._updates = 0
        self.refactorisations += 1

    def _border_add(self, k: int, near_tol: float = 0.0) -> None:
        """Add slot k to the margin set (rank-one border update of ``Rinv``).

        Raises ``Degenerate(k, j)`` if k duplicates margin key j (equal keys; else, or without
        stored keys, feature-space squared distance ``<= DUPLICATE_TOL``), ``Degenerate(k, j,
        "near")`` if it is a distinct near-twin of j (``<= near_tol``; checked first when keys are
        stored), and ``Degenerate(k)`` if its Schur complement is ~0.
        """
        S, B = self.margin_rows()
        v = B[:, k]  # (1, 2 K[S, k])
        b = self.Rinv @ v
        np.negative(b, out=b)
        kkk = float(self.K[k, k])
        kappa = 2.0 * kkk + float(v @ b)
        scale = max(1.0, 2.0 * kkk)
        if S.size:
            # exact duplicate of a margin key (feature-space distance ~0): M would be singular
            d2 = self.kd[S] + kkk - v[1:]  # v[1:] = 2 K[S, k]
            j = int(d2.argmin())
            dj = float(d2[j])
            if self._keyed and dj <= max(near_tol, 1e-6):
                # (bit-equal keys have feature distance at rounding level, so only then look)
                same = np.flatnonzero((self.X[S] == self.X[k]).all(axis=1))
                if same.size:
                    raise Degenerate(int(k), int(S[same[0]]))
                if dj <= near_tol:
                    raise Degenerate(int(k), int(S[j]), "near")
            if dj <= DUPLICATE_TOL:
                raise Degenerate(int(k), int(S[j]))
            if dj <= near_tol:
                raise Degenerate(int(k), int(S[j]), "near")
        if S.size and kappa <= 1e-6 * scale and self._updates > 0:
            # conditioning guard: a small Schur complement is computed with a fresh inverse
            self.refactor()
            b = self.Rinv @ v
            np.negative(b, out=b)
            kappa = 2.0 * kkk + float(v @ b)
        if S.size and kappa <= self.GUARD * scale:
            raise Degenerate(int(k))
        self._S.append(int(k))
        self._rows_append(int(k))
        self._updates += 1
        if S.size == 0 or self._updates >= self.refactor_every:
            self.refactor()
            return
        m = S.size + 1
        bb = np.empty(m + 1)
        bb[:m] = b
        bb[m] = 1.0
        R = np.multiply.outer(bb, bb)
        R /= kappa
        R[:m, :m] += self.Rinv
        self.Rinv = R

    def _border_remove(self, k: int) -> None:
        p = self._S.index(int(k))
        r = p + 1
        R = self.Rinv
        piv = float(R[r, r])
        self._S.pop(p)
        self._rows_delete(p)
        self._updates += 1
        if abs(piv) < 1e-14 or self._updates >= self.refactor_every or not self._S:
            if self._S:
                self.refactor()
            else:
                self.Rinv = np.zeros((1, 1))
            return
        self.Rinv = _drop(R - np.multiply.outer(R[:, r], R[r, :] / piv), r)

    def _set_margin_solution(self, rho: float, aS: FloatArray) -> None:
        """Set ``(rho, alpha_S)`` and update g incrementally: ``g += d rho + 2 K[:, S] d alpha_S``
        (O(|S| n) instead of the O(n^2) recompute; exact recomputes happen every
        ``G_REFRESH`` operations and whenever the KKT guard trips)."""
        n = self.n_slots
        S, B = self.margin_rows()
        w = np.empty(S.size + 1)
        w[0] = rho - self.rho
        np.subtract(aS, self.alpha[S], out=w[1:])
        self.alpha[S] = aS
        self.rho = rho
        self.g[:n] += w @ B
        self.g[S] = 0.0  # the margin system was just solved: g_S = 0 up to its residual

    def _resolve_margin(self) -> bool:
        """Re-solve ``(rho, alpha_S)`` on the current partition and recompute g exactly.

        Accepted only if the re-solved margin coefficients stay inside the box (up to
        ``SNAP_TOL * C``): on an ill-conditioned margin system the re-solve can jump out of it,
        and the tracked path values (whose gradient is consistent with them) are then kept.
        """
        u = self.Rinv @ self._cvec()
        tol = SNAP_TOL * self.C
        if not (np.isfinite(u).all() and u[1:].min() >= -tol and u[1:].max() <= self.C + tol):
            return False
        self._set_margin_solution(float(u[0]), np.clip(u[1:], 0.0, self.C))
        return True

    def polish(self) -> None:
        """Re-solve ``u = Rinv c`` on the margin set and update g (end of every operation).

        With S empty, ``rho`` is not unique; it is set to the midpoint of its KKT interval
        (the same convention as :func:`sv_core.refit`).
        """
        tol = SNAP_TOL * self.C
        while self._S:
            cv = self._cvec()
            u = self.Rinv @ cv
            M = self._bordered()
            r = cv - M @ u
            if np.abs(r).max() > INVERSE_GUARD:
                # conditioning guard: the maintained inverse has drifted; refactorise
                self.refactor()
                u = np.asarray(np.linalg.solve(M, cv), dtype=np.float64)
            else:
                u += self.Rinv @ r  # one step of iterative refinement
            S, _ = self.margin_rows()
            aS = u[1:]
            low = aS <= tol
            high = aS >= self.C - tol
            if not (low.any() or high.any()):
                self._set_margin_solution(float(u[0]), aS)
                return
            # a margin coefficient sitting on its bound: the partition is degenerate and rho
            # is not pinned by it; move it to the bound so rho follows the canonical convention
            for k, lo_, hi_ in zip(S.tolist(), low.tolist(), high.tolist()):
                if lo_ or hi_:
                    self._risky = True
                    new = 0.0 if lo_ else self.C
                    n = self.n_slots
                    self.g[:n] += 2.0 * (new - self.alpha[k]) * self.K[k, :n]
                    self.alpha[k] = new
                    self.status[k] = RESERVE if lo_ else ERROR
                    self._border_remove(int(k))
                    break
        if not self._S:
            n = self.n_slots
            rho = rho_midpoint(self.g[:n] - self.rho, self.status[:n], self.live())
            self.g[:n] += rho - self.rho
            self.rho = rho

    def finish(self) -> None:
        """End-of-operation re-solve of the margin system, when it matters: the path keeps
        ``(rho, alpha_S)`` on the KKT manifold to the accuracy of the maintained inverse, so
        :meth:`polish` runs every ``POLISH_EVERY`` operations, after degenerate handling, with S
        empty (rho convention) and whenever a margin coefficient sits within ``SNAP_TOL * C`` of
        a bound (snap convention)."""
        self._since_polish += 1
        if self._S and not self._risky and self._since_polish < POLISH_EVERY:
            S, _ = self.margin_rows()
            aS = self.alpha[S]
            tol = SNAP_TOL * self.C
            if aS[aS.argmin()] > tol and aS[aS.argmax()] < self.C - tol:
                return
        self.polish()
        self._since_polish = 0

    def kkt_residual(self) -> dict[str, float]:
        """KKT violations recomputed from scratch (not from the maintained g): from the stored
        kernel, or (deferred, no kernel stored) from blocked kernel products over the support
        (:func:`sv_core.smo.gradient`, O(block) memory). ``inverse`` is ``||M Rinv - I||`` of the
        maintained bordered inverse (0 when S is empty or no inverse is built)."""
        live = self.live()
        a = self.alpha[live]
        st = self.status[live]
        if self._kn < self.n_slots:
            g = self.rho + gradient(self.X[live], a, self.sigma)
        else:
            sup = live[a != 0.0]
            g = self.rho - self.kd[live] + 2.0 * (self.K[np.ix_(live, sup)] @ self.alpha[sup])
        out = {
            "sum": float(abs(a.sum() - 1.0)),
            "box": float(max(0.0, -a.min(initial=0.0), (a - self.C).max(initial=0.0))),
            "margin_gradient": float(np.abs(g[st == MARGIN]).max(initial=0.0)),
            "error_gradient": float(np.maximum(g[st == ERROR], 0.0).max(initial=0.0)),
            "reserve_gradient": float(np.maximum(-g[st == RESERVE], 0.0).max(initial=0.0)),
        }
        if self._S and not self.deferred:
            M = self._bordered()
            # diagnostic only: ||M Rinv - I|| grows with cond(M) even when the solution is exact
            out["inverse"] = float(np.abs(M @ self.Rinv - np.eye(M.shape[0])).max())
        else:
            out["inverse"] = 0.0
        out["max"] = max(v for k, v in out.items() if k != "inverse")
        return out
