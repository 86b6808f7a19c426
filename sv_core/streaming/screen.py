"""Screening arithmetic of :class:`sv_core.StreamingGate`: tolerances, hot-state views and the
per-operation drift bound.

A cold key ``j`` (alpha_j = 0) stays inert while ``g_j = rho - 1 + 2 <phi(x_j), w> >= 0`` with
``w = sum_i alpha_i phi(x_i)`` (RBF: ``||phi(x)|| = k(x, x) = 1`` and ``0 < k <= 1``). One operation
moves the hot state from ``(alpha0, rho0)`` to ``(alpha1, rho1)`` (every token hot at either end
counts, alpha = 0 while not hot); with ``Delta w = sum_i Delta alpha_i phi(x_i)``::

    g_j(1) - g_j(0) = Delta rho + 2 <phi(x_j), Delta w>
        >= Delta rho - 2 min( sum_i (Delta alpha_i)^- ,  ||Delta w|| )

(``0 < k <= 1`` for the first term, Cauchy-Schwarz with ``||phi(x_j)|| = 1`` for the second).
Summed over operations the ``Delta rho`` terms telescope, so one global budget
``b = sum_ops min(...)`` serves every cold key: a key last computed exactly at ``t0`` keeps
``tau_j = g_j(t0) - rho(t0) + 2 b(t0)`` and ``g_j(t) >= tau_j + rho(t) - 2 b(t)``. It is
recomputed only when that lower bound falls below ``SCREEN_MARGIN``.

``||Delta w||`` without a kernel over the whole support: ``||Delta w||^2 = sum_i Delta alpha_i
f_i`` with ``f_i = <phi(x_i), Delta w> = (g_i(1) - g_i(0) - Delta rho) / 2``. A key that is a
margin key (``0 < alpha < C``) at both ends has ``|g_i| <= MARGIN_KKT_EPS`` at both (the hot gate's
KKT guard), so ``f_i = -Delta rho / 2`` up to ``MARGIN_KKT_EPS``; only the few other changed
keys (the admitted or forgotten key, keys that changed set) need kernel rows. When the hot gate
took its exact fallback or an SMO tightening in the operation (partition possibly re-read), or
many keys changed set, the quadratic form ``Delta alpha^T K Delta alpha`` is computed directly.
Both forms are inflated far above their rounding error; ``SCREEN_MARGIN`` absorbs the rest.
"""
from __future__ import annotations

import math

import numpy as np

from sv_core.kernels import rbf_kernel, rbf_matvec

#: a cold key re-enters the hot gate when its exact gradient is below ``-READMIT_TOL``
READMIT_TOL = 1e-12
#: a cold key is skipped only while its lower bound on ``g_j`` is at least this (absorbs rounding)
SCREEN_MARGIN = 1e-9
#: full-history KKT residual up to which the certificate calls the state future-safe
KKT_TOL = 1e-9
#: bound on |g| of a margin key of a solved hot state (the gate's guard is 1e-9; a loaded state
#: is accepted up to 1e-8)
MARGIN_KKT_EPS = 1e-8
#: at most this many changed keys outside the margin set use the margin identity
IDENTITY_MAX = 256


class HotView:
    """Arrays of the hot gate at one moment (ids, alpha, keys, rho, support), for screening.

    ``marks`` are the gate's fallback and tightening counters: equal marks at both ends of an
    operation mean the maintained path (whose partition follows alpha) ran throughout.
    """

    __slots__ = ("ids", "alpha", "keys", "rho", "gated", "Xs", "As", "marks", "sigma")

    def __init__(self, gate):
        self.gated = bool(gate.gated)
        self.sigma = float(gate.sigma)
        self.ids = np.asarray(gate.ids, dtype=np.int64)
        self.keys = gate.keys
        n = self.ids.size
        self.alpha = gate.alpha if self.gated else np.zeros(n)
        self.rho = float(gate.rho) if self.gated else float("nan")
        sup = np.flatnonzero(self.alpha != 0.0)
        self.Xs = self.keys[sup] if n else np.zeros((0, 0))
        self.As = self.alpha[sup]
        self.marks = (int(getattr(gate, "fallbacks", 0)), int(getattr(gate, "tightenings", 0)))

    def h(self, P: np.ndarray) -> np.ndarray:
        """``sum_i alpha_i k(p, x_i)`` for rows of ``P`` (m, d) -> (m,)."""
        if self.As.size == 0:
            return np.zeros(P.shape[0])
        return rbf_matvec(P, self.Xs, self.As, self.sigma)  # in cache-sized blocks of kernel rows

    def exact_g(self, P: np.ndarray) -> np.ndarray:
        """Exact ``g = rho - 1 + 2 sum_i alpha_i k(p, x_i)`` of keys ``P`` (K_pp = 1)."""
        return self.rho - 1.0 + 2.0 * self.h(P)

    def kkt(self, C: float) -> dict[str, float]:
        """KKT violations of this hot state recomputed from its keys (sum, box, gradients),
        partition read off alpha (0 reserve, C error, else margin)."""
        a = self.alpha
        g = self.exact_g(self.keys) if a.size else np.zeros(0)
        res, err = a == 0.0, a == C
        mar = ~(res | err)
        out = {"sum": float(abs(a.sum() - 1.0)),
               "box": float(max(0.0, -a.min(initial=0.0), (a - C).max(initial=0.0))),
               "margin_gradient": float(np.abs(g[mar]).max(initial=0.0)),
               "error_gradient": float(np.maximum(g[err], 0.0).max(initial=0.0)),
               "reserve_gradient": float(np.maximum(-g[res], 0.0).max(initial=0.0))}
        out["max"] = max(out.values())
        return out

    def partition_counts(self, C: float) -> dict[str, int]:
        a = self.alpha
        n_res, n_err = int((a == 0.0).sum()), int((a == C).sum())
        return {"margin": int(a.size) - n_res - n_err, "error": n_err, "reserve": n_res}


def step_bound(vb: HotView, va: HotView, C: float, sigma: float) -> tuple[float, float]:
    """Screening increments of one operation from hot state ``vb`` to ``va`` (both solved).

    Returns ``(sum_i (Delta alpha_i)^-, upper bound on ||Delta w||)``; the budget grows by the
    smaller of the two (module docstring)."""
    u = np.union1d(vb.ids, va.ids)
    pb, pa = np.searchsorted(u, vb.ids), np.searchsorted(u, va.ids)
    ab, aa = np.zeros(u.size), np.zeros(u.size)
    ab[pb] = vb.alpha
    aa[pa] = va.alpha
    d = aa - ab
    nz = np.flatnonzero(d)
    if nz.size == 0:
        return 0.0, 0.0
    dn = d[nz]
    l1 = float(np.abs(dn).sum())
    neg = float(np.maximum(-dn, 0.0).sum())
    if neg <= SCREEN_MARGIN * 1e-3:  # rounding-level changes: the L1 term is already tiny
        return neg, math.inf
    keys = np.zeros((u.size, va.keys.shape[1] if va.keys.size else vb.keys.shape[1]))
    if vb.ids.size:
        keys[pb] = vb.keys
    if va.ids.size:
        keys[pa] = va.keys
    if vb.marks == va.marks:
        a0, a1 = ab[nz], aa[nz]
        both = (a0 > 0.0) & (a0 < C) & (a1 > 0.0) & (a1 < C)
        other = nz[~both]
        if other.size <= IDENTITY_MAX:
            XO = keys[other]
            fO = va.h(XO) - vb.h(XO)
            q = (-0.5 * (va.rho - vb.rho) * float(dn[both].sum()) + float(dn[~both] @ fO)
                 + MARGIN_KKT_EPS * l1)
            return neg, math.sqrt(max(q, 0.0))
    Xn = keys[nz]
    q = float(dn @ (rbf_kernel(Xn, Xn, sigma) @ dn)) + 1e-10 * l1 * l1
    return neg, math.sqrt(max(q, 0.0))


def alpha_change(ids_b, a_b, keys_b, ids_a, a_a, keys_a, sigma: float) -> tuple[float, float]:
    """Screening increments between two solved hot states by the direct quadratic form.

    Returns ``(sum_i (Delta alpha_i)^-, ||Delta w||)`` over the union of ids (absent = 0), with
    ``||Delta w||^2 = Delta alpha^T K Delta alpha`` (K over the changed keys) inflated by
    ``1e-12 (sum |Delta alpha|)^2``, far above its fp64 rounding error. The slow reference of
    :func:`step_bound` (kept with its original signature).
    """
    ids_b = np.asarray(ids_b, np.int64)
    ids_a = np.asarray(ids_a, np.int64)
    u = np.union1d(ids_b, ids_a)
    d = np.zeros(u.size)
    pb, pa = np.searchsorted(u, ids_b), np.searchsorted(u, ids_a)
    d[pb] -= a_b
    d[pa] += a_a
    nz = np.flatnonzero(d)
    if nz.size == 0:
        return 0.0, 0.0
    keys = np.zeros((u.size, np.shape(keys_a)[1] if np.size(keys_a) else np.shape(keys_b)[1]))
    if ids_b.size:
        keys[pb] = keys_b
    if ids_a.size:
        keys[pa] = keys_a
    dn = d[nz]
    q = float(dn @ (rbf_kernel(keys[nz], keys[nz], sigma) @ dn))
    l1 = float(np.abs(dn).sum())
    return float(np.maximum(-dn, 0.0).sum()), math.sqrt(max(q, 0.0) + 1e-12 * l1 * l1)
