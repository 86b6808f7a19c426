"""Fixed-C deletion audit: maintained C&P decrement vs an independent same-C refit.

Protocol (SPEC §3, seed 001 §4): per trial, build a context, set ``C = 1/(nu n0)`` once, solve the
gate in fp64, remove two tokens (i) by the C&P decremental path and (ii) by a fresh retained-key
refit (:func:`sv_core.refit`, Clarabel + KKT polish) at the same C, and report the largest
|gate-score difference| over retained, removed, and jittered (0.1) retained probes. The
coefficient-decay baseline keeps the removed tokens, multiplies their coefficients by
``gamma`` and does not re-solve; it is scored on the same probes against the same refit. Every
attempted trial stays in the denominator under exactly one completion path; the statistics:
:func:`run_audit`. ``REGIME_INFO`` states how each regime is built.

Usage::

    python -m sv_core.audit --trials 300 --json runs/audit/result.json
"""
from __future__ import annotations

import argparse
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
from sv_core.audit_summary import (  # noqa: F401  (re-exported: part of the audit's API)
    PATHS,
    finite_or_none,
    format_table,
    summarise,
    trial_path,
)
from sv_core.calibrate import calibrate_C
from sv_core.errors import GateError
from sv_core.gate import Gate
from sv_core.jsonfile import write_json
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
    "the optimal coefficients non-unique (the per-key partition can differ while the gate score agrees, and "
    "which split a solver lands on depends on rounding, so it moves across machines); the partition figure "
    "is therefore compared on the unique part of the optimum (a repeat group's coefficients summed), and its "
    "rate is still a consequence of that construction (p_repeats, jitter range), chosen to make the support "
    "Gram block ill-conditioned (cond >= 1e9) like the paper's near-duplicate regime; it is not a "
    "measurement of natural data"))
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


def unique_partition(X: np.ndarray, alpha: np.ndarray, C: float, tol: float | None = None) -> np.ndarray:
    """The (S, E, R) partition on the unique part of an SVDD optimum, one label per key: the label
    of the key's group of bit-identical rows of ``X``, from the group's summed coefficient — 0
    reserve (sum <= tol), 2 bound (every member at C), 1 margin.

    Any split of a repeat group's mass is optimal (the members' kernel columns are identical), so
    the per-key partition is not unique under exact repeats; the summed mass of each distinct key
    is (the RBF Gram of distinct keys is positive definite). Without repeats this is the per-key
    partition. ``tol`` defaults to ``1e-9 C`` per member."""
    tol = 1e-9 * C if tol is None else tol
    _, inv, cnt = np.unique(X, axis=0, return_inverse=True, return_counts=True)
    inv = inv.ravel()
    mass = np.bincount(inv, weights=np.asarray(alpha, dtype=np.float64), minlength=cnt.size)
    return np.where(mass <= tol * cnt, 0, np.where(mass >= (C - tol) * cnt, 2, 1))[inv]


def run_trial(X: np.ndarray, rng: np.random.Generator, nu: float = 0.4, sigma: float = 2.0,
              n_remove: int = 2, gamma: float = 0.01, jitter: float = 0.1) -> dict:
    """One audit trial; raises GateError if the maintained path cannot complete.

    The tokens are removed one at a time; each removal is compared with its own same-C refit
    of the retained keys (``removals``: status, deviation, KKT, partition match, fallback, SMO
    polish), and the trial-level figures are those of the final state with the worst removal."""
    n = X.shape[0]
    C = calibrate_C(nu, n)
    g = Gate(C=C, sigma=sigma)
    ids = g.admit(X)
    fallbacks_admit, polishes_admit = g.fallbacks, g.tightenings
    targets = rng.choice(ids, size=n_remove, replace=False)
    alpha_full, rho_full = g.alpha.copy(), g.rho
    status = [g.status_of(int(t)) for t in targets]
    core = g._solver
    live = core.live()
    K = core.K[np.ix_(live, live)]
    cond_S = _cond(K, np.flatnonzero(core.status[live] == 1))
    cond_sup = _cond(K, np.flatnonzero(core.alpha[live] > 0.0))
    removals = []
    t_dec = 0.0
    t_ref = 0.0
    removed = np.zeros(n, dtype=bool)
    for tid, st in zip(targets, status):
        t0 = time.perf_counter()
        polished_before = g.tightenings
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
            "partition_match": bool(np.array_equal(unique_partition(Xr, g.alpha, C), unique_partition(Xr, a_ref, C))),
            "fallback": bool(r.fallback),
            # finished on the maintained state only after the KKT guard's warm SMO polish
            "polished": bool(g.tightenings > polished_before and not r.fallback),
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
        "partition_match": bool(np.array_equal(unique_partition(Xr, g.alpha, C), unique_partition(Xr, a_ref, C))),
        "kkt_residual": max(r["kkt_residual"] for r in removals),
        "removed_status": status,
        "decrement_s": t_dec,
        "refit_s": t_ref,
        "fallbacks": int(g.fallbacks),
        "fallbacks_admission": int(fallbacks_admit),
        # deletions completed by the exact fallback: such a trial is not a maintained-path trial
        "deletion_fallbacks": int(sum(r["fallback"] for r in removals)),
        # deletions that needed the SMO polish: such a trial is counted apart from the plain maintained path
        "deletion_polishes": int(sum(r["polished"] for r in removals)),
        "polishes_admission": int(polishes_admit),
        "cond_K_SS": cond_S,
        "cond_K_support": cond_sup,
        "removals": removals,
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
    trial-count label and the low-power label (:func:`power`).

    Completion paths (:mod:`sv_core.audit_summary`): ``completed_maintained`` (both deletions on the
    plain C&P path), ``completed_polished`` (on the maintained state, but a deletion finished only
    after the KKT guard's warm SMO polish), ``completed_fallback`` (a deletion completed by the
    gate's exact fallback: fresh refit, maintained state rebuilt) and ``failed`` (a deletion raised).

    The headline error statistics (median / mean / p95 / worst ``|Δs|``, partition agreement) are over
    the trials completed on the maintained state (plain path and after the polish); ``by_path`` and
    ``all_completed`` repeat them per path and over every completed trial. The partition is compared
    on the unique part of the optimum (:func:`unique_partition`: bit-identical keys form one group
    whose coefficients are summed), which is well defined under exact repeats, where the per-key
    partition is not. Each removal is also compared with its own refit and reported by class
    (``by_removal``: active removals vs reserve removals, which are trivially exact).
    ``--jitter-sweep`` adds near-duplicate clusters at every jitter in ``SWEEP_JITTERS``.
    """

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
    return finite_or_none(summ)


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
        print(f"wrote {write_json(args.json_out, res)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
