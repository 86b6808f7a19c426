"""Certified event-hour retention per ICU stay (seed 001 §5), split into a per-stay map and an
aggregation so the map can run as Prefect tasks.

Per stay with at least one event hour:

* keys = z-scored vitals (6-d; 5-d for the held-out SpO₂ control, the SpO₂ column removed);
* the gate is solved exactly at ``C = 1/(ν·n)`` (ν = 0.3, σ = 3, the whole stay) by the
  independent fp64 refit (:class:`evaluation.policies.SupportVectorPolicy`); budget
  ``k = |S∪E|``; SV, H2O-style density, recency, random and the key-only peers (ridge and
  kernel leverage, KeyDiff; :mod:`evaluation.peers`) each keep ``k`` hours;
* optionally the maintained gate (:class:`sv_core.Gate`) is built from that same refit's
  solution (:meth:`sv_core.Gate.from_solution`: partition read off, margin system re-solved,
  KKT guard checked; no second solve), checked against the refit (max |Δα|, max gate-score
  gap) and returned for persistence in the warehouse.

Aggregation (:func:`aggregate`): mean retention over stays with ≥ 1 event, paired SV − baseline
differences with a stay-level percentile bootstrap (10,000×, seed 0) — the arithmetic of
:func:`evaluation.retention.compare_retention`, which is the serial reference it is tested against.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cohort.streams import iter_stays
from evaluation.retention import DEFAULT_POLICIES, RetentionComparison

from .errors import StudyInputError

#: SV, H2O-style density, recency, random and the key-only peers (leverage, kernel leverage, KeyDiff)
POLICIES = DEFAULT_POLICIES
LABELS = ("event_composite", "event_spo2")


def stay_retention(keys: np.ndarray, events: np.ndarray, *, nu: float, sigma: float, rng: np.random.Generator,
                   policies: Sequence[str] = POLICIES, build_gate: bool = False) -> dict[str, Any] | None:
    """Retention of every policy on one stay; ``None`` when the stay has no event hour.

    Parameters
    ----------
    keys : (n, d) selector input in hour order; events : (n,) bool.
    rng : generator of the random policy (per-stay, so the map is order-independent).
    build_gate : also build the maintained :class:`sv_core.Gate` (from the refit's solution) and
        return it.

    Returns
    -------
    dict with ``n``, ``k``, ``n_events``, ``retention`` {policy: fraction}, and when
    ``build_gate`` the ``gate``, ``gate_score_dev`` (max gate-score gap to the refit on the keys)
    and ``gate_alpha_dev`` (max |α_C&P − α_refit|; non-zero on exact duplicates).
    """
    from evaluation.retention import build_policies, stay_policy_retention

    X = np.ascontiguousarray(keys, dtype=np.float64)
    built = build_policies(policies, nu=nu, sigma=sigma, seed=0)
    out = stay_policy_retention(X, events, built, rng=rng)
    if out is None:
        return None
    sv = built["sv"]
    if build_gate:
        from sv_core import Gate, GateError

        a_ref = sv.alpha(X)  # the refit of the retention comparison (cached: solved once)
        try:
            # one solve per stay: the maintained state is built from the refit's solution
            g = Gate.from_solution(X, a_ref, C=sv.box_C(X.shape[0]), sigma=sigma)
        except GateError as exc:  # no gate could be built: nothing to persist, counted
            out["gate_error"] = type(exc).__name__
            return out
        out["gate"] = g
        out["gate_score_dev"] = gate_score_dev(g, X, a_ref)
        out["gate_alpha_dev"] = float(np.abs(g.alpha - a_ref).max())
    return out


def gate_score_dev(g, X: np.ndarray, alpha_ref: np.ndarray) -> float:
    """Max |s_gate(x) - s_refit(x)| over the stay's keys (duplicate-invariant; α itself may differ
    on exact duplicates). The refit's ρ is read from its margin keys, ρ = K_ii - 2(Kα)_i."""
    from sv_core import rbf_kernel

    K = rbf_kernel(X, X, g.sigma)
    f_ref = 2.0 * K @ alpha_ref
    margin = (alpha_ref > 1e-9 * g.C) & (alpha_ref < g.C * (1 - 1e-9))
    rho_ref = float(np.mean(np.diag(K)[margin] - f_ref[margin])) if margin.any() else g.rho
    return float(np.abs(g.score(X) - (f_ref - rho_ref)).max())


def retention_for_stays(warehouse: str, stay_ids: Sequence[int], *, label: str = "event_composite",
                        drop: Sequence[str] = (), nu: float = 0.3, sigma: float = 3.0, seed: int = 0,
                        policies: Sequence[str] = POLICIES, build_gate: bool = False) -> list[dict]:
    """Map step over a batch of stays (reads the warehouse read-only).

    Returns one dict per stay: ``stay_id``, ``subject_id``, ``hours`` and the fields of
    :func:`stay_retention` (``included`` False for stays without an event). Gates are returned
    as state dicts (``gate_state``) so results fit the JSON task cache (:mod:`pipelines.task_cache`).
    """
    if label not in LABELS:
        raise StudyInputError(f"label must be one of {LABELS}, got {label!r}")
    out = []
    for s in iter_stays(warehouse, stay_ids=list(stay_ids)):
        X = s.keys(drop)
        ev = s.event_composite if label == "event_composite" else s.event_spo2
        rng = np.random.default_rng([int(seed), int(s.stay_id)])
        r = stay_retention(X, ev, nu=nu, sigma=sigma, rng=rng, policies=policies, build_gate=build_gate)
        row: dict[str, Any] = {"stay_id": s.stay_id, "subject_id": s.subject_id, "n": int(X.shape[0]),
                               "d": int(X.shape[1]), "included": r is not None}
        if r is not None:
            g = r.pop("gate", None)
            row.update(r)
            if g is not None:
                row["gate_state"] = g.to_state()
                row["hours"] = s.hours.copy()
        out.append(row)
    return out


def aggregate(rows: list[dict], *, policies: Sequence[str] = POLICIES, nu: float, sigma: float, seed: int = 0,
              n_boot: int = 10_000, level: float = 0.95) -> RetentionComparison:
    """Combine per-stay rows (any order) into a :class:`evaluation.retention.RetentionComparison`.

    Stays are ordered by stay id before the bootstrap, so the result does not depend on the
    order in which tasks finished.
    """
    from evaluation.retention import comparison_from_rows

    rows = sorted(rows, key=lambda r: r["stay_id"])
    inc = [r for r in rows if r["included"]]
    if not inc:
        raise StudyInputError("no stay has an event hour; nothing to compare")
    return comparison_from_rows(inc, n_excluded=len(rows) - len(inc), policies=policies, nu=nu, sigma=sigma,
                                seed=seed, n_boot=n_boot, level=level)
