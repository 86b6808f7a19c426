"""``forgetful retention`` and ``forgetful heldout-spo2``: certified event-hour retention per ICU stay.

Per stay (Prefect tasks over batches of stays, bounded concurrency): the gate is solved exactly
(ν = 0.3, σ = 3, the whole stay; fp64 refit, never the FISTA path), budget k = |S∪E|, and the SV,
H2O-style density, recency and random policies each keep k hours. Mean event-hour retention over
stays with ≥ 1 event; paired SV − baseline differences with a 10,000× stay-level bootstrap, seed 0.

``retention``: label = composite threshold event, selectors see the 6 z-scored vitals; the
maintained C&P gates are persisted in the warehouse (``gate_states``) for ``forgetful forget``.
``heldout-spo2``: label = raw SpO₂ < 90 (``event_spo2``), SpO₂ removed from every selector's
input (5-d keys).
"""
from __future__ import annotations

import time

import numpy as np
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from pipelines import task_cache
from pipelines import gate_store, jsonout, runner, study_inputs
from pipelines import retention as ret
from pipelines import warehouse as wh

SEED_TEXT = {
    "icu_retention": "seed 001 §5: 0.80 (SV) vs 0.05 (H2O-style density) at mean 33% budget; 1,329 stays",
    "heldout_spo2": "seed 001 §5: 0.464 (SV) vs 0.225 (density), recency 0.409, random 0.333; "
                    "diff 0.239 [0.194, 0.284]; 718 stays, 32% budget",
}


@task(name="retention-batch", cache_policy=NO_CACHE, persist_result=False,
      retries=2, retry_delay_seconds=runner.IO_RETRY_DELAYS, retry_condition_fn=runner.retry_transient_io)
@task_cache.cached
def retention_batch(warehouse: str, content_hash: str, stay_ids: list[int], label: str, drop: list[str],
                    nu: float, sigma: float, seed: int, build_gate: bool) -> list[dict]:
    return ret.retention_for_stays(warehouse, stay_ids, label=label, drop=drop, nu=nu, sigma=sigma, seed=seed,
                                   build_gate=build_gate)


def _persist(warehouse: str, study: str, rows: list[dict]) -> int:
    from sv_core import Gate

    contexts = []
    for r in sorted(rows, key=lambda r: r["stay_id"]):
        if "gate_state" not in r:
            continue
        g = Gate.from_state(r["gate_state"])
        n = g.n
        contexts.append(gate_store.StoredContext(g, np.full(n, r["subject_id"]), np.full(n, r["stay_id"]),
                                                 np.asarray(r["hours"])))
    with wh.transaction(warehouse) as con:
        gate_store.replace_study(con, study, contexts)
    return len(contexts)


def run_retention(warehouse: str, runs_dir: str, study: str, *, label: str, drop: list[str], nu: float,
                  sigma: float, seed: int, n_boot: int, stays_per_task: int, persist_gates: bool,
                  progress: bool) -> dict:
    t0 = time.perf_counter()
    h = wh.content_hash(warehouse)
    stay_ids = [s[0] for s in wh.stays(warehouse)]
    futures = [retention_batch.submit(warehouse, h, batch, label, drop, nu, sigma, seed, persist_gates)
               for batch in runner.chunks(stay_ids, stays_per_task)]
    rows = [r for batch in runner.gather(futures, f"{study} (stay batches)", progress) for r in batch]
    comp = ret.aggregate(rows, nu=nu, sigma=sigma, seed=seed, n_boot=n_boot)
    n_persisted = _persist(warehouse, study, rows) if persist_gates else 0
    fields = comp.to_result_fields()
    dims = sorted({r["d"] for r in rows})
    inc = [r for r in rows if r["included"]]
    fields["metrics"].update({
        "key_dim": dims[0] if len(dims) == 1 else dims,
        "label": label,
        "n_stays": len(rows),
        "event_hours": int(sum(r["n_events"] for r in inc)),
        "gates_persisted": n_persisted,
    })
    if persist_gates:
        built = [r for r in inc if "gate_score_dev" in r]
        fields["metrics"]["gate_build_failures"] = len(inc) - len(built)
        if built:
            dev = np.array([r["gate_score_dev"] for r in built])
            fields["metrics"]["gate_vs_refit_score_dev_max"] = float(dev.max())
            fields["metrics"]["gate_vs_refit_score_dev_median"] = float(np.median(dev))
            fields["metrics"]["gate_vs_refit_score_dev_gt_1e-6"] = int((dev > 1e-6).sum())
    fields["config"].update({"label": label, "selector_input": f"{dims[0]}-d z-scored vitals" +
                             (f" without {', '.join(drop)}" if drop else ""), "stays_per_task": stays_per_task})
    title = ("Held-out SpO2 control" if study == "heldout_spo2" else "ICU event-hour retention by policy")
    result = {"study": study, "title": f"{title} ({wh.data_kind(warehouse)})", "data": wh.data_kind(warehouse),
              "runtime_s": time.perf_counter() - t0, "seed_figure": {"text": SEED_TEXT[study]}, **fields}
    runner.write_study_result(result, runs_dir)
    return result


@flow(name="icu-retention", log_prints=True)
@runner.warehouse_locked
def retention_flow(warehouse: str = "runs/warehouse.duckdb", runs_dir: str = "runs", nu: float = 0.3,
                   sigma: float = 3.0, seed: int = 0, n_boot: int = 10_000, stays_per_task: int = 8,
                   persist_gates: bool = True, progress: bool = True) -> dict:
    """Certified retention of composite-event hours (6-d keys)."""
    wh.require(warehouse)
    study_inputs.require_event_stays(warehouse, "retention", "event_composite", 1,
                                     what="a composite-event hour (only those stays are compared)")
    return run_retention(warehouse, runs_dir, "icu_retention", label="event_composite", drop=[], nu=nu,
                         sigma=sigma, seed=seed, n_boot=n_boot, stays_per_task=stays_per_task,
                         persist_gates=persist_gates, progress=progress)


@flow(name="heldout-spo2", log_prints=True)
@runner.warehouse_locked
def heldout_flow(warehouse: str = "runs/warehouse.duckdb", runs_dir: str = "runs", nu: float = 0.3,
                 sigma: float = 3.0, seed: int = 0, n_boot: int = 10_000, stays_per_task: int = 8,
                 progress: bool = True) -> dict:
    """Held-out SpO₂ control: raw SpO₂ < 90 label, SpO₂ removed from the selectors (5-d keys)."""
    wh.require(warehouse)
    study_inputs.require_event_stays(warehouse, "heldout-spo2", "event_spo2", 1,
                                     what="an SpO2 < 90 % hour (only those stays are compared)")
    return run_retention(warehouse, runs_dir, "heldout_spo2", label="event_spo2", drop=["spo2"], nu=nu,
                         sigma=sigma, seed=seed, n_boot=n_boot, stays_per_task=stays_per_task,
                         persist_gates=False, progress=progress)


def _print(res: dict, args=None) -> None:
    m = res["metrics"]
    print(f"{res['study']}: {m['n_stays_included']} stays with an event (of {m['n_stays']}), "
          f"keys {m['key_dim']}-d, mean budget {m['mean_budget_fraction']:.3f}")
    for p, v in m["retention"].items():
        print(f"  {p:<8} retention {v:.3f}")
    for k, v in m.items():
        if k.startswith("diff_sv_minus_"):
            print(f"  SV - {k[14:]:<8} {v['mean']:+.3f} [{v['low']:.3f}, {v['high']:.3f}]")
    print(f"  seed figure: {SEED_TEXT[res['study']]}")
    print(f"  runtime {res['runtime_s']:.1f}s")
    jsonout.emit(args, res)


@runner.cli_errors
def _main_retention(args) -> int:
    _print(runner.run_cli_flow(retention_flow, args, warehouse=args.warehouse, runs_dir=args.runs, nu=args.nu,
                               sigma=args.sigma, seed=args.seed, n_boot=args.n_boot,
                               stays_per_task=args.stays_per_task, persist_gates=not args.no_persist,
                               progress=not args.no_progress), args)
    return 0


@runner.cli_errors
def _main_heldout(args) -> int:
    _print(runner.run_cli_flow(heldout_flow, args, warehouse=args.warehouse, runs_dir=args.runs, nu=args.nu,
                               sigma=args.sigma, seed=args.seed, n_boot=args.n_boot,
                               stays_per_task=args.stays_per_task, progress=not args.no_progress), args)
    return 0


def _common(p) -> None:
    p.add_argument("--nu", type=float, default=0.3, help="SVDD ν of each stay's gate (default %(default)s)")
    p.add_argument("--sigma", type=float, default=3.0, help="RBF kernel width σ (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random policy and bootstrap seed (default 0)")
    p.add_argument("--n-boot", type=int, default=10_000, help="stay bootstrap resamples (default %(default)s)")
    p.add_argument("--stays-per-task", type=int, default=8, help="stays per Prefect task (default %(default)s)")
    runner.add_common_args(p)
    jsonout.add_json_arg(p)


def add_cli(sub) -> None:
    p = sub.add_parser("retention", help="certified event-hour retention per ICU stay (SV vs density/recency/random)",
                       description=__doc__)
    _common(p)
    p.add_argument("--no-persist", action="store_true", help="do not store the gates in the warehouse")
    p.set_defaults(func=_main_retention)
    q = sub.add_parser("heldout-spo2", help="held-out SpO2 control (SpO2 < 90 label, 5-d keys without SpO2)",
                       description=__doc__)
    _common(q)
    q.set_defaults(func=_main_heldout)
