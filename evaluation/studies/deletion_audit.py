"""The deletion audit's result, like for like with seed 001 §4 (Table 2).

:func:`audit_result` turns the per-regime summaries of :func:`sv_core.audit.run_audit` into a
``dashboards/SCHEMA.md`` result: per regime the four completion paths (completed on the plain
maintained path, on the maintained state after the KKT guard's SMO polish, by the exact fallback,
failed: every attempted trial in the denominator) beside the paper's row, the error statistics over
the trials completed on the maintained state, the partition compared on the unique part of the
optimum (well defined under exact repeats), real-data and synthetic regimes in separate rows and
totals, each regime's construction stated, and the run's trial count against the paper's 4 × 300.

Residual figures print as the bound they lie below (``"< 1e-12"``); the columns that move with BLAS
summation order (the polish / fallback split is decided by a residual at rounding level; the
ill-conditioned redundant regime's p95 / worst) carry a stated tolerance (``tables[0].tolerances``).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from evaluation.claims import bounded, claim, interval, low_power, proportion, tolerance

#: seed 001 Table 2, per paper regime: completed / attempted, partition match %, and median / mean /
#: worst of the per-trial maximum |Δ gate score| over completed trials
PAPER_TABLE: dict[str, dict[str, float]] = {
    "gaussian": {"completed": 300, "attempted": 300, "partition_match_pct": 99, "median": 2.4e-9, "mean": 3.1e-5,
                 "worst": 6.4e-3},
    "redundant": {"completed": 300, "attempted": 300, "partition_match_pct": 52, "median": 5.7e-7, "mean": 3.1e-5,
                  "worst": 9.6e-4},
    "mimic": {"completed": 299, "attempted": 300, "partition_match_pct": 98, "median": 1.6e-9, "mean": 5.6e-5,
              "worst": 1.1e-2},
    "learned": {"completed": 300, "attempted": 300, "partition_match_pct": 100, "median": 4.5e-13, "mean": 9.7e-13,
                "worst": 1.1e-11},
}
#: seed 001 §4: coefficient decay's median gate-score error from the same refit, lowest and highest regime
PAPER_DECAY_MEDIAN = (2.2e-2, 2.4e-1)
PAPER_NAMES = {"gaussian": "Gaussian", "redundant": "redundant", "mimic": "MIMIC-IV", "learned": "learned keys"}
#: result ``data`` kinds that are real patient records (as dashboards.seed_figures.REAL_SOURCES)
REAL_DATA = ("demo", "mimic", "clif")
COUNT_KEYS = ("attempted", "completed_maintained", "completed_polished", "completed_fallback", "failed")
#: the paths a trial can complete by, as the result's table names them
PATH_COLUMNS = ("maintained path", "after SMO polish", "exact fallback", "failed")
#: the statistics columns of the regime table (residuals print as bounds below 1e-12)
STAT_COLUMNS = ("median |Δs|", "p95 |Δs|", "worst |Δs|")


def _total(name: str, rows: list[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    tot: dict[str, Any] = {"regimes": [r for r, _ in rows]}
    for k in COUNT_KEYS:
        tot[k] = int(sum(int(s.get(k) or 0) for _, s in rows))
    worst = [s["score_dev_worst"] for _, s in rows if s.get("score_dev_worst") is not None]
    tot["score_dev_worst"] = max(worst) if worst else None
    tot["label"] = name
    return tot


def _paper_cells(info: Mapping[str, Any], real_run: bool) -> list[Any]:
    """The paper's completed / median / worst for a regime's row; None where the regime has no paper
    counterpart or (the MIMIC-IV row) where this run's ICU keys are not real records."""
    p = PAPER_TABLE.get(info.get("paper_regime") or "")
    if p is None or (info.get("paper_regime") == "mimic" and not real_run):
        return [None, None, None, None]
    return [f"{int(p['completed'])}/{int(p['attempted'])}", p["partition_match_pct"], p["median"], p["worst"]]


def audit_result(summaries: Mapping[str, Mapping[str, Any]], *, trials: int, seed: int, protocol: Mapping[str, Any],
                 failure_kinds: Mapping[str, list[str]] | None = None, runtime_s: float = 0.0) -> dict[str, Any]:
    """The audit's result dict.

    Parameters
    ----------
    summaries : regime name -> :func:`sv_core.audit.summarise` output with its ``info``
        (``data``, ``paper_regime``, ``construction``), in the order to show.
    trials, seed : the run's trials per regime and seed.
    protocol : ``run_audit(...)["protocol"]`` fields (ν, σ, γ, ...) and ``power``.
    failure_kinds : regime -> sorted error type names of failed trials.
    """
    from sv_core.audit import PAPER_REGIMES, PAPER_TRIALS, power, trials_label

    names = list(summaries)
    info = {r: dict(summaries[r].get("info") or {}) for r in names}
    real = [r for r in names if info[r].get("data") in REAL_DATA]
    synth = [r for r in names if r not in real]
    icu_data = next((info[r]["data"] for r in names if info[r].get("paper_regime") == "mimic"), None)
    data = icu_data if icu_data is not None else "synthetic"
    real_run = data in REAL_DATA
    covered = {info[r].get("paper_regime") for r in names} - {None}
    paper_protocol = covered == set(PAPER_REGIMES) and len(names) == len(PAPER_REGIMES) and trials == PAPER_TRIALS
    pw = power(trials, len(names))

    totals = {"real_data": _total("real-data regimes", [(r, summaries[r]) for r in real]),
              "synthetic": _total("synthetic regimes (incl. learned keys)", [(r, summaries[r]) for r in synth]),
              "all": _total("all regimes", [(r, summaries[r]) for r in names])}
    a = totals["all"]
    paper_done = sum(int(p["completed"]) for p in PAPER_TABLE.values())
    paper_att = sum(int(p["attempted"]) for p in PAPER_TABLE.values())
    headline = (f"{a['completed_maintained']:,}/{a['attempted']:,} completed on the maintained path, "
                f"{a['completed_polished']:,} on it after an SMO polish, {a['completed_fallback']:,} by the exact "
                f"fallback, {a['failed']:,} failed ({trials_label(trials, len(names))}; paper: "
                f"{paper_done:,}/{paper_att:,}, 4 regimes x {PAPER_TRIALS})")

    columns = ["regime", "data", "paper regime", "attempted", *PATH_COLUMNS,
               "partition match % (unique part)", *STAT_COLUMNS, "decay median",
               "paper completed", "paper partition match %", "paper median", "paper worst"]
    rows: list[list[Any]] = []
    for group in (real, synth):
        for r in group:
            s = summaries[r]
            rows.append([r, info[r].get("data"), PAPER_NAMES.get(info[r].get("paper_regime") or "", "beyond the paper"),
                         s["attempted"], s["completed_maintained"], s.get("completed_polished", 0),
                         s["completed_fallback"], s["failed"], s["partition_match_pct"],
                         *(bounded(s[k]) for k in ("score_dev_median", "score_dev_p95", "score_dev_worst")),
                         s["decay_median"], *_paper_cells(info[r], real_run)])
    for key in ("real_data", "synthetic", "all"):
        t = totals[key]
        if not t["regimes"]:
            continue
        paper = [f"{paper_done:,}/{paper_att:,}", None, None, max(p["worst"] for p in PAPER_TABLE.values())] \
            if key == "all" else [None, None, None, None]
        rows.append([f"total: {t['label']}", None, None, t["attempted"], t["completed_maintained"],
                     t["completed_polished"], t["completed_fallback"], t["failed"], None, None, None,
                     bounded(t["score_dev_worst"]), None, *paper])

    redundant = [r for r in names if info[r].get("paper_regime") == "redundant"]
    red_note = (f"{redundant[0]}: {info[redundant[0]]['construction']}" if redundant else "")
    title = (f"decrement vs same-C refit, max |Δ gate score| — {trials_label(trials, len(names))}; every attempted "
             "trial counted under one completion path (a trial a deletion of which needed the SMO polish is counted "
             "under 'after SMO polish', one with a fallback deletion under 'exact fallback', never as maintained); "
             "statistics over the trials completed on the maintained state (plain path and after the polish); "
             "partition compared on the unique part of the optimum (bit-identical keys summed)")
    constructions = {r: info[r].get("construction", "") for r in names}
    cats, vals = [], []
    for r in names:
        for label, key in (("decrement", "score_dev_median"), ("decay", "decay_median")):
            v = summaries[r].get(key)
            if v is not None:
                cats.append(f"{r} {label}")
                vals.append(max(float(v), 1e-17))
    notes = ("Regimes: " + "; ".join(f"{r} ({info[r].get('data')}): {c}" for r, c in constructions.items()) + ". "
             "Seed 001 §4 reports 1,199/1,200 (4 regimes x 300) with median max |Δs| "
             "2.4e-9 / 5.7e-7 / 1.6e-9 / 4.5e-13 (Gaussian / redundant / MIMIC-IV / learned), worst 1.1e-2, "
             f"decay median {PAPER_DECAY_MEDIAN[0]:.1e}…{PAPER_DECAY_MEDIAN[1]:.1e}; its one uncovered trial hit the "
             "margin-set-empty edge case, which this gate completes by the exact fallback instead (counted under "
             "'exact fallback'). The paper's partition match (52 % on the redundant regime) is per key, which is "
             "not well defined under exact repeats; here the partition is compared on the unique part of the "
             "optimum, so the two are not like for like.")
    per_regime = {r: {k: summaries[r].get(k) for k in (
        "attempted", "completed", "completed_maintained", "completed_polished", "completed_fallback", "failed",
        "completed_maintained_state", "partition_match_pct", "score_dev_median", "score_dev_mean", "score_dev_p95",
        "score_dev_worst", "decay_median", "kkt_residual_worst", "fallbacks", "fallbacks_admission",
        "trials_with_fallback", "polishes", "polishes_admission", "trials_with_polish")}
        | {"data": info[r].get("data"), "paper_regime": info[r].get("paper_regime"),
           "all_completed": summaries[r].get("all_completed"), "by_path": summaries[r].get("by_path")}
        for r in names}
    from sv_core.audit_summary import PARTITION_DEFINITION

    metrics: dict[str, Any] = {
        "headline": headline,
        "attempted": a["attempted"],
        "completed": a["completed_maintained"] + a["completed_polished"] + a["completed_fallback"],
        "completed_maintained": a["completed_maintained"],
        "completed_polished": a["completed_polished"],
        "completed_fallback": a["completed_fallback"],
        "failed": a["failed"],
        # every attempted trial under exactly one completion path (they add up to "attempted")
        "completion_paths": {"maintained_path": a["completed_maintained"], "after_SMO_polish": a["completed_polished"],
                             "exact_fallback": a["completed_fallback"], "failed": a["failed"]},
        "trials_per_regime": trials,
        "trials_label": trials_label(trials, len(names)),
        "paper_protocol": bool(paper_protocol),
        "power": pw,
        "partition_match_definition": PARTITION_DEFINITION,
        "real_data": totals["real_data"],
        "synthetic": totals["synthetic"],
        **per_regime,
    }
    off = None if trials >= PAPER_TRIALS else f"not run at the paper's protocol: {trials_label(trials)}"
    power_flag = low_power(trials, PAPER_TRIALS, "trials per regime", pw["label"])
    claims = [_completion_claim(a, paper_done, paper_att, off, power_flag)]
    claims += [_regime_claim(r, summaries[r], info[r], real_run, off, power_flag) for r in names]
    path_tol = _path_tolerance(a["attempted"])
    tab_tol = {c: path_tol for c in PATH_COLUMNS[:3]}
    tab_tol.update({c: _STAT_TOLERANCE for c in STAT_COLUMNS})
    return {
        "study": "deletion_audit",
        "title": f"Fixed-C deletion audit: {trials_label(trials, len(names))}"
                 + ("" if paper_protocol else " (not the paper's protocol)"),
        "data": data,
        "runtime_s": float(runtime_s),
        "metrics": metrics,
        "tables": [
            {"title": title, "columns": columns, "rows": rows, "tolerances": tab_tol},
            {"title": "how each regime's keys are built", "columns": ["regime", "data", "paper regime", "construction"],
             "rows": [[r, info[r].get("data"), PAPER_NAMES.get(info[r].get("paper_regime") or "", "beyond the paper"),
                       constructions[r]] for r in names]},
        ],
        "figures": [{"kind": "bar",
                     "title": f"median max |Δs| (maintained state) vs decay (γ = {protocol.get('gamma')})",
                     "ylabel": "max |Δ score|", "log_y": True, "categories": cats, "values": vals,
                     "caption": red_note}],  # the low-power label is the card's warning (metrics.power)
        "claims": claims,
        "tolerances": {**{f"metrics.*.{k}": path_tol for k in COUNT_KEYS[1:4]},
                       **{f"metrics.{k}": path_tol for k in ("headline", *COUNT_KEYS[1:4])},
                       "metrics.completion_paths.*": path_tol,
                       **{f"metrics.*.score_dev_{k}": _STAT_TOLERANCE for k in ("median", "p95", "worst")}},
        "notes": notes,
        "config": {"trials_per_regime": trials, "regimes": names, "seed": seed,
                   **{k: protocol[k] for k in ("nu", "sigma", "gamma", "removals_per_trial", "jitter")
                      if k in protocol},
                   "failure_kinds": {r: v for r, v in (failure_kinds or {}).items() if v}},
    }


def _path_tolerance(attempted: int) -> dict[str, Any]:
    """The polish / fallback split is decided by a KKT residual at rounding level (1e-12 / 1e-9), so it moves
    with BLAS summation order (a trial or two across OpenBLAS kernels): any count may move by 5 % of the
    attempted trials."""
    return tolerance("the split between the plain path, the SMO polish and the exact fallback is decided by a KKT "
                     "residual at rounding level (1e-12 / 1e-9), which moves with BLAS summation order; failed trials "
                     "and the attempted total do not move", abs=max(2, math.ceil(0.05 * attempted)))
#: residual statistics above 1e-12 come from ill-conditioned near-duplicate supports (cond >= 1e9), where
#: rounding is amplified: their p95 moves by about a decade across OpenBLAS kernels
_STAT_TOLERANCE = tolerance("residual statistics: below 1e-12 they print as '< 1e-12'; above it they come from "
                            "ill-conditioned near-duplicate supports (cond >= 1e9) where rounding is amplified, so "
                            "only their order of magnitude is stable", decades=1.5, bound=1e-12)


def _completion_claim(a: Mapping[str, Any], paper_done: int, paper_att: int, off: str | None,
                      power_flag: dict) -> dict[str, Any]:
    done = int(a["attempted"]) - int(a["failed"])
    return claim(
        "every attempted deletion completes, each counted under its completion path (maintained path, after an "
        "SMO polish, exact fallback, failed)",
        reference="fresh retained-key refit at the same fixed C", path="maintained fp64 C&P path; KKT-guard SMO "
        "polish; exact fallback (fresh refit, state rebuilt)", operation="active deletion",
        rule="no failed trial among the attempted (a count over every trial, not an estimate)",
        passed=int(a["failed"]) == 0, run=proportion(done, int(a["attempted"])),
        paper={"figure": f"{paper_done:,}/{paper_att:,} complete (one margin-set-empty failure)",
               "source": "seed 001 §4, Table 2"},
        value={"maintained path": a["completed_maintained"], "after SMO polish": a["completed_polished"],
               "exact fallback": a["completed_fallback"], "failed": a["failed"], "attempted": a["attempted"]},
        off_protocol=off, power=power_flag)


def _regime_claim(r: str, s: Mapping[str, Any], info: Mapping[str, Any], real_run: bool, off: str | None,
                  power_flag: dict) -> dict[str, Any]:
    """Per regime: the decrement's worst |Δs| over every completed deletion lies below decay's median
    (the paper: "remains below coefficient decay's deviation in every regime"): a range, not a point."""
    worst = (s.get("all_completed") or {}).get("score_dev_worst", s.get("score_dev_worst"))
    decay = s.get("decay_median")
    passed = None if worst is None or decay is None else bool(worst < decay)
    p = PAPER_TABLE.get(info.get("paper_regime") or "")
    paper = None
    if p is not None and not (info.get("paper_regime") == "mimic" and not real_run):
        paper = {"figure": f"median {p['median']:.1e}, worst {p['worst']:.1e}; decay median "
                           f"{PAPER_DECAY_MEDIAN[0]:.1e}…{PAPER_DECAY_MEDIAN[1]:.1e}", "source": "seed 001 §4, Table 2"}
    elif p is not None:
        paper = {"figure": None, "source": f"seed 001 Table 2 (MIMIC-IV row; this run's ICU keys are "
                                           f"{info.get('data')} data, not comparable)"}
    n = int(s.get("completed") or 0)
    med = bounded(s.get("score_dev_median"))
    return claim(
        f"{r} ({info.get('data')}): the decrement reaches the same-C refit far below coefficient decay — worst max "
        f"|Δs| over every completed deletion below decay's median",
        reference="fresh retained-key refit at the same fixed C", path="maintained fp64 C&P decremental path",
        operation="active deletion", rule="worst max |Δs| over every completed trial (all paths) < decay's median",
        passed=passed, run=interval(med, None, _finite(worst), how=f"median (maintained state); high: worst over "
                                                                  f"all {n:,} completed trials", n=n),
        peer={"name": "coefficient decay (γ = 0.01), median", "value": _finite(decay), "low": None, "high": None},
        paper=paper, value=med, off_protocol=off, power=power_flag)


def _finite(x: Any) -> float | None:
    return float(x) if x is not None and math.isfinite(float(x)) else None
