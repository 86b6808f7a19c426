"""Bordered-inverse algebra of the maintained C&P solver (mixin of :class:`MaintainedSVDD`).

The margin system is ``M u = c`` with ``M = [[0, 1^T], [1, 2 K_SS]]``, ``u = (rho, alpha_S)``.
``Rinv = M^{-1}`` is kept by rank-one border updates when a key enters S and Schur downdates when
one leaves, with a refactorisation every ``refactor_every`` updates and whenever a conditioning
guard trips; :meth:`BorderedMixin.polish` re-solves the system (with one step of iterative
refinement) and applies the bound-snap and empty-margin rho conventions. Also holds the status
codes and tolerances shared by the solver modules.
"""
from __future__ import annotations

import numpy as np

from .errors import PathError

RESERVE, MARGIN, ERROR, PENDING, DEAD = 0, 1, 2, 3, -1
#: a margin coefficient within SNAP_TOL * C of a bound is snapped to it at the end of an operation
SNAP_TOL = 1e-10
#: residual of the bordered system above which the maintained inverse is refactorised
INVERSE_GUARD = 1e-11
#: feature-space squared distance below which two keys are treated as exact duplicates (keys
#: that are bit-for-bit equal always are; with stored keys, a distinct key this close to a margin
#: key on the C&P path is handled as a near-twin, see ``NEAR_TWIN_TOL``)
DUPLICATE_TOL = 1e-12
#: feature-space squared distance below which a key reaching the margin set next to a margin key
#: is a *near-twin*: instead of joining S beside it (a near-singular bordered system) it swaps in
NEAR_TWIN_TOL = 1e-9
#: operations between exact recomputes of the gradient (it is updated incrementally in between)
G_REFRESH = 32
#: operations between unconditional re-solves of the margin system (see ``finish``)
POLISH_EVERY = 8
#: margin rates |beta| above this mark an operation as ill-conditioned: its end recomputes g
RISKY_RATE = 1e3
_NAMES = {RESERVE: "reserve", MARGIN: "margin", ERROR: "error", PENDING: "pending"}


class _Degenerate(Exception):
    """A key cannot join the margin set: its Schur complement is ~0 (it duplicates margin keys)."""


def rho_midpoint(g_at_rho0: np.ndarray, status: np.ndarray, idx: np.ndarray) -> float:
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


class BorderedMixin:
    """Margin-system algebra over the solver's arrays (``K``, ``kd``, ``alpha``, ``g``, ``S``)."""

    def _cvec(self) -> np.ndarray:
        """Right-hand side ``c`` of ``M u = c`` given all non-margin coefficients."""
        S = np.asarray(self.S, dtype=np.int64)
        n = self.n_slots
        a = self.alpha[:n].copy()
        a[S] = 0.0  # fixed (non-margin) coefficients only; dead slots hold 0
        c = np.empty(S.size + 1)
        c[0] = 1.0 - a.sum()
        c[1:] = self.kd[S] - 2.0 * (self.K[S, :n] @ a)
        return c

    def _bordered(self) -> np.ndarray:
        S = np.asarray(self.S, dtype=np.int64)
        m = S.size
        M = np.zeros((m + 1, m + 1))
        M[0, 1:] = 1.0
        M[1:, 0] = 1.0
        M[1:, 1:] = 2.0 * self.K[np.ix_(S, S)]
        return M

    def refactor(self) -> None:
        """Recompute ``Rinv = M^{-1}`` from scratch."""
        M = self._bordered()
        try:
            self.Rinv = np.linalg.inv(M)
        except np.linalg.LinAlgError as exc:  # pragma: no cover - guarded by callers
            raise PathError(f"bordered KKT matrix is singular with |S|={len(self.S)}") from exc
        self._updates = 0
        self.refactorisations += 1

    def _border_add(self, k: int, near_tol: float = 0.0) -> None:
        """Add slot k to the margin set (rank-one border update of ``Rinv``).

        Raises ``_Degenerate(k, j)`` if k duplicates margin key j (equal keys; else, or without
        stored keys, feature-space squared distance ``<= DUPLICATE_TOL``), ``_Degenerate(k, j,
        "near")`` if it is a distinct near-twin of j (``<= near_tol``; checked first when keys are
        stored), and ``_Degenerate(k)`` if its Schur complement is ~0.
        """
        S = np.asarray(self.S, dtype=np.int64)
        v = np.empty(S.size + 1)
        v[0] = 1.0
        v[1:] = 2.0 * self.K[S, k]
        b = -self.Rinv @ v
        kappa = 2.0 * self.K[k, k] + v @ b
        scale = max(1.0, 2.0 * self.K[k, k])
        if S.size:
            # exact duplicate of a margin key (feature-space distance ~0): M would be singular
            d2 = self.kd[S] + self.K[k, k] - v[1:]  # v[1:] = 2 K[S, k]
            j = int(np.argmin(d2))
            if self._keyed and d2[j] <= max(near_tol, 1e-6):
                # (bit-equal keys have feature distance at rounding level, so only then look)
                same = np.flatnonzero((self.X[S] == self.X[k]).all(axis=1))
                if same.size:
                    raise _Degenerate(int(k), int(S[same[0]]))
                if d2[j] <= near_tol:
                    raise _Degenerate(int(k), int(S[j]), "near")
            if d2[j] <= DUPLICATE_TOL:
                raise _Degenerate(int(k), int(S[j]))
            if d2[j] <= near_tol:
                raise _Degenerate(int(k), int(S[j]), "near")
        if S.size and kappa <= 1e-6 * scale and self._updates > 0:
            # conditioning guard: a small Schur complement is computed with a fresh inverse
            self.refactor()
            b = -self.Rinv @ v
            kappa = 2.0 * self.K[k, k] + v @ b
        if S.size and kappa <= self.GUARD * scale:
            raise _Degenerate(int(k))
        self.S.append(int(k))
        self._updates += 1
        if S.size == 0 or self._updates >= self.refactor_every:
            self.refactor()
            return
        m = S.size + 1
        R = np.zeros((m + 1, m + 1))
        R[:m, :m] = self.Rinv
        bb = np.append(b, 1.0)
        R += np.outer(bb, bb) / kappa
        self.Rinv = R

    def _border_remove(self, k: int) -> None:
        p = self.S.index(int(k))
        r = p + 1
        R = self.Rinv
        piv = R[r, r]
        self.S.pop(p)
        self._updates += 1
        if abs(piv) < 1e-14 or self._updates >= self.refactor_every or not self.S:
            if self.S:
                self.refactor()
            else:
                self.Rinv = np.zeros((1, 1))
            return
        keep = np.arange(R.shape[0])
        keep = keep[keep != r]
        Rk = R[keep][:, keep]
        Rk -= np.outer(R[keep, r], R[r, keep] / piv)
        self.Rinv = Rk

    def _set_margin_solution(self, S: np.ndarray, rho: float, aS: np.ndarray) -> None:
        """Set ``(rho, alpha_S)`` and update g incrementally: ``g += d rho + 2 K[:, S] d alpha_S``
        (O(|S| n) instead of the O(n^2) recompute; exact recomputes happen every
        ``G_REFRESH`` operations and whenever the KKT guard trips)."""
        n = self.n_slots
        da = aS - self.alpha[S]
        drho = rho - self.rho
        self.alpha[S] = aS
        self.rho = rho
        self.g[:n] += drho + 2.0 * (da @ self.K[S, :n])
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
        self._set_margin_solution(np.asarray(self.S, dtype=np.int64), float(u[0]),
                                  np.clip(u[1:], 0.0, self.C))
        return True

    def polish(self) -> None:
        """Re-solve ``u = Rinv c`` on the margin set and update g (end of every operation).

        With S empty, ``rho`` is not unique; it is set to the midpoint of its KKT interval
        (the same convention as :func:`sv_core.refit`).
        """
        tol = SNAP_TOL * self.C
        while self.S:
            cv = self._cvec()
            u = self.Rinv @ cv
            M = self._bordered()
            r = cv - M @ u
            if np.abs(r).max() > INVERSE_GUARD:
                # conditioning guard: the maintained inverse has drifted; refactorise
                self.refactor()
                u = np.linalg.solve(M, cv)
            else:
                u += self.Rinv @ r  # one step of iterative refinement
            S = np.asarray(self.S, dtype=np.int64)
            aS = u[1:]
            low = aS <= tol
            high = aS >= self.C - tol
            if not (low.any() or high.any()):
                self._set_margin_solution(S, float(u[0]), aS)
                return
            # a margin coefficient sitting on its bound: the partition is degenerate and rho
            # is not pinned by it; move it to the bound so rho follows the canonical convention
            for k, lo_, hi_ in zip(S, low, high):
                if lo_ or hi_:
                    self._risky = True
                    new = 0.0 if lo_ else self.C
                    n = self.n_slots
                    self.g[:n] += 2.0 * (new - self.alpha[k]) * self.K[k, :n]
                    self.alpha[k] = new
                    self.status[k] = RESERVE if lo_ else ERROR
                    self._border_remove(int(k))
                    break
        if not self.S:
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
        if self.S and not self._risky and self._since_polish < POLISH_EVERY:
            aS = self.alpha[self.S]
            tol = SNAP_TOL * self.C
            if aS.min() > tol and aS.max() < self.C - tol:
                return
        self.polish()
        self._since_polish = 0

