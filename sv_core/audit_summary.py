"""Per-regime summaries of the fixed-C deletion audit (:mod:`sv_core.audit`): completion paths,
error statistics and the text table.

Every attempted trial stays in the denominator and is counted under exactly one completion path
(:data:`PATHS`, in this order of precedence):

* ``failed`` — a deletion raised;
* ``fallback`` — a deletion completed by the gate's exact fallback (fresh refit, maintained state
  rebuilt); exact, but not the maintained path the paper audits;
* ``polished`` — every deletion stayed on the maintained state, but at least one finished only
  after the warm SMO polish of the KKT guard (``Gate.tightenings``, ``sv_core._gate_exact``);
* ``maintained`` — both deletions completed on the plain C&P path.

The headline error statistics (median / mean / p95 / worst ``|Δs|``, partition agreement) are over
the trials completed on the maintained state (``maintained`` and ``polished``: whether the KKT guard
polishes is decided by a residual at rounding level, so that split, unlike their union, moves with
BLAS summation order); ``by_path`` repeats them for each completed path and ``all_completed`` over
every completed trial.
"""
from __future__ import annotations

import numpy as np

#: completion paths of a trial, in order of precedence (a trial is counted under the first that applies)
PATHS = ("failed", "fallback", "polished", "maintained")
#: summary count key of each path (the denominators: they add up to ``attempted``)
PATH_COUNTS = {"maintained": "completed_maintained", "polished": "completed_polished",
               "fallback": "completed_fallback", "failed": "failed"}


def trial_path(trial: dict | None) -> str:
    """The completion path of one trial result (``None``: the trial failed)."""
    if trial is None:
        return "failed"
    if trial.get("deletion_fallbacks", 0):
        return "fallback"
    if trial.get("deletion_polishes", 0):
        return "polished"
    return "maintained"


def _class_summary(rows: list[dict], attempted: int) -> dict:
    devs = np.array([r["max_abs_score_dev"] for r in rows]) if rows else np.array([np.nan])
    return {
        "attempted": attempted,
        "completed": len(rows),
        "fallbacks": int(sum(r["fallback"] for r in rows)),
        "polishes": int(sum(r.get("polished", False) for r in rows)),
        "partition_match_pct": 100.0 * np.mean([r["partition_match"] for r in rows]) if rows else 0.0,
        "score_dev_median": float(np.median(devs)),
        "score_dev_worst": float(np.max(devs)),
        "kkt_residual_worst": float(max((r["kkt_residual"] for r in rows), default=np.nan)),
    }


def dev_stats(done: list[dict]) -> dict:
    """Error statistics over a set of completed trials (NaN for an empty set)."""
    devs = np.array([t["max_abs_score_dev"] for t in done]) if done else np.array([np.nan])
    return {
        "trials": len(done),
        "partition_match_pct": 100.0 * np.mean([t["partition_match"] for t in done]) if done else float("nan"),
        "score_dev_median": float(np.median(devs)),
        "score_dev_mean": float(np.mean(devs)),
        "score_dev_p95": float(np.percentile(devs, 95)),
        "score_dev_worst": float(np.max(devs)),
        "kkt_residual_worst": float(max((t["kkt_residual"] for t in done), default=np.nan)),
    }


def summarise(trials: list[dict | None], attempted: int, failed_removals: list[str] | None = None) -> dict:
    """Per-regime summary: the four completion paths (counts add up to ``attempted``), the error
    statistics over the trials completed on the maintained state (headline: plain path and after the
    SMO polish), per path (``by_path``) and over every completed trial (``all_completed``), the decay
    baseline, fallback / polish counts and conditioning."""
    done = [t for t in trials if t is not None]
    by_path = {p: [t for t in done if trial_path(t) == p] for p in PATHS[1:]}
    maint = by_path["maintained"] + by_path["polished"]
    dec = np.array([t["decay_max_abs_score_dev"] for t in done]) if done else np.array([np.nan])
    rem = [r for t in done for r in t["removals"]]
    failed_removals = failed_removals or []
    by = {}
    for cls, sel in (("active", lambda s: s != "reserve"), ("reserve", lambda s: s == "reserve")):
        rows = [r for r in rem if sel(r["status"])]
        by[cls] = _class_summary(rows, len(rows) + sum(sel(s) for s in failed_removals))
    conds = np.array([t["cond_K_SS"] for t in done]) if done else np.array([np.nan])
    cond_sup = np.array([t["cond_K_support"] for t in done]) if done else np.array([np.nan])
    head = dev_stats(maint)
    counts = {PATH_COUNTS[p]: len(by_path[p]) for p in PATHS[1:]}
    return {
        "attempted": attempted,
        "completed": len(done),
        **counts,
        "failed": attempted - len(done),
        "completed_maintained_state": len(maint),
        "stats_over": "trials completed on the maintained state (plain C&P path or after the SMO polish; "
                      "exact-fallback trials apart)",
        "partition_match_pct": head["partition_match_pct"],
        "partition_match_definition": PARTITION_DEFINITION,
        "score_dev_median": head["score_dev_median"],
        "score_dev_mean": head["score_dev_mean"],
        "score_dev_p95": head["score_dev_p95"],
        "score_dev_worst": head["score_dev_worst"],
        "kkt_residual_worst": head["kkt_residual_worst"],
        "by_path": {p: dev_stats(by_path[p]) for p in PATHS[1:]},
        "all_completed": dev_stats(done),
        "decay_median": float(np.median(dec)),
        "decay_worst": float(np.max(dec)),
        "active_removals": int(sum(s != "reserve" for t in done for s in t["removed_status"])),
        "n_keys_median": float(np.median([t["n"] for t in done])) if done else float("nan"),
        "fallbacks": int(sum(t.get("deletion_fallbacks", 0) for t in done)),
        "fallbacks_admission": int(sum(t["fallbacks_admission"] for t in done)),
        "trials_with_fallback": counts["completed_fallback"],
        "polishes": int(sum(t.get("deletion_polishes", 0) for t in done)),
        "polishes_admission": int(sum(t.get("polishes_admission", 0) for t in done)),
        "trials_with_polish": int(sum(bool(t.get("deletion_polishes", 0)) for t in done)),
        "cond_K_SS_median": float(np.median(conds)),
        "cond_K_SS_max": float(np.max(conds)),
        "cond_K_support_median": float(np.median(cond_sup)),
        "pct_cond_K_support_ge_1e9": 100.0 * float(np.mean(cond_sup >= 1e9)) if done else 0.0,
        "by_removal": by,
    }


#: what the partition figure compares (well defined under exact repeats, see :func:`sv_core.audit.unique_partition`)
PARTITION_DEFINITION = ("agreement of the (S, E, R) partition on the unique part of the optimum: bit-identical keys "
                        "form one group whose coefficients are summed (any split of a repeat group's mass is optimal, "
                        "only its sum is unique); a group is reserve (sum 0), bound (every member at C) or margin")


def finite_or_none(x):
    """JSON-safe summaries: a statistic over an empty group (e.g. no reserve removal drawn) or an
    infinite condition number is ``None`` (JSON null), never NaN/inf."""
    if isinstance(x, dict):
        return {k: finite_or_none(v) for k, v in x.items()}
    if isinstance(x, float) and not np.isfinite(x):
        return None
    return x


def _f(x) -> float:
    return float("nan") if x is None else float(x)


def format_table(res: dict) -> str:
    """The audit as a text table: per regime the four completion paths, the error statistics over the
    trials completed on the maintained state, the decay median, and the worst active / reserve removal."""
    head = (f"{'regime':<14}{'data':>10}{'attempted':>10}{'maintained':>11}{'polished':>9}{'fallback':>9}"
            f"{'failed':>7}{'part.match':>11}{'median':>10}{'p95':>10}{'worst':>10}{'decay med':>11}{'act worst':>11}"
            f"{'res worst':>11}{'cond sup':>10}")
    lines = [head, "-" * len(head)]
    rows = list(res["regimes"].items()) + list(res.get("jitter_sweep", {}).items())
    for name, s in rows:
        by = s.get("by_removal", {})
        act = _f(by.get("active", {}).get("score_dev_worst"))
        rsv = _f(by.get("reserve", {}).get("score_dev_worst"))
        lines.append(
            f"{name:<14}{str(s.get('info', {}).get('data', '')):>10}{s['attempted']:>10}"
            f"{s['completed_maintained']:>11}{s.get('completed_polished', 0):>9}{s['completed_fallback']:>9}"
            f"{s['failed']:>7}{_f(s['partition_match_pct']):>10.1f}%"
            f"{_f(s['score_dev_median']):>10.1e}{_f(s['score_dev_p95']):>10.1e}{_f(s['score_dev_worst']):>10.1e}"
            f"{_f(s['decay_median']):>11.1e}{act:>11.1e}{rsv:>11.1e}{_f(s.get('cond_K_support_median')):>10.1e}"
        )
    lines.append("(median / p95 / worst |Δs| over the trials completed on the maintained state: the plain path "
                 "and 'polished', a trial a deletion of which finished only after the SMO polish; one that took the "
                 "exact fallback is counted under 'fallback', never as maintained; partition match on the unique "
                 "part of the optimum)")
    pw = res.get("protocol", {}).get("power", {})
    if pw.get("label"):
        lines.append("low power: this audit " + pw["label"])
    return "\n".join(lines)
