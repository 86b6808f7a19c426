"""Fixed-C deletion audit: maintained C&P decrement vs an independent same-C refit.

Protocol (SPEC §3, seed 001 §4): per trial, build a context, set ``C = 1/(nu n0)`` once, solve the
gate in fp64, remove two tokens (i) by the C&P decremental path and (ii) by a fresh retained-key
refit (:func:`sv_core.refit`, Clarabel + KKT polish) at the same C, and report the largest
|gate-score difference| over retained, removed, and jittered (0.1) retained probes. The
coefficient-decay baseline keeps the removed tokens, multiplies their coefficients by
``gamma`` and does not re-solve; it is scored on the same probes against the same refit.

Every attempted trial stays in the denominator: a deletion that raises counts as incomplete.

Usage::

    python -m sv_core.audit --trials 300 --json runs/audit/result.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Callable

import numpy as np

from .calibrate import calibrate_C
from .errors import GateError
from .gate import Gate
from .kernels import rbf_kernel
from .refit import refit

#: regime name -> generator(rng) returning (n, d) keys. Other packages add regimes (ICU, learned).
REGIMES: dict[str, Callable[[np.random.Generator], np.ndarray]] = {}
#: regimes run when none are named: the seed's synthetic regimes (others are opt-in)
DEFAULT_REGIMES = ["gaussian", "clustered", "icu_like"]


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
    X[near] += 1e-6 * rng.standard_normal((int(near.sum()), d))
    return X[rng.permutation(X.shape[0])]


register_regime("gaussian", gaussian_keys)
register_regime("clustered", clustered_keys)
register_regime("icu_like", icu_like_keys)
register_regime("duplicates", duplicate_keys)
_OPT_IN = {"duplicates"}  # a stress regime beyond the seed's protocol; run it by name


def run_trial(X: np.ndarray, rng: np.random.Generator, nu: float = 0.4, sigma: float = 2.0,
              n_remove: int = 2, gamma: float = 0.01, jitter: float = 0.1) -> dict:
    """One audit trial; raises GateError if the maintained path cannot complete."""
    n = X.shape[0]
    C = calibrate_C(nu, n)
    g = Gate(C=C, sigma=sigma)
    ids = g.admit(X)
    targets = rng.choice(ids, size=n_remove, replace=False)
    alpha_full, rho_full = g.alpha.copy(), g.rho
    status = [g.status_of(int(t)) for t in targets]
    t0 = time.perf_counter()
    g.forget_many([int(t) for t in targets])
    t_dec = time.perf_counter() - t0
    keep = ~np.isin(ids, targets)
    Xr = X[keep]
    t0 = time.perf_counter()
    a_ref, rho_ref = refit(Xr, C=C, sigma=sigma)
    t_ref = time.perf_counter() - t0
    probes = np.vstack([Xr, X[~keep], Xr + jitter * rng.standard_normal(Xr.shape)])
    s_ref = 2.0 * rbf_kernel(probes, Xr, sigma) @ a_ref - rho_ref
    dev = float(np.abs(g.score(probes) - s_ref).max())
    # decay baseline: keep the removed tokens, scale their coefficients, no re-solve
    a_dec = alpha_full.copy()
    a_dec[~keep] *= gamma
    s_dec = 2.0 * rbf_kernel(probes, X, sigma) @ a_dec - rho_full
    dev_decay = float(np.abs(s_dec - s_ref).max())
    tol = 1e-9 * C
    part = lambda a: np.where(a <= tol, 0, np.where(a >= C - tol, 2, 1))  # noqa: E731
    return {
        "n": n,
        "C": C,
        "max_abs_score_dev": dev,
        "decay_max_abs_score_dev": dev_decay,
        "partition_match": bool(np.array_equal(part(g.alpha), part(a_ref))),
        "kkt_residual": g.kkt_residual()["max"],
        "removed_status": status,
        "decrement_s": t_dec,
        "refit_s": t_ref,
    }


def summarise(trials: list[dict], attempted: int) -> dict:
    done = [t for t in trials if t is not None]
    devs = np.array([t["max_abs_score_dev"] for t in done]) if done else np.array([np.nan])
    dec = np.array([t["decay_max_abs_score_dev"] for t in done]) if done else np.array([np.nan])
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
    }


def run_audit(trials: int = 300, regimes: list[str] | None = None, seed: int = 0, nu: float = 0.4,
              sigma: float = 2.0, gamma: float = 0.01, progress: bool = True) -> dict:
    """Run the audit; returns ``{"regimes": {name: summary}, "failures": [...], ...}``."""
    from tqdm.auto import tqdm

    names = regimes or [r for r in REGIMES if r in DEFAULT_REGIMES or r not in _OPT_IN]
    unknown = [r for r in names if r not in REGIMES]
    if unknown:
        raise KeyError(f"unknown audit regime(s) {unknown}; known: {sorted(REGIMES)}")
    out: dict = {"protocol": {"trials": trials, "nu": nu, "sigma": sigma, "gamma": gamma,
                              "removals_per_trial": 2, "jitter": 0.1, "seed": seed},
                 "regimes": {}, "failures": []}
    for r_i, name in enumerate(names):
        rng = np.random.default_rng([seed, r_i])
        results = []
        for t in tqdm(range(trials), desc=f"audit {name}", disable=not progress, leave=False):
            X = REGIMES[name](rng)
            try:
                results.append(run_trial(X, rng, nu=nu, sigma=sigma, gamma=gamma))
            except GateError as exc:
                results.append(None)
                out["failures"].append({"regime": name, "trial": t, "error": f"{type(exc).__name__}: {exc}"})
        out["regimes"][name] = summarise(results, trials)
    return out


def format_table(res: dict) -> str:
    head = (f"{'regime':<12}{'completed':>12}{'part.match':>11}{'median':>10}{'p95':>10}"
            f"{'worst':>10}{'decay med':>11}")
    lines = [head, "-" * len(head)]
    for name, s in res["regimes"].items():
        lines.append(
            f"{name:<12}{s['completed']:>6}/{s['attempted']:<5}{s['partition_match_pct']:>10.1f}%"
            f"{s['score_dev_median']:>10.1e}{s['score_dev_p95']:>10.1e}{s['score_dev_worst']:>10.1e}"
            f"{s['decay_median']:>11.1e}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sv_core.audit", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--regimes", nargs="*", default=None,
                    help=f"default: {' '.join(DEFAULT_REGIMES)}; opt-in stress regime: duplicates")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", dest="json_out", default=None, help="write the result JSON here")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    res = run_audit(args.trials, args.regimes, args.seed, progress=not args.no_progress)
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
