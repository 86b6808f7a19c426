"""The independent refit as audit oracle of the retention study's certified solve.

The retention study solves each stay with :func:`sv_core.solve` (fast, certified by its own KKT
check). The independent from-scratch solver :func:`sv_core.refit` (interior point, then the
partition's exact system) is run here on a deterministic sample of stays — never on every stay —
and the two solutions are compared (:func:`audit_stay`): max |Δ gate score| over the stay's keys,
max |Δα|, partition agreement (share of keys in the same set: margin, error, reserve), and the
largest KKT violation of each. :func:`audit_summary` reports medians, the worst stay and the
denominator. Stays longer than :data:`AUDIT_MAX_HOURS` are not audited (the refit forms the
n × n Gram matrix; a 10,000-hour stay needs gigabytes) and are counted as skipped.

:func:`score_gap` is also the gate-vs-solve check of the retention flow (the maintained gate
built from the solve's coefficients against the solve itself).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["AUDIT_MAX_HOURS", "AUDIT_STAYS", "decision_values", "rho_from_alpha", "score_gap", "audit_stay",
           "audit_summary"]

#: longest stay the refit audit runs on (its memory and time grow ≈ n²–n^2.4)
AUDIT_MAX_HOURS = 2048
#: default size of the audit sample (the first stays with an event in the seeded order)
AUDIT_STAYS = 50


def decision_values(X: np.ndarray, alpha: np.ndarray, sigma: float) -> np.ndarray:
    """``f(x_i) = 2 Σ_j α_j κ(x_i, x_j)`` over the keys, shape (n,), in blocks (never the n × n matrix)."""
    from sv_core.kernels import rbf_matvec

    sup = np.flatnonzero(alpha != 0.0)
    return 2.0 * rbf_matvec(X, X[sup], alpha[sup], sigma)


def rho_from_alpha(f: np.ndarray, alpha: np.ndarray, C: float, tol: float = 1e-9) -> float:
    """The offset ρ of a solution, from its margin keys (``ρ = κ(x,x) − f(x) = 1 − f(x)`` on
    ``0 < α < C``, averaged); without margin keys, the midpoint of the interval the error and
    reserve keys allow."""
    margin = (alpha > tol * C) & (alpha < C * (1.0 - tol))
    if margin.any():
        return float(np.mean(1.0 - f[margin]))
    lo = (1.0 - f[alpha <= tol * C]).max(initial=-np.inf)
    hi = (1.0 - f[alpha >= C * (1.0 - tol)]).min(initial=np.inf)
    if np.isfinite(lo) and np.isfinite(hi):
        return 0.5 * (lo + hi)
    return float(lo if np.isfinite(lo) else hi)


def score_gap(X: np.ndarray, alpha: np.ndarray, C: float, sigma: float, scores: np.ndarray) -> float:
    """Max |scores − s(x)| over the keys, ``s(x) = f(x) − ρ`` of the solution ``alpha``."""
    f = decision_values(X, alpha, sigma)
    return float(np.abs(np.asarray(scores) - (f - rho_from_alpha(f, alpha, C))).max())


def audit_stay(X: Any, C: float, sigma: float) -> dict[str, Any]:
    """Certified solve and independent refit of one stay's fixed-C problem, compared.

    Returns ``{"n", "score_dev", "alpha_dev", "partition_agreement", "partition_match",
    "solve_kkt", "refit_kkt", "solve_fallback"}`` (``score_dev`` = max |s_solve − s_refit| over the
    stay's keys, each score with its own ρ); when the refit raises :class:`sv_core.RefitError`,
    ``{"n", "refit_failed": True, "solve_kkt", "solve_fallback"}``.
    """
    from sv_core import RefitError, refit, solve

    X = np.ascontiguousarray(X, dtype=np.float64)
    sol = solve(X, C=C, sigma=sigma)
    try:
        a_ref, rho_ref, info = refit(X, C=C, sigma=sigma, return_info=True)
    except RefitError:  # the oracle itself did not converge: counted, never silently dropped
        return {"n": int(X.shape[0]), "refit_failed": True, "solve_kkt": float(sol.certificate.kkt_violation),
                "solve_fallback": int(sol.certificate.fallbacks)}
    s_sol = decision_values(X, sol.alpha, sigma) - sol.rho
    s_ref = decision_values(X, a_ref, sigma) - rho_ref
    same = np.asarray(sol.status) == np.asarray(info["status"])
    return {"n": int(X.shape[0]), "score_dev": float(np.abs(s_sol - s_ref).max()),
            "alpha_dev": float(np.abs(sol.alpha - a_ref).max()), "partition_agreement": float(same.mean()),
            "partition_match": bool(same.all()), "solve_kkt": float(sol.certificate.kkt_violation),
            "refit_kkt": float(info["kkt_violation"]), "solve_fallback": int(sol.certificate.fallbacks)}


def audit_summary(rows: Sequence[dict[str, Any]], *, candidates: int, skipped_long: int) -> dict[str, Any]:
    """Aggregates of :func:`audit_stay` rows: medians, worst, denominators (no per-stay value)."""
    failed = [r for r in rows if r.get("refit_failed")]
    rows = [r for r in rows if not r.get("refit_failed")]
    out: dict[str, Any] = {
        "oracle": "sv_core.refit (independent interior-point solve + exact partition system)",
        "sample": f"the first {candidates} stays with an event in the seeded order (sv_core.solve vs sv_core.refit)",
        "stays_audited": len(rows), "refit_failures": len(failed),
        "stays_skipped_longer_than": {"hours": AUDIT_MAX_HOURS, "stays": int(skipped_long)},
    }
    if not rows:
        return out
    col = {k: np.array([r[k] for r in rows], dtype=np.float64) for k in
           ("score_dev", "alpha_dev", "partition_agreement", "solve_kkt", "refit_kkt")}
    out.update({
        "score_dev_median": float(np.median(col["score_dev"])), "score_dev_max": float(col["score_dev"].max()),
        "alpha_dev_max": float(col["alpha_dev"].max()),
        "partition_agreement_median": float(np.median(col["partition_agreement"])),
        "partition_agreement_min": float(col["partition_agreement"].min()),
        "partition_exact_matches": int(sum(bool(r["partition_match"]) for r in rows)),
        "solve_kkt_median": float(np.median(col["solve_kkt"])), "solve_kkt_max": float(col["solve_kkt"].max()),
        "refit_kkt_max": float(col["refit_kkt"].max()),
        "solve_fallbacks": int(sum(int(r["solve_fallback"]) for r in rows)),
    })
    return out
