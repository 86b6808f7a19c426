"""``forgetful retention`` and ``forgetful heldout-spo2``: certified event-hour retention per ICU stay.

A thin Prefect wrapper around :mod:`evaluation.clinical.retention` (the study's arithmetic). Per
stay: the gate is solved by the certified solve (ν = 0.3, σ = 3, the whole stay; fp64, KKT
checked), budget k = |S∪E|, and SV, H2O-style density, recency, random (its exact expectation
k/n) and the key-only peers each keep k hours. Mean event-hour retention over stays with ≥ 1
event; paired SV − baseline differences with a 10,000× stay-level bootstrap, seed 0.

``retention``: label = composite threshold event, selectors see the 6 z-scored vitals; the
maintained C&P gates are persisted in the warehouse (``gate_states``) for ``forgetful forget``.
``heldout-spo2``: label = raw SpO₂ < 90 (``event_spo2``), SpO₂ removed from every selector's
input (5-d keys).

Streaming, in flat memory: stays go in chunks to tasks that read their own stays from the
warehouse (read-only, given stay ids) and return a few numbers per stay — Prefect tasks on the
local thread pool, plain futures on a Dask cluster (``--dask``), the same chunk function
(:mod:`pipelines.runtime.scaleout`); chunks are sized from the measured cost of a pilot chunk (see
``--stays-per-task``, which fixes the size instead), the refit audit and sensitivity chunks
share the stay batches' pool (:mod:`pipelines.flows.retention_plan`), and on the thread pool two long
stays' chunks never run side by side when their n x n matrices together would pass a memory
budget (:func:`pipelines.runtime.scaleout.next_chunk`: peak memory follows the longest stays, not their
number);
each batch's full result (those numbers and the stay's gate state) goes to the authenticated
task cache beside the warehouse, so a rerun after a crash resumes there. Then the gates are
staged into the warehouse batch by batch (each batch its own committed transaction, under a
staging study name) and promoted in one short transaction, together with the per-stay values
(:mod:`pipelines.store.stay_results`): a crash leaves the previous gates and values in place. Only the
per-stay vectors (about twenty numbers a stay) are held until the end.

``--stays N`` runs on a deterministic sample (:mod:`evaluation.clinical.sampling`: seeded hash
order, stable under rebuilds). An audit runs the independent refit on the first stays with an
event in that order (``--audit-stays``), and a ν × σ sensitivity table (SV vs ridge and kernel
leverage) is computed on a capped sample (``--sensitivity-stays``; 0 turns either off).
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from prefect import flow

from evaluation.clinical import retention as study
from pipelines import jsonout, study_inputs
from pipelines.errors import StudyInputError
from pipelines.flows import retention_plan
from pipelines.flows.retention_chunks import (  # noqa: F401  (re-exported: the chunk functions and their tasks)
    DUCKDB_MEMORY,
    LABELS,
    audit_batch,
    audit_rows,
    batch_columns,
    batch_results,
    held_open,
    pilot_batch,
    plan_batches,
    read_only,
    read_stays,
    retention_batch,
    retention_batch_full,
    sensitivity_batch,
    sensitivity_rows,
    staged_contexts,
)
from pipelines.runtime import runner, scaleout
from pipelines.runtime.scaleout import one_blas_thread
from pipelines.store import stay_results
from pipelines.store import warehouse as wh

SEED_TEXT = {
    "icu_retention": "seed 001 §5: 0.80 (SV) vs 0.05 (H2O-style density) at mean 33% budget; 1,329 stays",
    "heldout_spo2": "seed 001 §5: 0.464 (SV) vs 0.225 (density), recency 0.409, random 0.333; "
                    "diff 0.239 [0.194, 0.284]; 718 stays, 32% budget",
}
POLICIES = list(study.DEFAULT_POLICIES)
#: ``--stays-per-task`` default: None = sized from the measured cost (:mod:`pipelines.runtime.scaleout`)
STAYS_PER_TASK = None


def run_retention(warehouse: str, runs_dir: str, study_name: str, *, label: str, drop: list[str], nu: float,
                  sigma: float, seed: int, n_boot: int, stays_per_task: int | None, persist_gates: bool, progress: bool,
                  stays: int | None = None, audit_stays: int = 50, sensitivity_stays: int = 200) -> dict:
    from evaluation.clinical.retention_audit import audit_summary
    from evaluation.clinical.retention_sensitivity import NUS, sensitivity_table, settings
    from evaluation.clinical.sampling import sample_stays

    for name, v, low in (("stays", stays, 1), ("audit_stays", audit_stays, 0), ("sensitivity_stays", sensitivity_stays, 0),
                         ("stays_per_task", stays_per_task, 1)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < low):
            raise StudyInputError(f"{name} must be an integer >= {low}, got {v!r}")
    t0 = time.perf_counter()
    h = wh.content_hash(warehouse)
    stay_rows = wh.stays(warehouse)
    eligible = [s[0] for s in stay_rows]
    hours = {int(s[0]): int(s[3]) for s in stay_rows}
    del stay_rows
    ids = sample_stays(eligible, stays, seed).tolist()
    args = (label, drop, nu, sigma, POLICIES, persist_gates)
    # the flow's own BLAS limit (a task leaving its limit never restores threads mid-run), and one
    # read-only connection held open while the local tasks read (closed before the writes)
    with one_blas_thread(), held_open(warehouse):
        batches, parts, chunking = plan_batches(warehouse, h, ids, hours, args, stays_per_task)
        todo = batches[len(parts):]
        # the refit audit and the sensitivity chunks join the stay batches' pool (retention_plan)
        side, costs = retention_plan.plan_side(
            warehouse, h, ids, hours, batches, chunking.pop("costs", None), label=label, drop=drop, nu=nu,
            sigma=sigma, seed=seed, audit_stays=audit_stays, sensitivity_stays=sensitivity_stays,
            stays_per_task=stays_per_task, slots=chunking["slots"])
        done = scaleout.map_phases([scaleout.Phase(batch_columns, [(warehouse, h, b, *args) for b in todo],
                                                   retention_batch, f"{study_name} (stay batches)",
                                                   costs[len(parts):],
                                                   [scaleout.chunk_memory([hours[s] for s in b]) for b in todo]),
                                    *side.phases(study_name)], progress=progress,
                                   hold=(read_only, warehouse))
        parts += done[0]
        cols = study.concat_columns(parts)
        del parts
        audit_out, sens_rows, too_long = side.finish(cols, done[1:], study_name, progress)
    if not np.asarray(cols["included"], dtype=bool).any():  # what the comparison would refuse, before any write
        raise StudyInputError(f"{study_name}: no sampled stay has an event hour; nothing to compare")
    # the writes (DuckDB, outside the GIL) overlap the bootstrap statistics: the lead's serial tail after
    # the chunks is the longer of the two, not their sum (pipelines.bench.dask_workers measures it as flow_s)
    with one_blas_thread(), ThreadPoolExecutor(1, thread_name_prefix="forgetful-write") as writer:
        writing = writer.submit(  # the gates as the chunks serialised them (digest-checked, gate_store.staged_state)
            stay_results.write_study, warehouse, study_name, cols,
            staged_contexts(warehouse, h, batches, args) if persist_gates else None, memory_limit=DUCKDB_MEMORY)
        comp = study.comparison_from_columns(cols, policies=POLICIES, nu=nu, sigma=sigma, seed=seed, n_boot=n_boot)
        sens = None
        if sens_rows:
            sens_rows.sort(key=lambda r: r["stay_id"])
            note = (f"all {len(sens_rows)} stays with an event" if len(sens_rows) == int(cols["included"].sum())
                    else f"the first {len(sens_rows)} of {int(cols['included'].sum())} stays with an event in the "
                         "seeded order (capped)")
            sens = sensitivity_table(settings(sigma, NUS), sens_rows, seed=seed, n_boot=n_boot, sample_note=note)
        n_persisted = writing.result()
    fields = comp.to_result_fields(study_name)
    m = fields["metrics"]
    dims = sorted(set(cols["d"].tolist()))
    inc = cols["included"]
    m.update({"key_dim": dims[0] if len(dims) == 1 else dims, "label": label, "n_stays": int(inc.size),
              "n_stays_eligible": len(eligible), "gates_persisted": n_persisted})
    kkt = cols["solve_kkt"][inc]
    m["solve"] = {"method": "sv_core.solve (SMO + bordered KKT system, certified by the recomputed gradient)",
                  "kkt_max": float(kkt.max()), "kkt_median": float(np.median(kkt)),
                  "fallbacks": int(cols["solve_fallback"][inc].sum()),
                  "polished": int(cols["solve_polished"][inc].sum())}
    if persist_gates:
        built = inc & cols["gate_built"]
        m["gate_build_failures"] = int(inc.sum() - built.sum())
        if built.any():
            dev = cols["gate_score_dev"][built]
            m["gate_vs_solve_score_dev_max"] = float(dev.max())
            m["gate_vs_solve_score_dev_median"] = float(np.median(dev))
            m["gate_vs_solve_score_dev_gt_1e-6"] = int((dev > 1e-6).sum())
            m["gate_vs_solve_alpha_dev_max"] = float(cols["gate_alpha_dev"][built].max())
    if audit_stays:
        m["refit_audit"] = audit_summary(audit_out, candidates=audit_stays, skipped_long=too_long)
    if sens is not None:
        table, summary = sens
        fields["tables"].append(table)
        m["sensitivity"] = summary
    fields["config"].update({
        "label": label, "stays_per_task": stays_per_task, "chunking": chunking, "stays_requested": stays,
        "audit_stays": audit_stays,
        "sensitivity_stays": sensitivity_stays,
        "selector_input": f"{dims[0]}-d z-scored vitals" + (f" without {', '.join(drop)}" if drop else ""),
        "sample": ("every eligible stay" if stays is None or stays >= len(eligible) else
                   f"{len(ids)} of {len(eligible)} eligible stays, seeded hash order (seed {seed})")})
    title = "Held-out SpO2 control" if study_name == "heldout_spo2" else "ICU event-hour retention by policy"
    result = {"study": study_name, "title": f"{title} ({wh.data_kind(warehouse)})", "data": wh.data_kind(warehouse),
              "runtime_s": time.perf_counter() - t0, "seed_figure": {"text": SEED_TEXT[study_name]}, **fields}
    runner.write_study_result(result, runs_dir)
    return result


@flow(name="icu-retention", log_prints=True)
@runner.warehouse_locked
def retention_flow(warehouse: str = "runs/warehouse.duckdb", runs_dir: str = "runs", nu: float = 0.3,
                   sigma: float = 3.0, seed: int = 0, n_boot: int = 10_000, stays_per_task: int | None = STAYS_PER_TASK,
                   persist_gates: bool = True, progress: bool = True, stays: int | None = None,
                   audit_stays: int = 50, sensitivity_stays: int = 200) -> dict:
    """Certified retention of composite-event hours (6-d keys)."""
    wh.require(warehouse)
    study_inputs.require_event_stays(warehouse, "retention", "event_composite", 1,
                                     what="a composite-event hour (only those stays are compared)")
    return run_retention(warehouse, runs_dir, "icu_retention", label="event_composite", drop=[], nu=nu,
                         sigma=sigma, seed=seed, n_boot=n_boot, stays_per_task=stays_per_task,
                         persist_gates=persist_gates, progress=progress, stays=stays, audit_stays=audit_stays,
                         sensitivity_stays=sensitivity_stays)


@flow(name="heldout-spo2", log_prints=True)
@runner.warehouse_locked
def heldout_flow(warehouse: str = "runs/warehouse.duckdb", runs_dir: str = "runs", nu: float = 0.3,
                 sigma: float = 3.0, seed: int = 0, n_boot: int = 10_000, stays_per_task: int | None = STAYS_PER_TASK,
                 progress: bool = True, stays: int | None = None, audit_stays: int = 50,
                 sensitivity_stays: int = 200) -> dict:
    """Held-out SpO₂ control: raw SpO₂ < 90 label, SpO₂ removed from the selectors (5-d keys)."""
    wh.require(warehouse)
    study_inputs.require_event_stays(warehouse, "heldout-spo2", "event_spo2", 1,
                                     what="an SpO2 < 90 % hour (only those stays are compared)")
    return run_retention(warehouse, runs_dir, "heldout_spo2", label="event_spo2", drop=["spo2"], nu=nu,
                         sigma=sigma, seed=seed, n_boot=n_boot, stays_per_task=stays_per_task,
                         persist_gates=False, progress=progress, stays=stays, audit_stays=audit_stays,
                         sensitivity_stays=sensitivity_stays)


def _print(res: dict, args=None) -> None:
    m = res["metrics"]
    print(f"{res['study']}: {m['n_stays_included']} stays with an event (of {m['n_stays']}), "
          f"keys {m['key_dim']}-d, mean budget {m['mean_budget_fraction']:.3f}")
    for p, v in m["retention"].items():
        print(f"  {p + (' (expectation k/n)' if p == 'random' else ''):<8} retention {v:.3f}")
    for k, v in m.items():
        if k.startswith("diff_sv_minus_"):
            print(f"  SV - {k[14:]:<8} {v['mean']:+.3f} [{v['low']:.3f}, {v['high']:.3f}]")
    if m.get("low_power"):
        print(f"  {m['low_power_reason']}")
    a = m.get("refit_audit") or {}
    if a.get("stays_audited"):
        print(f"  refit audit on {a['stays_audited']} stays: max |Δscore| {a['score_dev_max']:.2g}, partitions equal "
              f"on {a['partition_exact_matches']}/{a['stays_audited']}")
    print(f"  seed figure: {SEED_TEXT[res['study']]}")
    print(f"  runtime {res['runtime_s']:.1f}s")
    jsonout.emit(args, res)


def _flow_args(args) -> dict:
    return dict(warehouse=args.warehouse, runs_dir=args.runs, nu=args.nu, sigma=args.sigma, seed=args.seed,
                n_boot=args.n_boot, stays_per_task=args.stays_per_task, progress=not args.no_progress,
                stays=args.stays, audit_stays=args.audit_stays,
                sensitivity_stays=0 if args.no_sensitivity else args.sensitivity_stays)


@runner.cli_errors
def _main_retention(args) -> int:
    _print(runner.run_cli_flow(retention_flow, args, persist_gates=not args.no_persist, **_flow_args(args)), args)
    return 0


@runner.cli_errors
def _main_heldout(args) -> int:
    _print(runner.run_cli_flow(heldout_flow, args, **_flow_args(args)), args)
    return 0


def _count(low: int):
    """argparse type: an integer >= ``low`` (a usage error before anything starts, otherwise)."""
    import argparse

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {v}")
        return v
    return parse


def _common(p) -> None:
    p.add_argument("--nu", type=float, default=0.3, help="SVDD ν of each stay's gate (default %(default)s)")
    p.add_argument("--sigma", type=float, default=3.0, help="RBF kernel width σ (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap and stay-sample seed (default 0)")
    p.add_argument("--n-boot", type=int, default=10_000, help="stay bootstrap resamples (default %(default)s)")
    p.add_argument("--stays", type=_count(1), default=None, metavar="N",
                   help="run on a deterministic sample of N eligible stays (seeded hash order, stable under "
                        "rebuilds; default: every eligible stay)")
    p.add_argument("--stays-per-task", type=_count(1), default=STAYS_PER_TASK,
                   help=f"stays per task (default: sized from the measured cost: {scaleout.sizing_text()})")
    p.add_argument("--audit-stays", type=_count(0), default=50, metavar="N",
                   help="independent refit audit of the certified solve on the first N stays with an event in the "
                        "seeded order (default %(default)s; 0: off)")
    p.add_argument("--sensitivity-stays", type=_count(0), default=200, metavar="N",
                   help="ν × σ sensitivity table on the first N stays with an event in the seeded order "
                        "(default %(default)s)")
    p.add_argument("--no-sensitivity", action="store_true", help="skip the sensitivity table")
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
