"""Fixed-C deletion audit: maintained C&P decrement vs an independent same-C refit.

Protocol (SPEC §3, seed 001 §4): per trial, build a context, set ``C = 1/(nu n0)`` once, solve the
gate in fp64, remove two tokens (i) by the C&P decremental path and (ii) by a fresh retained-key
refit (:func:`sv_core.refit`, Clarabel + KKT polish) at the same C, and report the largest
|gate-score difference| over retained, removed, and jittered (0.1) retained probes. The
coefficient-decay baseline keeps the removed tokens, multiplies their coefficients by
``gamma`` and does not re-solve; it is scored on the same probes against the same refit.

Every attempted trial stays in the denominator: a deletion that raises counts as incomplete.
Each removal is also compared with its own refit and reported by class (``by_removal``: active
removals vs reserve removals, which are trivially exact); ``fallbacks`` counts operations the
gate completed by its exact fallback (fresh refit, maintained state rebuilt). The ``redundant``
regime is calibrated to the seed's hard near-duplicate regime; ``--jitter-sweep`` adds
near-duplicate clusters at every jitter in ``SWEEP_JITTERS`` (reported under ``jitter_sweep``).

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

from .calibrate import calibrate_C
from .errors import GateError
from .gate import Gate
from .kernels import rbf_kernel
from .refit import refit

#: regime name -> generator(rng) returning (n, d) keys. Other packages add regimes (ICU, learned).
REGIMES: dict[str, Callable[[np.random.Generator], np.ndarray]] = {}
#: regimes run when none are named: the seed's synthetic regimes (others are opt-in)
DEFAULT_REGIMES = ["gaussian", "clustered", "icu_like", "redundant"]


def register_regime(name: str, fn: Callable[[np.random.Generator], np.ndarray]) -> None:
    """Add an audit regime: ``fn(rng) -> (n, d)`` keys."""
    REGIMES[name] = fn


def dedupe(X: np.ndarray, tol: float = 0.1) -> np.ndarray:
    """Greedy deduplication: keep a key only if it is farther than ``tol`` (Euclidean) from
    every key kept before it. Returns the kept keys in their original order."""
    kept: list[int] = []
    for i in range(X.shape[0]):
        if not kept or np.min(np.linalg.norm(X[kept] - X[i], axis=1)) > tol:
            kept.append(i)
    return X[kept]


def gaussian_keys(rng: np.random.Generator, n: int = 64, d: int = 6) -> np.ndarray:
    return rng.standard_normal((n, d))


def clustered_keys(rng: np.random.Generator, clusters: int = 8, per: int = 8, d: int = 6,
                   spread: float = 2.0, jitter: float = 0.01) -> np.ndarray:
    """Clustered near-duplicates: a few centres, each repeated with tiny jitter."""
    centres = spread * rng.standard_normal((clusters, d))
    X = np.repeat(centres, per, axis=0) + jitter * rng.standard_normal((clusters * per, d))
    return X[rng.permutation(X.shape[0])]


def icu_like_keys(rng: np.random.Generator, hours: int = 160, d: int = 6) -> np.ndarray:
    """ICU-like standardised 6-d vitals: long stable stretches with small noise and slow drift,
    a few short excursions; deduplicated at 0.1 SD as in the seed's ICU regime."""
    X = np.empty((hours, d))
    level = 0.5 * rng.standard_normal(d)
    t = 0
    while t < hours:
        seg = int(rng.integers(12, 48))
        drift = 0.01 * rng.standard_normal(d)
        for _ in range(min(seg, hours - t)):
            level = level + drift
            X[t] = level + 0.05 * rng.standard_normal(d)
            t += 1
        if rng.random() < 0.5 and t < hours:  # excursion (deterioration-like)
            L = int(rng.integers(1, 5))
            X[t : t + L] = level + rng.normal(0, 1.5, size=d)
            t += L
        level = level + 0.3 * rng.standard_normal(d)
    return dedupe(X, 0.1)


def duplicate_keys(rng: np.random.Generator, groups: int = 12, per: int = 6, d: int = 6) -> np.ndarray:
    """Stress regime beyond the seed's: exact repeats and 1e-6 near-repeats of a few keys."""
    centres = 1.5 * rng.standard_normal((groups, d))
    X = np.repeat(centres, per, axis=0)
    near = rng.random(X.shape[0]) < 0.5
    X[near] += 1e-6 * rng.standard_normal((int(np.count_nonzero(near)), d))
    return X[rng.permutation(X.shape[0])]


def redundant_keys(rng: np.random.Generator, clusters: int = 8, per: int = 8, d: int = 6,
                   spread: float = 2.0, jitter_range: tuple[float, float] = (1e-6, 1e-3),
                   p_repeats: float = 0.6) -> np.ndarray:
    """The seed's hard redundant regime: near-duplicate clusters at a per-trial jitter drawn
    log-uniformly from ``jitter_range``; with probability ``p_repeats`` half of each cluster's
    copies are exact repeats. Calibrated so that about half the trials have an identifiable
    partition (exact repeats make the optimal coefficients non-unique) and the support's Gram
    block has condition number >= 1e9 (see ``cond_K_support`` in the summary)."""
    centres = spread * rng.standard_normal((clusters, d))
    X = np.repeat(centres, per, axis=0)
    jit = float(np.exp(rng.uniform(np.log(jitter_range[0]), np.log(jitter_range[1]))))
    moved = np.ones(X.shape[0], dtype=bool)
    if rng.random() < p_repeats:
        moved[rng.permutation(X.shape[0])[: X.shape[0] // 2]] = False
    X[moved] += jit * rng.standard_normal((int(moved.sum()), d))
    return X[rng.permutation(X.shape[0])]


def jitter_regime(jitter: float, clusters: int = 8, per: int = 8, d: int = 6, spread: float = 2.0):
    """Near-duplicate clusters (``clusters`` centres x ``per`` copies) at a fixed ``jitter``
    (0: exact repeats), for the jitter sweep."""
    def gen(rng: np.random.Generator) -> np.ndarray:
        centres = spread * rng.standard_normal((clusters, d))
        X = np.repeat(centres, per, axis=0) + jitter * rng.standard_normal((clusters * per, d))
        return X[rng.permutation(X.shape[0])]
    return gen


#: the jitter sweep of near-duplicate clusters (8 x 8, d = 6); 0.0 = exact repeats
SWEEP_JITTERS = (1e-2, 1e-3, 3e-4, 1e-4, 3e-5, 1e-5, 1e-6, 1e-7, 0.0)


def sweep_name(j: float) -> str:
    return "jitter_0" if j == 0.0 else f"jitter_{j:.0e}"


register_regime("gaussian", gaussian_keys)
register_regime("clustered", clustered_keys)
register_regime("icu_like", icu_like_keys)
register_regime("duplicates", duplicate_keys)
register_regime("redundant", redundant_keys)
for _j in SWEEP_JITTERS:
    register_regime(sweep_name(_j), jitter_regime(_j))
#: stress regimes beyond the seed's protocol; run them by name (or ``--jitter-sweep``)
_OPT_IN = {"duplicates", *(sweep_name(j) for j in SWEEP_JITTERS)}


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


def summarise(trials: list[dict | None], attempted: int, failed_removals: list[str] | None = None) -> dict:
    done = [t for t in trials if t is not None]
    devs = np.array([t["max_abs_score_dev"] for t in done]) if done else np.array([np.nan])
    dec = np.array([t["decay_max_abs_score_dev"] for t in done]) if done else np.array([np.nan])
    rem = [r for t in done for r in t["removals"]]
    failed_removals = failed_removals or []
    by = {}
    for cls, sel in (("active", lambda s: s != "reserve"), ("reserve", lambda s: s == "reserve")):
        rows = [r for r in rem if sel(r["status"])]
        by[cls] = _class_summary(rows, len(rows) + sum(sel(s) for s in failed_removals))
    conds = np.array([t["cond_K_SS"] for t in done]) if done else np.array([np.nan])
    cond_sup = np.array([t["cond_K_support"] for t in done]) if done else np.array([np.nan])
    return {
        "attempted": attempted,
        "completed": len(done),
        "partition_match_pct": 100.0 * np.mean([t["partition_match"] for t in done]) if done else 0.0,
        "score_dev_median": float(np.median(devs)),
        "score_dev_mean": float(np.mean(devs)),
        "score_dev_p95": float(np.percentile(devs, 95)),
        "score_dev_worst": float(np.max(devs)),
        "decay_median": float(np.median(dec)),
        "decay_worst": float(np.max(dec)),
        "kkt_residual_worst": float(max((t["kkt_residual"] for t in done), default=np.nan)),
        "active_removals": int(sum(s != "reserve" for t in done for s in t["removed_status"])),
        "n_keys_median": float(np.median([t["n"] for t in done])) if done else float("nan"),
        "fallbacks": int(sum(t["fallbacks"] for t in done)),
        "fallbacks_admission": int(sum(t["fallbacks_admission"] for t in done)),
        "trials_with_fallback": int(sum(t["fallbacks"] > 0 for t in done)),
        "cond_K_SS_median": float(np.median(conds)),
        "cond_K_SS_max": float(np.max(conds)),
        "cond_K_support_median": float(np.median(cond_sup)),
        "pct_cond_K_support_ge_1e9": 100.0 * float(np.mean(cond_sup >= 1e9)) if done else 0.0,
        "by_removal": by,
    }


def run_audit(trials: int = 300, regimes: list[str] | None = None, seed: int = 0, nu: float = 0.4,
              sigma: float = 2.0, gamma: float = 0.01, progress: bool = True, jitter_sweep: bool = False,
              sweep_trials: int = 60) -> dict:
    """Run the audit; returns ``{"regimes": {name: summary}, "failures": [...], ...}`` and, with
    ``jitter_sweep``, ``"jitter_sweep": {name: summary}`` over ``SWEEP_JITTERS``."""

    names = regimes or [r for r in REGIMES if r in DEFAULT_REGIMES or r not in _OPT_IN]
    unknown = [r for r in names if r not in REGIMES]
    if unknown:
        raise KeyError(f"unknown audit regime(s) {unknown}; known: {sorted(REGIMES)}")
    out: dict = {"protocol": {"trials": trials, "nu": nu, "sigma": sigma, "gamma": gamma,
                              "removals_per_trial": 2, "jitter": 0.1, "seed": seed},
                 "regimes": {}, "failures": []}
    for r_i, name in enumerate(names):
        out["regimes"][name] = _run_regime(name, trials, np.random.default_rng([seed, r_i]), out["failures"],
                                           nu, sigma, gamma, progress)
    if jitter_sweep:
        out["jitter_sweep"] = {}
        for j_i, j in enumerate(SWEEP_JITTERS):
            name = sweep_name(j)
            summ = _run_regime(name, sweep_trials, np.random.default_rng([seed, 1000 + j_i]),
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
    return _finite_or_none(summarise(results, trials, failed_removals))


def format_table(res: dict) -> str:
    head = (f"{'regime':<14}{'completed':>12}{'fallbk':>7}{'part.match':>11}{'median':>10}{'p95':>10}"
            f"{'worst':>10}{'decay med':>11}{'act worst':>11}{'res worst':>11}{'cond sup':>10}")
    lines = [head, "-" * len(head)]
    rows = list(res["regimes"].items()) + list(res.get("jitter_sweep", {}).items())
    for name, s in rows:
        by = s.get("by_removal", {})
        act = _f(by.get("active", {}).get("score_dev_worst"))
        rsv = _f(by.get("reserve", {}).get("score_dev_worst"))
        lines.append(
            f"{name:<14}{s['completed']:>6}/{s['attempted']:<5}{s.get('fallbacks', 0):>7}"
            f"{_f(s['partition_match_pct']):>10.1f}%"
            f"{_f(s['score_dev_median']):>10.1e}{_f(s['score_dev_p95']):>10.1e}{_f(s['score_dev_worst']):>10.1e}"
            f"{_f(s['decay_median']):>11.1e}{act:>11.1e}{rsv:>11.1e}{_f(s.get('cond_K_support_median')):>10.1e}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sv_core.audit", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--regimes", nargs="*", default=None,
                    help=f"default: {' '.join(DEFAULT_REGIMES)}; opt-in: {' '.join(sorted(_OPT_IN))}")
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
