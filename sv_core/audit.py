"""Fixed-C deletion audit: maintained C&P decrement vs an independent same-C refit.

Protocol (SPEC §3, seed 001 §4): per trial, build a context, set ``C = 1/(nu n0)`` once, solve the
gate in fp64, remove two tokens (i) by the C&P decremental path and (ii) by a fresh retained-key
refit (:func:`sv_core.refit`, Clarabel + KKT polish) at the same C, and report the largest
|gate-score difference| over retained, removed, and jittered (0.1) retained probes. The
coefficient-decay baseline keeps the removed tokens, multiplies their coefficients by
``gamma`` and does not re-solve; it is scored on the same probes against the same refit.

Every attempted trial stays in the denominator and is counted in exactly one of three classes:

* ``completed_maintained`` — both deletions completed on the maintained C&P path;
* ``completed_fallback`` — a deletion completed by the gate's exact fallback (fresh refit,
  maintained state rebuilt); exact, but not the maintained path the paper audits;
* ``failed`` — a deletion raised.

The headline error statistics (median / mean / p95 / worst ``|Δs|``, partition match) are over
the maintained-path trials only; ``all_completed`` repeats them over every completed trial. Each
removal is also compared with its own refit and reported by class (``by_removal``: active
removals vs reserve removals, which are trivially exact). ``REGIME_INFO`` states how each regime
is built (see the ``redundant`` entry: its partition-match rate follows from its construction).
``--jitter-sweep`` adds near-duplicate clusters at every jitter in ``SWEEP_JITTERS``.

Usage::

    python -m sv_core.audit --trials 300 --json runs/audit/result.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

import numpy as np

from sv_core.audit_keys import (  # noqa: F401  (re-exported: the generators are part of the audit's API)
    SWEEP_JITTERS,
    clustered_keys,
    dedupe,
    duplicate_keys,
    gaussian_keys,
    icu_like_keys,
    jitter_regime,
    redundant_keys,
    sweep_name,
)
from sv_core.calibrate import calibrate_C
from sv_core.errors import GateError
from sv_core.gate import Gate
from sv_core.kernels import rbf_kernel
from sv_core.refit import refit

#: regime name -> generator(rng) returning (n, d) keys. Other packages add regimes (ICU, learned).
REGIMES: dict[str, Callable[[np.random.Generator], np.ndarray]] = {}
#: regime name -> {"data": kind of keys, "paper_regime": the seed 001 Table 2 row it reproduces
#: (or None for a regime beyond the paper's), "construction": how its keys are built}
REGIME_INFO: dict[str, dict] = {}
#: the paper's synthetic regimes, run when none are named (Gaussian d = 6; redundant near-duplicates);
#: the real-ICU and learned-key regimes are registered by the flow (``forgetful audit``)
DEFAULT_REGIMES = ["gaussian", "redundant"]
#: trials per regime in seed 001 §4 (4 regimes x 300 attempted trials)
PAPER_TRIALS = 300
#: the seed's regimes in Table 2 order
PAPER_REGIMES = ("gaussian", "redundant", "mimic", "learned")


def register_regime(name: str, fn: Callable[[np.random.Generator], np.ndarray], *, data: str = "synthetic",
                    paper_regime: str | None = None, construction: str = "") -> None:
    """Add an audit regime: ``fn(rng) -> (n, d)`` keys, with what its keys are (``data``: e.g.
    ``synthetic``, ``demo``, ``learned``), the paper regime it stands for, and its construction."""
    if paper_regime is not None and paper_regime not in PAPER_REGIMES:
        raise KeyError(f"unknown paper regime {paper_regime!r}; known: {PAPER_REGIMES}")
    REGIMES[name] = fn
    REGIME_INFO[name] = {"data": str(data), "paper_regime": paper_regime, "construction": str(construction)}


def trials_label(trials: int, regimes: int | None = None) -> str:
    """How a run's trial count compares with the paper's: "300 trials per regime (the paper's
    count)" or "50 of the paper's 300 trials per regime"."""
    per = (f"{trials:,} trials per regime (the paper's count)" if trials == PAPER_TRIALS
           else f"{trials:,} of the paper's {PAPER_TRIALS} trials per regime")
    return per if regimes is None else f"{regimes} regime{'s' if regimes != 1 else ''} x {per}"


def power(trials: int, regimes: int, paper_failure_rate: float = 1 / 1200) -> dict:
    """Low-power label of an audit run: with fewer trials than the paper's, a failure as rare as the
    paper's (1 of 1,200) is unlikely to show; ``p_see_paper_rate`` is the chance that at least one
    such failure appears among this run's ``trials * regimes`` trials."""
    n = int(trials) * int(regimes)
    p_see = 1.0 - (1.0 - paper_failure_rate) ** n
    low = trials < PAPER_TRIALS
    label = (f"runs {trials_label(trials)}: a failure as rare as the paper's (1 in 1,200) shows in a run of "
             f"{n:,} trials with probability {p_see:.2f}" if low else "")
    return {"units": "trials per regime", "count": int(trials), "reference_count": PAPER_TRIALS,
            "low_power": bool(low), "p_see_paper_failure_rate": p_see, "label": label}


register_regime("gaussian", gaussian_keys, paper_regime="gaussian",
                construction="64 keys ~ N(0, I_6) (d = 6), fresh each trial")
register_regime("redundant", redundant_keys, paper_regime="redundant", construction=(
    "8 centres ~ 2 N(0, I_6) x 8 copies (n = 64); per trial a jitter drawn log-uniformly from [1e-6, 1e-3] "
    "moves the copies; in 60 % of trials half of the copies are left as exact repeats. Exact repeats make "
    "the optimal coefficients non-unique (the partition can differ while the gate score agrees), so this "
    "regime's partition-match rate is a consequence of that construction (p_repeats, jitter range), chosen "
    "to make the support Gram block ill-conditioned (cond >= 1e9) like the paper's near-duplicate regime; "
    "it is not a measurement of natural data"))
register_regime("clustered", clustered_keys, construction=(
    "beyond the paper: 8 centres ~ 2 N(0, I_6) x 8 copies with jitter 0.01 (well separated near-duplicates)"))
register_regime("icu_like", icu_like_keys, construction=(
    "beyond the paper: synthetic ICU-like 6-d vitals (stable stretches with drift, short excursions), "
    "160 h, deduplicated at 0.1 SD"))
register_regime("duplicates", duplicate_keys, construction=(
    "stress test beyond the paper: 12 keys x 6 exact repeats or 1e-6 near-repeats"))
for _j in SWEEP_JITTERS:
    register_regime(sweep_name(_j), jitter_regime(_j), construction=(
        f"jitter sweep beyond the paper: 8 centres x 8 copies at jitter {_j:g}"))
#: regimes beyond the paper's four that can be named with ``--regimes``
EXTRA_REGIMES = ("clustered", "icu_like", "duplicates")


def _cond(K: np.ndarray, idx: np.ndarray) -> float:
    if idx.size < 2:
        return 1.0
    return float(np.linalg.cond(K[np.ix_(idx, idx)]))


def run_trial(X: np.ndarray, rng: np.random.Generator, nu: float = 0.4, sigma: float = 2.0,
              n_remove: int = 2, gamma: float = 0.01, jitter: float = 0.1) -> dict:
    """One audit trial; raises GateError if the maintained path cannot complete.

    The tokens are removed one at a time; each removal is compared with its own same-C refit
    of the retained keys (``removals``: status, deviation, KKT, partition match, fallback), and
    the trial-level figures are those of the final state (as before) with the worst removal."""
    n = X.shape[0]
    C = calibrate_C(nu, n)
    g = Gate(C=C, sigma=sigma)
    ids = g.admit(X)
    fallbacks_admit = g.fallbacks
    targets = rng.choice(ids, size=n_remove, replace=False)
    alpha_full, rho_full = g.alpha.copy(), g.rho
    status = [g.status_of(int(t)) for t in targets]
    core = g._solver
    live = core.live()
    K = core.K[np.ix_(live, live)]
    cond_S = _cond(K, np.flatnonzero(core.status[live] == 1))
    cond_sup = _cond(K, np.flatnonzero(core.alpha[live] > 0.0))
    tol = 1e-9 * C
    part = lambda a: np.where(a <= tol, 0, np.where(a >= C - tol, 2, 1))  # noqa: E731
    removals = []
    t_dec = 0.0
    t_ref = 0.0
    removed = np.zeros(n, dtype=bool)
    for tid, st in zip(targets, status):
        t0 = time.perf_counter()
        r = g.forget(int(tid))
        t_dec += time.perf_counter() - t0
        removed[ids == tid] = True
        Xr = X[~removed]
        t0 = time.perf_counter()
        a_ref, rho_ref = refit(Xr, C=C, sigma=sigma)
        t_ref += time.perf_counter() - t0
        P = np.vstack([Xr, X[removed], Xr + jitter * rng.standard_normal(Xr.shape)])
        s_ref = 2.0 * rbf_kernel(P, Xr, sigma) @ a_ref - rho_ref
        removals.append({
            "status": st,
            "max_abs_score_dev": float(np.abs(g.score(P) - s_ref).max()),
            "kkt_residual": g.kkt_residual()["max"],
            "partition_match": bool(np.array_equal(part(g.alpha), part(a_ref))),
            "fallback": bool(r.fallback),
        })
    keep = ~removed
    Xr = X[keep]
    probes = np.vstack([Xr, X[~keep], Xr + jitter * rng.standard_normal(Xr.shape)])
    s_ref = 2.0 * rbf_kernel(probes, Xr, sigma) @ a_ref - rho_ref
    dev = float(np.abs(g.score(probes) - s_ref).max())
    # decay baseline: keep the removed tokens, scale their coefficients, no re-solve
    a_dec = alpha_full.copy()
    a_dec[~keep] *= gamma
    s_dec = 2.0 * rbf_kernel(probes, X, sigma) @ a_dec - rho_full
    dev_decay = float(np.abs(s_dec - s_ref).max())
    return {
        "n": n,
        "C": C,
        "max_abs_score_dev": max(dev, max(r["max_abs_score_dev"] for r in removals)),
        "decay_max_abs_score_dev": dev_decay,
        "partition_match": bool(np.array_equal(part(g.alpha), part(a_ref))),
        "kkt_residual": max(r["kkt_residual"] for r in removals),
        "removed_status": status,
        "decrement_s": t_dec,
        "refit_s": t_ref,
        "fallbacks": int(g.fallbacks),
        "fallbacks_admission": int(fallbacks_admit),
        # deletions completed by the exact fallback: such a trial is not a maintained-path trial
        "deletion_fallbacks": int(sum(r["fallback"] for r in removals)),
        "cond_K_SS": cond_S,
        "cond_K_support": cond_sup,
        "removals": removals,
    }


def _class_summary(rows: list[dict], attempted: int) -> dict:
    devs = np.array([r["max_abs_score_dev"] for r in rows]) if rows else np.array([np.nan])
    return {
        "attempted": attempted,
        "completed": len(rows),
        "fallbacks": int(sum(r["fallback"] for r in rows)),
        "partition_match_pct": 100.0 * np.mean([r["partition_match"] for r in rows]) if rows else 0.0,
        "score_dev_median": float(np.median(devs)),
        "score_dev_worst": float(np.max(devs)),
        "kkt_residual_worst": float(max((r["kkt_residual"] for r in rows), default=np.nan)),
    }


def _dev_stats(done: list[dict]) -> dict:
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
    """Per-regime summary: the three completion classes (maintained path, exact fallback, failed),
    the error statistics over the maintained-path trials (headline) and over every completed trial
    (``all_completed``), the decay baseline, fallback counts and conditioning."""
    done = [t for t in trials if t is not None]
    maint = [t for t in done if not t.get("deletion_fallbacks", 0)]
    fb = [t for t in done if t.get("deletion_fallbacks", 0)]
    dec = np.array([t["decay_max_abs_score_dev"] for t in done]) if done else np.array([np.nan])
    rem = [r for t in done for r in t["removals"]]
    failed_removals = failed_removals or []
    by = {}
    for cls, sel in (("active", lambda s: s != "reserve"), ("reserve", lambda s: s == "reserve")):
        rows = [r for r in rem if sel(r["status"])]
        by[cls] = _class_summary(rows, len(rows) + sum(sel(s) for s in failed_removals))
    conds = np.array([t["cond_K_SS"] for t in done]) if done else np.array([np.nan])
    cond_sup = np.array([t["cond_K_support"] for t in done]) if done else np.array([np.nan])
    head = _dev_stats(maint)
    return {
        "attempted": attempted,
        "completed": len(done),
        "completed_maintained": len(maint),
        "completed_fallback": len(fb),
        "failed": attempted - len(done),
        "stats_over": "trials completed on the maintained path",
        "partition_match_pct": head["partition_match_pct"],
        "score_dev_median": head["score_dev_median"],
        "score_dev_mean": head["score_dev_mean"],
        "score_dev_p95": head["score_dev_p95"],
        "score_dev_worst": head["score_dev_worst"],
        "kkt_residual_worst": head["kkt_residual_worst"],
        "all_completed": _dev_stats(done),
        "decay_median": float(np.median(dec)),
        "decay_worst": float(np.max(dec)),
        "active_removals": int(sum(s != "reserve" for t in done for s in t["removed_status"])),
        "n_keys_median": float(np.median([t["n"] for t in done])) if done else float("nan"),
        "fallbacks": int(sum(t.get("deletion_fallbacks", 0) for t in done)),
        "fallbacks_admission": int(sum(t["fallbacks_admission"] for t in done)),
        "trials_with_fallback": len(fb),
        "cond_K_SS_median": float(np.median(conds)),
        "cond_K_SS_max": float(np.max(conds)),
        "cond_K_support_median": float(np.median(cond_sup)),
        "pct_cond_K_support_ge_1e9": 100.0 * float(np.mean(cond_sup >= 1e9)) if done else 0.0,
        "by_removal": by,
    }


def regime_seed(name: str) -> int:
    """A stable per-regime stream id (from the name), so a regime draws the same trials whether it
    runs alone (one Prefect task per regime) or beside others, in any order."""
    import hashlib

    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")


def run_audit(trials: int = PAPER_TRIALS, regimes: list[str] | None = None, seed: int = 0, nu: float = 0.4,
              sigma: float = 2.0, gamma: float = 0.01, progress: bool = True, jitter_sweep: bool = False,
              sweep_trials: int = 60) -> dict:
    """Run the audit; returns ``{"protocol": {...}, "regimes": {name: summary}, "failures": [...]}``
    and, with ``jitter_sweep``, ``"jitter_sweep": {name: summary}`` over ``SWEEP_JITTERS``.
    Each summary carries its regime's ``info`` (:data:`REGIME_INFO`); ``protocol`` carries the
    trial-count label and the low-power label (:func:`power`)."""

    names = list(regimes) if regimes else list(DEFAULT_REGIMES)
    unknown = [r for r in names if r not in REGIMES]
    if unknown:
        raise KeyError(f"unknown audit regime(s) {unknown}; known: {sorted(REGIMES)}")
    out: dict = {"protocol": {"trials": trials, "nu": nu, "sigma": sigma, "gamma": gamma,
                              "removals_per_trial": 2, "jitter": 0.1, "seed": seed,
                              "trials_label": trials_label(trials, len(names)),
                              "power": power(trials, len(names))},
                 "regimes": {}, "failures": []}
    for name in names:
        out["regimes"][name] = _run_regime(name, trials, np.random.default_rng([seed, regime_seed(name)]),
                                           out["failures"], nu, sigma, gamma, progress)
    if jitter_sweep:
        out["jitter_sweep"] = {}
        for j in SWEEP_JITTERS:
            name = sweep_name(j)
            summ = _run_regime(name, sweep_trials, np.random.default_rng([seed, regime_seed(name)]),
                               out["failures"], nu, sigma, gamma, progress)
            summ["jitter"] = j
            out["jitter_sweep"][name] = summ
    return out


def _finite_or_none(x):
    """JSON-safe summaries: a statistic over an empty group (e.g. no reserve removal drawn) or an
    infinite condition number is ``None`` (JSON null), never NaN/inf."""
    if isinstance(x, dict):
        return {k: _finite_or_none(v) for k, v in x.items()}
    if isinstance(x, float) and not np.isfinite(x):
        return None
    return x


def _f(x) -> float:
    return float("nan") if x is None else float(x)


def _run_regime(name, trials, rng, failures, nu, sigma, gamma, progress) -> dict:
    from tqdm.auto import tqdm

    results: list[dict | None] = []
    failed_removals: list[str] = []
    for t in tqdm(range(trials), desc=f"audit {name}", disable=not progress, leave=False):
        X = REGIMES[name](rng)
        try:
            results.append(run_trial(X, rng, nu=nu, sigma=sigma, gamma=gamma))
        except GateError as exc:
            results.append(None)
            failures.append({"regime": name, "trial": t, "error": f"{type(exc).__name__}: {exc}"})
    summ = summarise(results, trials, failed_removals)
    summ["info"] = dict(REGIME_INFO.get(name, {}))
    return _finite_or_none(summ)


def format_table(res: dict) -> str:
    """The audit as a text table: per regime the three completion classes, the error statistics over
    the maintained-path trials, the decay median, and the worst active / reserve removal."""
    head = (f"{'regime':<14}{'data':>10}{'attempted':>10}{'maintained':>11}{'fallback':>9}{'failed':>7}"
            f"{'part.match':>11}{'median':>10}{'p95':>10}{'worst':>10}{'decay med':>11}{'act worst':>11}"
            f"{'res worst':>11}{'cond sup':>10}")
    lines = [head, "-" * len(head)]
    rows = list(res["regimes"].items()) + list(res.get("jitter_sweep", {}).items())
    for name, s in rows:
        by = s.get("by_removal", {})
        act = _f(by.get("active", {}).get("score_dev_worst"))
        rsv = _f(by.get("reserve", {}).get("score_dev_worst"))
        lines.append(
            f"{name:<14}{str(s.get('info', {}).get('data', '')):>10}{s['attempted']:>10}"
            f"{s['completed_maintained']:>11}{s['completed_fallback']:>9}{s['failed']:>7}"
            f"{_f(s['partition_match_pct']):>10.1f}%"
            f"{_f(s['score_dev_median']):>10.1e}{_f(s['score_dev_p95']):>10.1e}{_f(s['score_dev_worst']):>10.1e}"
            f"{_f(s['decay_median']):>11.1e}{act:>11.1e}{rsv:>11.1e}{_f(s.get('cond_K_support_median')):>10.1e}"
        )
    lines.append("(median / p95 / worst |Δs| over the trials completed on the maintained path; a trial a deletion of "
                 "which took the exact fallback is counted under 'fallback', never as maintained)")
    pw = res.get("protocol", {}).get("power", {})
    if pw.get("label"):
        lines.append("low power: this audit " + pw["label"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sv_core.audit", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=PAPER_TRIALS, help="trials per regime (default: the paper's 300)")
    ap.add_argument("--regimes", nargs="*", default=None,
                    help=f"default: {' '.join(DEFAULT_REGIMES)} (the paper's synthetic regimes); also: "
                         f"{' '.join(sorted(set(REGIMES) - set(DEFAULT_REGIMES)))}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jitter-sweep", action="store_true",
                    help="also run near-duplicate clusters at every jitter in SWEEP_JITTERS")
    ap.add_argument("--sweep-trials", type=int, default=60, help="trials per jitter of the sweep")
    ap.add_argument("--json", dest="json_out", default=None, help="write the result JSON here")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    res = run_audit(args.trials, args.regimes, args.seed, progress=not args.no_progress,
                    jitter_sweep=args.jitter_sweep, sweep_trials=args.sweep_trials)
    res["runtime_s"] = time.perf_counter() - t0
    print(format_table(res))
    for f in res["failures"][:10]:
        print("incomplete:", f)
    if args.json_out:
        import pathlib

        p = pathlib.Path(args.json_out)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(res, indent=2))
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
