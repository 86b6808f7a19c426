"""How the retention comparison depends on ν and σ: SV vs ridge leverage vs kernel leverage.

Grid: ν ∈ :data:`NUS` × four bandwidth rules fixed in advance (:data:`SIGMA_RULES`): the study's
σ (the seed's σ = 3 by default), half and twice it, and the label-free **median-distance rule,
per stay**: σ_s = the median Euclidean distance between distinct-index pairs of the stay's own
keys (all pairs up to :data:`MEDIAN_MAX_ROWS` keys, else an evenly spaced subset of that many;
a zero median — more than half the pairs duplicates — falls back to the median of the positive
distances, and a stay of identical keys to σ = 1). The rule reads keys only, never labels, and
was chosen before looking at any result. Per setting and stay: SV's support size ``k`` is the
budget; SV, ridge leverage (σ- and ν-free scores, budget from SV) and kernel leverage (the
setting's σ) each keep ``k`` hours; differences SV − peer get paired stay-bootstrap intervals
(same resamples in every setting).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from evaluation.clinical.retention import stay_arrays
from evaluation.errors import MetricError
from evaluation.metrics import event_hour_retention, paired_bootstrap_cis

__all__ = ["NUS", "SIGMA_RULES", "MEDIAN_MAX_ROWS", "SENSITIVITY_STAYS", "PEERS", "settings", "median_distance_sigma",
           "stay_sensitivity", "sensitivity_table"]

NUS = (0.1, 0.2, 0.3, 0.5)
#: bandwidth rules: (name, how); "scale" multiplies the study's σ, "median" is the per-stay rule
SIGMA_RULES = (("study σ", ("scale", 1.0)), ("σ / 2", ("scale", 0.5)), ("2σ", ("scale", 2.0)),
               ("median distance (per stay)", ("median", None)))
MEDIAN_MAX_ROWS = 1000
#: default cap on the stays the table is computed on (the first stays with an event in the seeded order)
SENSITIVITY_STAYS = 200
PEERS = ("leverage", "kernel_leverage")


def settings(sigma: float, nus: Sequence[float] = NUS) -> list[tuple[float, str, tuple[str, float | None]]]:
    """The grid as ``(nu, rule name, (kind, value))`` with scaled σ resolved (``("fixed", σ)``)."""
    out = []
    for nu in nus:
        for name, (kind, v) in SIGMA_RULES:
            out.append((float(nu), name, ("fixed", float(sigma) * v) if kind == "scale" else ("median", None)))
    return out


def median_distance_sigma(X: Any, max_rows: int = MEDIAN_MAX_ROWS) -> float:
    """The per-stay label-free bandwidth (module docstring)."""
    from scipy.spatial.distance import pdist

    X = np.asarray(X, dtype=np.float64)
    if X.shape[0] > max_rows:
        X = X[np.linspace(0, X.shape[0] - 1, max_rows).round().astype(np.intp)]
    if X.shape[0] < 2:
        return 1.0
    d = pdist(X)
    m = float(np.median(d))
    if m > 0:
        return m
    pos = d[d > 0]
    return float(np.median(pos)) if pos.size else 1.0


def stay_sensitivity(X: Any, ev: Any, grid: Sequence[tuple[float, str, tuple[str, float | None]]]
                     ) -> dict[str, np.ndarray] | None:
    """Retention of SV and the leverage peers on one stay in every setting of ``grid``.

    Returns arrays of shape (n_settings,): ``k``, ``sigma``, ``ret_sv``, ``ret_leverage``,
    ``ret_kernel_leverage``, plus ``n`` (scalar array); ``None`` when the stay has no event hour.
    """
    from evaluation.peers import KernelLeveragePolicy, LeveragePolicy
    from evaluation.policies import SupportVectorPolicy

    X, ev = stay_arrays(X, ev)
    if not ev.any():
        return None
    lev = LeveragePolicy().score(X)
    med = None
    klev: dict[float, np.ndarray] = {}
    out = {c: np.empty(len(grid)) for c in ("k", "sigma", "ret_sv", "ret_leverage", "ret_kernel_leverage")}
    from evaluation.policies import select_top_k

    for j, (nu, _, (kind, v)) in enumerate(grid):
        if kind == "median":
            med = median_distance_sigma(X) if med is None else med
            s = med
        else:
            s = float(v)
        sv = SupportVectorPolicy(nu=nu, sigma=s)
        k = sv.support_size(X)
        if s not in klev:
            klev[s] = KernelLeveragePolicy(sigma=s).score(X)
        out["k"][j], out["sigma"][j] = k, s
        out["ret_sv"][j] = event_hour_retention(select_top_k(sv.alpha(X), k), ev)
        out["ret_leverage"][j] = event_hour_retention(select_top_k(lev, k), ev)
        out["ret_kernel_leverage"][j] = event_hour_retention(select_top_k(klev[s], k), ev)
    out["n"] = np.array([X.shape[0]], dtype=np.float64)
    return out


def sensitivity_table(grid: Sequence[tuple[float, str, tuple[str, float | None]]],
                      per_stay: Sequence[Mapping[str, np.ndarray]], *, seed: int = 0, n_boot: int = 10_000,
                      level: float = 0.95, sample_note: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
    """Aggregate :func:`stay_sensitivity` results (stays with an event, a fixed order) into a
    result table and summary metrics (aggregates only)."""
    if not per_stay:
        raise MetricError("no stay with an event for the sensitivity table")
    S = len(grid)
    st = {c: np.vstack([np.asarray(r[c], dtype=np.float64).reshape(1, S) for r in per_stay])
          for c in ("k", "sigma", "ret_sv", "ret_leverage", "ret_kernel_leverage")}
    n = np.array([float(np.asarray(r["n"]).reshape(-1)[0]) for r in per_stay])
    rows, beats, loses = [], {p: 0 for p in PEERS}, {p: 0 for p in PEERS}
    pct = int(round(level * 100))
    # every (setting, peer) interval resamples the same stays: one shared draw (bit-identical to one call each)
    cis = iter(paired_bootstrap_cis([(st["ret_sv"][:, j], st[f"ret_{p}"][:, j]) for j in range(S) for p in PEERS],
                                    n_boot, seed, level))
    for j, (nu, name, (kind, v)) in enumerate(grid):
        sig = f"{v:g}" if kind == "fixed" else f"per stay, median {np.median(st['sigma'][:, j]):.3g}"
        row: list[Any] = [nu, name, sig, len(per_stay), float(np.mean(st["k"][:, j] / n)),
                          float(st["ret_sv"][:, j].mean()), float(st["ret_leverage"][:, j].mean()),
                          float(st["ret_kernel_leverage"][:, j].mean())]
        for p in PEERS:
            ci = next(cis)
            row += [ci.mean_diff, f"[{ci.low:.3f}, {ci.high:.3f}]"]
            beats[p] += int(ci.low > 0)
            loses[p] += int(ci.high < 0)
        rows.append(row)
    title = (f"sensitivity over ν × σ: SV vs ridge and kernel leverage ({pct}% paired stay bootstrap, "
             f"{n_boot:,} resamples" + (f"; {sample_note}" if sample_note else "") + ")")
    table = {"title": title,
             "columns": ["ν", "σ rule", "σ", "stays", "mean k / n", "SV", "leverage", "kernel leverage",
                         "SV − leverage", "SV − leverage CI", "SV − kernel leverage", "SV − kernel leverage CI"],
             "rows": rows}
    summary = {"settings": S, "stays": len(per_stay), "nus": sorted({g[0] for g in grid}),
               "sigma_rules": [name for name, _ in SIGMA_RULES],
               "median_rule": "per stay: median pairwise distance of the stay's own keys (label-free, fixed in "
                              "advance)",
               **{f"sv_significantly_above_{p}": beats[p] for p in PEERS},
               **{f"{p}_significantly_above_sv": loses[p] for p in PEERS}}
    return table, summary
