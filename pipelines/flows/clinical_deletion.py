"""``forgetful patient-deletion``: forget one of five patients sharing a context, with a certificate.

Contexts of 5 patients (first ≤ 48 h of one stay each, deduplicated at 0.1 SD per patient),
ν = 0.5, σ = 2, C fixed at the context size. One patient per context is forgotten by the
maintained decremental path and verified against a same-C refit. Reports the forgotten
patient's readout weight (exactly 0 after the decrement), coefficient-decay leakage at
γ ∈ {0.1, 0.01}, the other patients' readout change and self-retrieval, the KKT residual and the
agreement with the refit. The full-context gates are stored in the warehouse (``gate_states``),
so ``forgetful forget`` later removes a real patient from them.
"""
from __future__ import annotations

import time

import numpy as np
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from pipelines import task_cache
from pipelines import gate_store, jsonout, ledger, runner, study_inputs
from pipelines import patient_deletion as pdel
from pipelines import warehouse as wh

SEED_TEXT = "seed 000 §6: forgotten patient's leakage 0 vs 0.29 (decay γ=0.1) / 0.09 (γ=0.01); KKT residual ~1e-12"


@task(name="patient-deletion-context", cache_policy=NO_CACHE, persist_result=False,
      retries=2, retry_delay_seconds=runner.IO_RETRY_DELAYS, retry_condition_fn=runner.retry_transient_io)
@task_cache.cached
def context_task(warehouse: str, content_hash: str, stay_ids: list[int], target: int, nu: float, sigma: float,
                 max_hours: int, dedupe_tol: float, gammas: list[float]) -> dict:
    from sv_core import GateError

    try:
        r = pdel.context_task(warehouse, stay_ids, target, nu=nu, sigma=sigma, max_hours=max_hours,
                              dedupe_tol=dedupe_tol, gammas=gammas)
        r["completed"] = True
        return r
    except GateError as exc:  # e.g. the forgotten patient holds more than (1 - nu) of the context
        return {"completed": False, "error": type(exc).__name__}


def _persist(warehouse: str, results: list[dict]) -> int:
    from sv_core import Gate

    ctxs = [gate_store.StoredContext(Gate.from_state(r["gate_state"]), r["token_subject"], r["token_stay"],
                                     r["token_hour"]) for r in results if r.get("completed")]
    with wh.transaction(warehouse) as con:
        gate_store.replace_study(con, "patient_deletion", ctxs)
    return len(ctxs)


def _ledger_verified(warehouse: str) -> bool:
    """Whether the project's receipt ledger (not this study's in-memory receipts) verifies."""
    from pipelines.errors import LedgerError
    from pipelines.keys import Keys

    try:
        ledger.Ledger(ledger.default_dir(warehouse), Keys.load()).verify()
        return True
    except LedgerError:
        return False


def aggregate(done: list[dict], attempted: int, gammas: list[float]) -> dict:
    """Aggregates over completed contexts (no record ids)."""
    if not done:
        return {"contexts_attempted": attempted, "contexts_completed": 0}
    a = lambda k: np.array([r[k] for r in done], dtype=np.float64)  # noqa: E731
    m = {
        "contexts_attempted": attempted,
        "contexts_completed": len(done),
        "tokens_per_context_mean": float(a("n").mean()),
        "forgotten_tokens_mean": float(a("n_forgotten").mean()),
        "leakage_after_max": float(a("leakage_after").max()),
        "leakage_before_mean": float(a("leakage_before").mean()),
        "decay_leakage_mean": {f"gamma_{g:g}": float(np.mean([r["decay_leakage"][f"gamma_{g:g}"] for r in done]))
                               for g in gammas},
        "forgotten_tokens_live_after": int(a("forgotten_tokens_live_after").sum()),
        "forgotten_self_retrieval_before": float(a("forgotten_self_retrieval_before").mean()),
        "others_self_retrieval_before": float(a("others_self_retrieval_before").mean()),
        "others_self_retrieval_after": float(a("others_self_retrieval_after").mean()),
        "others_readout_change_mean": float(a("others_readout_change_mean").mean()),
        "others_readout_change_max": float(a("others_readout_change_max").max()),
        "kkt_residual_max": float(a("kkt_residual").max()),
        "kkt_residual_median": float(np.median(a("kkt_residual"))),
        "refit_score_dev_max": float(a("refit_score_dev_max").max()),
        "refit_readout_dev_max": float(a("refit_readout_dev_max").max()),
        "partition_match_fraction": float(a("partition_match").mean()),
        "certified": int(sum(bool(r["certified"]) for r in done)),
    }
    return m


@flow(name="patient-deletion", log_prints=True)
@runner.warehouse_locked
def patient_deletion_flow(warehouse: str = "runs/warehouse.duckdb", runs_dir: str = "runs", nu: float = 0.5,
                          sigma: float = 2.0, per_context: int = 5, max_hours: int = 48, dedupe_tol: float = 0.1,
                          max_contexts: int | None = None, seed: int = 0, gammas: tuple[float, ...] = (0.1, 0.01),
                          persist_gates: bool = True, progress: bool = True) -> dict:
    t0 = time.perf_counter()
    wh.require(warehouse)
    study_inputs.require_patients(warehouse, "patient-deletion", per_context,
                                  f"one context shares {per_context} patients")
    h = wh.content_hash(warehouse)
    groups = pdel.plan_contexts(wh.stays(warehouse), per_context, seed, max_contexts)
    rng = np.random.default_rng([seed, 1])
    targets = rng.integers(0, per_context, size=len(groups))
    futures = [context_task.submit(warehouse, h, g, int(t), nu, sigma, max_hours, dedupe_tol, list(gammas))
               for g, t in zip(groups, targets)]
    res = runner.gather(futures, "patient-deletion (contexts)", progress)
    done = [r for r in res if r.get("completed")]
    n_persisted = _persist(warehouse, res) if persist_gates else 0
    m = aggregate(done, len(groups), list(gammas))
    m["gates_persisted"] = n_persisted
    decay = m.get("decay_leakage_mean", {})
    cats = ["SV decrement"] + [f"decay γ={g:g}" for g in gammas]
    vals = [m.get("leakage_after_max", 0.0)] + [decay.get(f"gamma_{g:g}", 0.0) for g in gammas]
    result = {
        "study": "patient_deletion",
        "title": f"Patient deletion on shared contexts ({wh.data_kind(warehouse)})",
        "data": wh.data_kind(warehouse),
        "runtime_s": time.perf_counter() - t0,
        "seed_figure": {"text": SEED_TEXT},
        "metrics": m,
        "tables": [{"title": "forgotten patient's readout weight (leakage)", "columns": ["method", "leakage"],
                    "rows": [[c, v] for c, v in zip(cats, vals)]}],
        "figures": [{"kind": "bar", "title": "leakage of the forgotten patient", "ylabel": "readout-weight share",
                     "categories": cats, "values": vals}],
        "claims": [{
            "statement": "forgotten patient's readout weight after the decrement (max over contexts)",
            "reference": "fresh retained-key refit at the same fixed C",
            "path": "maintained fp64 C&P decremental path",
            "operation": "active deletion",
            "value": m.get("leakage_after_max"),
            "holds": bool(done) and m["leakage_after_max"] == 0.0 and m["refit_score_dev_max"] < 1e-6,
        }],
        "receipts": {"count": len(done), "certified": m.get("certified", 0), "chain_verified": _ledger_verified(warehouse),
                     "attempted": len(groups), "completed": len(done)},
        "config": {"nu": nu, "sigma": sigma, "patients_per_context": per_context, "max_hours": max_hours,
                   "dedupe_tol_sd": dedupe_tol, "dedupe": "within each patient", "gammas": list(gammas),
                   "seed": seed, "queries": "the forgotten patient's own keys", "values": "keys (z-scored vitals)"},
    }
    runner.write_study_result(result, runs_dir)
    return result


@runner.cli_errors
def _main(args) -> int:
    r = runner.run_cli_flow(patient_deletion_flow, args, warehouse=args.warehouse, runs_dir=args.runs, nu=args.nu,
                            sigma=args.sigma, max_contexts=args.max_contexts, seed=args.seed,
                            persist_gates=not args.no_persist, progress=not args.no_progress)
    m = r["metrics"]
    print(f"patient_deletion: {m['contexts_completed']}/{m['contexts_attempted']} contexts")
    if m["contexts_completed"]:
        d = m["decay_leakage_mean"]
        print(f"  leakage after decrement (max) {m['leakage_after_max']:.3g}; decay " +
              ", ".join(f"{k}: {v:.3f}" for k, v in d.items()))
        print(f"  KKT residual max {m['kkt_residual_max']:.2e}; refit score dev max {m['refit_score_dev_max']:.2e}; "
              f"others' readout change mean {m['others_readout_change_mean']:.3g}")
        print(f"  others' self-retrieval {m['others_self_retrieval_before']:.3f} -> {m['others_self_retrieval_after']:.3f}")
    print(f"  seed figure: {SEED_TEXT}")
    print(f"  runtime {r['runtime_s']:.1f}s")
    jsonout.emit(args, r)
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("patient-deletion", help="forget one of five patients sharing a context (leakage, KKT, decay)",
                       description=__doc__)
    p.add_argument("--nu", type=float, default=0.5, help="SVDD ν of each context's gate (default %(default)s)")
    p.add_argument("--sigma", type=float, default=2.0, help="RBF kernel width σ (default %(default)s)")
    p.add_argument("--max-contexts", type=int, default=None, metavar="N",
                   help="run at most N five-patient contexts (default: all)")
    p.add_argument("--seed", type=int, default=0, help="grouping and forgotten-patient seed (default %(default)s)")
    p.add_argument("--no-persist", action="store_true", help="do not store the gates in the warehouse")
    runner.add_common_args(p)
    jsonout.add_json_arg(p)
    p.set_defaults(func=_main)
