"""``forgetful audit``: the fixed-C deletion audit (sv_core.audit) plus the real ICU-key regime.

Per trial: a context, ``C = 1/(ν·n)`` set once (ν = 0.4, σ = 2), two tokens removed by the
maintained C&P decrement and by a same-C refit, max |gate-score difference| over retained,
removed and jittered probes; coefficient decay (γ = 0.01) on the same probes. Regimes: the
registered synthetic ones (Gaussian, clustered near-duplicates, ICU-like), ``icu_warehouse``:
a random window (≤ 160 h) of a random stay of the warehouse, z-scored 6 vitals, deduplicated at
0.1 SD, and ``learned``: frozen keys of a small trained recall model. Regime generators live in
:mod:`evaluation.studies.audit_regimes`. One Prefect task per regime.
"""
from __future__ import annotations

import time

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from pipelines import jsonout, runner, task_cache
from pipelines import warehouse as wh

SEED_TEXT = ("seed 001 §4: 1,199/1,200 complete; median |Δs| 2.4e-9 / 5.7e-7 / 1.6e-9 / 4.5e-13 "
             "(Gaussian / clustered / ICU / learned); worst 1.1e-2; decay median 2.2e-2…2.4e-1")
ICU_REGIME = "icu_warehouse"
LEARNED_REGIME = "learned"
DEFAULT_REGIMES = ("gaussian", "clustered", "icu_like", "redundant", ICU_REGIME, LEARNED_REGIME)


@task(name="audit-regime", cache_policy=NO_CACHE, persist_result=False,
      retries=2, retry_delay_seconds=runner.IO_RETRY_DELAYS, retry_condition_fn=runner.retry_transient_io)
@task_cache.cached
def audit_task(warehouse: str | None, content_hash: str | None, regime: str, trials: int, seed: int) -> dict:
    from sv_core import audit

    from evaluation.studies.audit_regimes import icu_regime_from_warehouse, learned_regime

    if regime == ICU_REGIME:
        audit.register_regime(ICU_REGIME, icu_regime_from_warehouse(warehouse, max_hours=160, min_keys=12))
    elif regime == LEARNED_REGIME:
        audit.register_regime(LEARNED_REGIME, learned_regime(seed=seed))
    res = audit.run_audit(trials, [regime], seed, progress=False)
    return {"summary": res["regimes"][regime], "failures": len(res["failures"]),
            "failure_kinds": sorted({f["error"].split(":")[0] for f in res["failures"]})}


@flow(name="deletion-audit", log_prints=True)
@runner.warehouse_locked
def audit_flow(warehouse: str | None = "runs/warehouse.duckdb", runs_dir: str = "runs", trials: int = 300,
               regimes: tuple[str, ...] = DEFAULT_REGIMES, seed: int = 0,
               progress: bool = True) -> dict:
    t0 = time.perf_counter()
    h = None
    if ICU_REGIME in regimes:
        wh.require(warehouse)
        h = wh.content_hash(warehouse)
        # fail at the start, with counts, when no stay of this cohort can yield an ICU context
        from evaluation.studies.audit_regimes import icu_regime_from_warehouse
        icu_regime_from_warehouse(warehouse, max_hours=160, min_keys=12)
    futures = [audit_task.submit(warehouse if r == ICU_REGIME else None, h if r == ICU_REGIME else None, r, trials,
                                 seed) for r in regimes]
    res = dict(zip(regimes, runner.gather(futures, "audit (regimes)", progress)))
    att = sum(v["summary"]["attempted"] for v in res.values())
    comp = sum(v["summary"]["completed"] for v in res.values())
    rows = [[r, v["summary"]["completed"], v["summary"]["attempted"], v["summary"]["partition_match_pct"],
             v["summary"]["score_dev_median"], v["summary"]["score_dev_p95"], v["summary"]["score_dev_worst"],
             v["summary"]["decay_median"]] for r, v in res.items()]
    data = wh.data_kind(warehouse) if ICU_REGIME in regimes else "synthetic"
    result = {
        "study": "deletion_audit",
        "title": f"Fixed-C deletion audit ({data} ICU keys + synthetic regimes)",
        "data": data,
        "runtime_s": time.perf_counter() - t0,
        "seed_figure": {"text": SEED_TEXT},
        "metrics": {"attempted": att, "completed": comp,
                    **{r: {k: v["summary"][k] for k in ("completed", "attempted", "score_dev_median",
                                                        "score_dev_worst", "decay_median", "partition_match_pct",
                                                        "kkt_residual_worst")} for r, v in res.items()}},
        "tables": [{"title": "decrement vs same-C refit, max |Δ gate score|",
                    "columns": ["regime", "completed", "attempted", "partition match %", "median", "p95", "worst",
                                "decay median"], "rows": rows}],
        "figures": [{"kind": "bar", "title": "median |Δs|: decrement vs decay (γ=0.01)", "ylabel": "max |Δ score|",
                     "log_y": True, "categories": [f"{r} {w}" for r in res for w in ("decrement", "decay")],
                     "values": [max(v["summary"][k], 1e-17) for v in res.values()
                                for k in ("score_dev_median", "decay_median")]}],
        "claims": [{"statement": f"{r}: median max |Δs| decrement vs refit",
                    "reference": "fresh retained-key refit at the same fixed C",
                    "path": "maintained fp64 C&P decremental path", "operation": "active deletion",
                    "value": v["summary"]["score_dev_median"],
                    "holds": bool(v["summary"]["score_dev_median"] < v["summary"]["decay_median"])}
                   for r, v in res.items()],
        "config": {"trials_per_regime": trials, "nu": 0.4, "sigma": 2.0, "gamma": 0.01, "removals_per_trial": 2,
                   "seed": seed, "icu_window_h": 160, "icu_dedupe_sd": 0.1,
                   "failure_kinds": {r: v["failure_kinds"] for r, v in res.items() if v["failure_kinds"]}},
    }
    runner.write_study_result(result, runs_dir)
    return result


@runner.cli_errors
def _main(args) -> int:
    regimes = tuple(args.regimes) if args.regimes else DEFAULT_REGIMES
    r = runner.run_cli_flow(audit_flow, args, warehouse=args.warehouse, runs_dir=args.runs, trials=args.trials,
                            regimes=regimes, seed=args.seed, progress=not args.no_progress)
    print(f"deletion audit: {r['metrics']['completed']}/{r['metrics']['attempted']} complete")
    for row in r["tables"][0]["rows"]:
        print(f"  {row[0]:<14} {row[1]}/{row[2]}  median {row[4]:.1e}  worst {row[6]:.1e}  decay median {row[7]:.1e}")
    print(f"  seed figure: {SEED_TEXT}")
    print(f"  runtime {r['runtime_s']:.1f}s")
    jsonout.emit(args, r)
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("audit", help="fixed-C deletion audit incl. the real ICU-key regime", description=__doc__)
    p.add_argument("--trials", type=int, default=300, help="trials per regime (default 300)")
    p.add_argument("--regimes", nargs="*", default=None, metavar="REGIME",
                   help="regimes to run (default: all of " + ", ".join(DEFAULT_REGIMES) + ")")
    p.add_argument("--seed", type=int, default=0, help="random seed of the trials (default %(default)s)")
    runner.add_common_args(p)
    jsonout.add_json_arg(p)
    p.set_defaults(func=_main)
