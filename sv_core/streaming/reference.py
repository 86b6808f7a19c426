"""Slow reference for :class:`sv_core.StreamingGate`: keep every live key, re-solve from scratch.

After every operation the full-history fixed-C problem over all live keys is solved by the
independent :func:`sv_core.refit` (Clarabel + KKT polish). Same ids, same warm-up rule; no
tiers, no screening, no C&P path. Used by the tests and the benchmark checkpoints.
"""
from __future__ import annotations

import numpy as np

from sv_core.calibrate import warmup_size
from sv_core.errors import InfeasibleError, UnknownTokenError
from sv_core.kernels import rbf_kernel
from sv_core.refit import refit
from sv_core.validation import as_keys, check_params


class ReferenceStream:
    def __init__(self, C: float, sigma: float):
        self.C, self.sigma = check_params(C, sigma)
        self._keys: dict[int, np.ndarray] = {}
        self._next_id = 0
        self._dim = None
        self.alpha = np.zeros(0)
        self.rho = float("nan")

    @property
    def ids(self) -> np.ndarray:
        return np.asarray(sorted(self._keys), dtype=np.int64)

    @property
    def keys(self) -> np.ndarray:
        return np.asarray([self._keys[i] for i in self.ids]).reshape(-1, self._dim or 0)

    @property
    def gated(self) -> bool:
        return len(self._keys) >= warmup_size(self.C) or np.isfinite(self.rho)

    def _solve(self) -> None:
        n = len(self._keys)
        if not self.gated:
            self.alpha = np.full(n, 1.0 / max(n, 1))
            self.rho = float("nan")
            return
        self.alpha, self.rho = refit(self.keys, C=self.C, sigma=self.sigma)

    def admit(self, X) -> np.ndarray:
        A = as_keys(X, self._dim)
        self._dim = A.shape[1]
        ids = np.arange(self._next_id, self._next_id + A.shape[0], dtype=np.int64)
        self._next_id += A.shape[0]
        for i, x in zip(ids, A):
            self._keys[int(i)] = x.copy()
        self._solve()
        return ids

    def forget(self, token_id) -> None:
        tid = int(token_id)
        if tid not in self._keys:
            raise UnknownTokenError(f"token {tid} is not live")
        if np.isfinite(self.rho) and (len(self._keys) - 1) * self.C < 1.0 - 1e-12:
            raise InfeasibleError("(n-1) C < 1")
        del self._keys[tid]
        self._solve()

    def score(self, P) -> np.ndarray:
        P = as_keys(P, self._dim)
        return 2.0 * rbf_kernel(P, self.keys, self.sigma) @ self.alpha - self.rho


def full_history_reference(X, C: float, sigma: float, ws_size: int = 800, add: int = 400,
                           seed: int = 0, max_rounds: int = 40, kkt_tol: float = 1e-9):
    """Independent exact full-history solve for large ``n`` by decomposition around
    :func:`sv_core.refit`: solve a working set (random half + most recent half; nothing taken
    from a StreamingGate), extend by zeros, add the most violating outside keys, drop deep-inside
    zero keys, repeat until the extended solution satisfies KKT over *all* keys. The result is
    the unique full-history optimum (convexity); returns ``alpha, rho, info``.
    """
    X = as_keys(X)
    n = X.shape[0]
    if n <= ws_size:
        a, rho = refit(X, C=C, sigma=sigma, kkt_tol=kkt_tol)
        return a, rho, {"rounds": 1, "ws_final": n, "kkt_residual": None, "method": "refit"}
    rng = np.random.default_rng(seed)
    ws = np.union1d(rng.choice(n - ws_size // 2, ws_size // 2, replace=False),
                    np.arange(n - ws_size // 2, n))
    for rnd in range(1, max_rounds + 1):
        a_ws, rho = refit(X[ws], C=C, sigma=sigma, kkt_tol=kkt_tol)
        sup = a_ws > 0
        g = np.empty(n)
        for lo in range(0, n, 4096):
            g[lo:lo + 4096] = rho - 1.0 + 2.0 * (rbf_kernel(X[lo:lo + 4096], X[ws[sup]], sigma) @ a_ws[sup])
        inside = np.zeros(n, bool)
        inside[ws] = True
        viol = np.flatnonzero(~inside & (g < -1e-12))
        if viol.size == 0:
            a = np.zeros(n)
            a[ws] = a_ws
            res = float(np.maximum(-g[~inside], 0.0).max(initial=0.0))
            return a, rho, {"rounds": rnd, "ws_final": int(ws.size), "kkt_residual_outside": res,
                            "method": "working-set refit"}
        viol = viol[np.argsort(g[viol])][:add]
        keep = ws[sup | (g[ws] < 0.05)]  # drop zero keys well inside
        ws = np.union1d(keep, viol)
    raise RuntimeError(f"full_history_reference did not converge in {max_rounds} rounds")
