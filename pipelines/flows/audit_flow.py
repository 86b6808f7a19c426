"""``forgetful audit``: the fixed-C deletion audit, like for like with seed 001 §4.

Default: the paper's protocol, its four regimes x 300 trials — Gaussian keys (d = 6), redundant
near-duplicates, real ICU vitals from the warehouse (a random window of <= 160 h of a random stay,
z-scored six vitals, deduplicated at 0.1 SD) and the frozen learned keys of a small trained recall
model. Per trial: ``C = 1/(ν·n)`` set once (ν = 0.4, σ = 2), two tokens removed by the maintained
C&P decrement and by a same-C refit, max |gate-score difference| over retained, removed and
jittered probes; coefficient decay (γ = 0.01) on the same probes.

Per regime the result counts attempted trials, trials completed on the maintained path, trials
completed on it only after the KKT guard's SMO polish, trials completed by the exact fallback and
failed trials (a polished or fallback trial is never counted as plain maintained); the error
statistics are over the trials completed on the maintained state. Real-data and synthetic
regimes are separate rows with separate totals, each beside the paper's row; each regime's
construction is stated. Fewer trials (``run-all`` runs 50) are labelled "50 of the paper's 300
trials per regime" and low power. Regimes beyond the paper (``clustered``, ``icu_like``) run when
named with ``--regimes``. Generators: :mod:`sv_core.audit`, :mod:`evaluation.studies.audit_regimes`;
result: :mod:`evaluation.studies.deletion_audit`. One Prefect task per regime.
"""
from __future__ import annotations

import time

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from dashboards.numbers import fmt
from dashboards.seed_figures import seed_field, seed_line
from pipelines import jsonout
from pipelines.runtime import runner, task_cache
from pipelines.settings import COUNT, SEED
from pipelines.store import warehouse as wh

ICU_REGIME = "icu_warehouse"
LEARNED_REGIME = "learned"
#: the paper's four regimes (seed 001 §4), in its Table 2 order
DEFAULT_REGIMES = ("gaussian", "redundant", ICU_REGIME, LEARNED_REGIME)
#: regimes beyond the paper's, run when named
EXTRA_REGIMES = ("clustered", "icu_like")
ICU_MAX_HOURS, ICU_MIN_KEYS, ICU_DEDUPE_SD = 160, 12, 0.1
#: the ICU regime reads a seeded sample of at most this many stays (every stay of a smaller cohort)
ICU_SAMPLE_STAYS = 2000
LEARNED_STEPS, LEARNED_FACTS = 600, 16


def register(regime: str, warehouse: str | None, seed: int) -> None:
    """Register the warehouse-backed ICU regime or the learned-key regime (with data kind, paper
    regime and construction); the synthetic regimes are registered by :mod:`sv_core.audit`."""
    from evaluation.studies import audit_regimes as ar
    from sv_core import audit

    if regime == ICU_REGIME:
        reg = ar.icu_regime_from_warehouse(warehouse, max_hours=ICU_MAX_HOURS, min_keys=ICU_MIN_KEYS,
                                           tol=ICU_DEDUPE_SD, sample=ICU_SAMPLE_STAYS, seed=seed)
        sampled = (f"; among a seeded sample of {reg.n_read:,} of the warehouse's {reg.n_total:,} stays"
                   if reg.n_read < reg.n_total else "")
        audit.register_regime(
            ICU_REGIME, reg, data=wh.data_kind(warehouse), paper_regime="mimic",
            construction=ar.ICU_CONSTRUCTION.format(min_keys=ICU_MIN_KEYS, max_hours=ICU_MAX_HOURS, tol=ICU_DEDUPE_SD)
            + sampled)
    elif regime == LEARNED_REGIME:
        audit.register_regime(
            LEARNED_REGIME, ar.learned_regime(seed=seed, n_facts=LEARNED_FACTS, train_steps=LEARNED_STEPS),
            data="learned", paper_regime="learned",
            construction=ar.LEARNED_CONSTRUCTION.format(steps=LEARNED_STEPS, seed=seed, n_facts=LEARNED_FACTS))


@task(name="audit-regime", cache_policy=NO_CACHE, persist_result=False,
      retries=2, retry_delay_seconds=runner.IO_RETRY_DELAYS, retry_condition_fn=runner.retry_transient_io)
@task_cache.cached
def audit_task(warehouse: str | None, content_hash: str | None, regime: str, trials: int, seed: int) -> dict:
    from sv_core import audit

    register(regime, warehouse, seed)
    res = audit.run_audit(trials, [regime], seed, progress=False)
    return {"summary": res["regimes"][regime], "protocol": res["protocol"], "failures": len(res["failures"]),
            "failure_kinds": sorted({f["error"].split(":")[0] for f in res["failures"]})}


@flow(name="deletion-audit", log_prints=True)
@runner.warehouse_locked
def audit_flow(warehouse: str | None = "runs/warehouse.duckdb", runs_dir: str = "runs", trials: int = 300,
               regimes: tuple[str, ...] = DEFAULT_REGIMES, seed: int = 0,
               progress: bool = True) -> dict:
    from evaluation.studies.deletion_audit import audit_result
    from pipelines.errors import StudyInputError
    from sv_core.audit import REGIMES

    t0 = time.perf_counter()
    known = set(DEFAULT_REGIMES) | set(REGIMES)
    unknown = [r for r in regimes if r not in known]
    if unknown or not regimes or trials < 1:
        raise StudyInputError(f"audit: unknown regime(s) {unknown}; choose from {sorted(known)}" if unknown else
                              "audit: name at least one regime" if not regimes else
                              f"audit: --trials must be >= 1, got {trials}")
    h = None
    if ICU_REGIME in regimes:
        wh.require(warehouse)
        h = wh.content_hash(warehouse)
        # fail at the start, with counts, when no stay of this cohort can yield an ICU context
        from evaluation.studies.audit_regimes import icu_regime_from_warehouse
        icu_regime_from_warehouse(warehouse, max_hours=ICU_MAX_HOURS, min_keys=ICU_MIN_KEYS, tol=ICU_DEDUPE_SD,
                                  sample=ICU_SAMPLE_STAYS, seed=seed)
    futures = [audit_task.submit(warehouse if r == ICU_REGIME else None, h if r == ICU_REGIME else None, r, trials,
                                 seed) for r in regimes]
    res = dict(zip(regimes, runner.gather(futures, "audit (regimes)", progress)))
    protocol = next(iter(res.values()))["protocol"]
    result = audit_result({r: v["summary"] for r, v in res.items()}, trials=trials, seed=seed, protocol=protocol,
                          failure_kinds={r: v["failure_kinds"] for r, v in res.items()},
                          runtime_s=time.perf_counter() - t0)
    result["seed_figure"] = seed_field("deletion_audit")
    runner.write_study_result(result, runs_dir)
    return result


@runner.cli_errors
def _main(args) -> int:
    regimes = tuple(args.regimes) if args.regimes else DEFAULT_REGIMES
    r = runner.run_cli_flow(audit_flow, args, warehouse=args.warehouse, runs_dir=args.runs, trials=args.trials,
                            regimes=regimes, seed=args.seed, progress=not args.no_progress)
    m = r["metrics"]
    print(f"deletion audit: {m['headline']}")
    print(f"  {'regime':<34}{'data':>10}{'attempted':>10}{'maintained':>11}{'polished':>9}{'fallback':>9}{'failed':>7}"
          f"{'median':>9}{'p95':>9}{'worst':>9}{'decay med':>10}   paper (completed, partition %, median, worst)")
    for row in r["tables"][0]["rows"]:
        paper = ", ".join(fmt(v, 2) for v in row[13:17])
        print(f"  {row[0]:<34}{str(row[1] or ''):>10}{row[3]:>10}{row[4]:>11}{row[5]:>9}{row[6]:>9}{row[7]:>7}"
              f"{fmt(row[9], 2):>9}{fmt(row[10], 2):>9}{fmt(row[11], 2):>9}{fmt(row[12], 2):>10}   {paper}")
    if m["power"]["low_power"]:
        print(f"  low power: this audit {m['power']['label']}")
    print("  " + seed_line("deletion_audit", r["data"]))
    print(f"  runtime {r['runtime_s']:.1f}s")
    jsonout.emit(args, r)
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("audit", help="fixed-C deletion audit: the paper's 4 regimes x 300 trials (real ICU keys incl.)",
                       description=__doc__)
    p.add_argument("--trials", type=COUNT, default=300, help="trials per regime (default 300, the paper's count)")
    p.add_argument("--regimes", nargs="*", default=None, metavar="REGIME",
                   help="regimes to run (default: the paper's " + ", ".join(DEFAULT_REGIMES) + "; also "
                        + ", ".join(EXTRA_REGIMES) + ")")
    p.add_argument("--seed", type=SEED, default=0, help="random seed of the trials (default %(default)s)")
    runner.add_common_args(p)
    jsonout.add_json_arg(p)
    p.set_defaults(func=_main)
