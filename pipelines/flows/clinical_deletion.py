"""``forgetful patient-deletion``: forget one of five patients sharing a context, with a certificate.

The study (:mod:`evaluation.clinical.patient_deletion`, aggregates and result in
:mod:`evaluation.clinical.patient_deletion_result`): contexts of 5 patients (first ≤ 48 h of one
stay each, deduplicated at 0.1 SD per patient), ν = 0.5, σ = 2, C fixed at the context size; one
patient per context forgotten by the maintained decrement and compared, with naive removal and
coefficient decay (γ ∈ {0.5, 0.1, 0.01}), against a same-C refit of the retained keys (gate-score and
readout gap), plus the forgotten patient's readout weight (leakage).

This flow only wires it: contexts run in batches of ``batch_contexts`` (one Prefect task per worker
slot and batch, its stays read in one query); each batch's
per-context aggregates go to a scratch DuckDB table and its gates to the warehouse under a pending
study name as the batch finishes, so memory does not grow with the number of contexts; the
aggregates are computed in SQL at the end and the gates published as ``patient_deletion`` in one
transaction (``forgetful forget`` later removes a real patient from them). ``--contexts N`` /
``--stays N`` run a deterministic sample (the first groups of the seeded shuffle); default every
eligible patient.

The independent same-C refit (:func:`sv_core.refit`) is the audit oracle, run on a deterministic
sample of contexts only (``--refit-sample N``, default 200: the first N contexts of the seeded
shuffle, a uniform sample): the gaps to the refit, the refit score deviation and the partition match
are over that sample (the result states it: ``refit_contexts`` of ``contexts_completed``). Every
context still gets the gate's own KKT certificate and the leakage and retrieval figures. On a
cohort of at most N contexts (the demo) every context is refit.
"""
from __future__ import annotations

import contextlib
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from dashboards.seed_figures import seed_comparability, seed_field, seed_line
from evaluation.clinical import patient_deletion as pdel
from evaluation.clinical import patient_deletion_result as pres
from pipelines import jsonout, study_inputs
from pipelines.receipts import ledger
from pipelines.runtime import runner, scaleout, task_cache
from pipelines.settings import COUNT, NU, POSITIVE, REFIT_SAMPLE, SEED, DeletionSettings
from pipelines.store import gate_store
from pipelines.store import warehouse as wh
from pipelines.store.keys import for_warehouse

STUDY = "patient_deletion"
#: gates of a run in progress are stored under this study name until the run publishes them
PENDING = "patient_deletion.pending"
ROWS = "context_rows"


@dataclass(frozen=True)
class ContextSpec:
    """What each context's computation needs (the chunk tasks' settings, part of their cache keys)."""

    nu: float
    sigma: float
    max_hours: int
    dedupe_tol: float
    gammas: tuple[float, ...]
    decay_sigmas: tuple[float, ...]

    @classmethod
    def of(cls, s: DeletionSettings) -> ContextSpec:
        return cls(s.nu, s.sigma, s.max_hours, s.dedupe_tol, tuple(s.gammas or pdel.GAMMAS), tuple(s.decay_sigmas))


def context_result(stays: list, target: int, refit_check: bool, spec: ContextSpec) -> dict:
    """One context (its patients' stays, in order): :func:`pdel.forget_patient` and the token origins."""
    from sv_core import GateError

    ctx = pdel.build_context(stays, spec.max_hours, spec.dedupe_tol)
    try:
        r = pdel.forget_patient(ctx, target, nu=spec.nu, sigma=spec.sigma, gammas=list(spec.gammas),
                                decay_sigmas=list(spec.decay_sigmas), refit_check=refit_check)
    except GateError as exc:  # e.g. the forgotten patient holds more than (1 - nu) of the context
        return {"completed": False, "error": type(exc).__name__}
    r.update(completed=True, token_subject=ctx.subject, token_stay=ctx.stay, token_hour=ctx.hour)
    return r


@task(name="patient-deletion-context", cache_policy=NO_CACHE, persist_result=False,
      retries=2, retry_delay_seconds=runner.IO_RETRY_DELAYS, retry_condition_fn=runner.retry_transient_io)
@task_cache.cached
def context_task(warehouse: str, content_hash: str, jobs: list[list], spec: ContextSpec) -> list[dict]:
    """A chunk of contexts, ``jobs = [[stay ids, target, refit_check], ...]``: their stays read in
    one query, one result per context (one task and one cache entry per chunk, not per context)."""
    from cohort.streams import iter_stays

    by_id = {s.stay_id: s for s in iter_stays(warehouse, stay_ids=sorted({int(s) for j in jobs for s in j[0]}))}
    return [context_result([by_id[int(s)] for s in ids], int(t), bool(rc), spec) for ids, t, rc in jobs]


def _stored(results: list[dict]):
    """The completed contexts' full gates, one at a time (for gate_store.append_contexts)."""
    from sv_core import Gate

    for r in results:
        if r.get("completed"):
            yield gate_store.StoredContext(Gate.from_state(r["gate_state"]), r["token_subject"], r["token_stay"],
                                           r["token_hour"])


def _ledger_verified(warehouse: str) -> bool:
    """Whether the project's receipt ledger (not this study's in-memory receipts) verifies."""
    from pipelines.errors import LedgerError

    try:
        ledger.Ledger(ledger.default_dir(warehouse), for_warehouse(warehouse)).verify()
        return True
    except LedgerError:
        return False


@contextlib.contextmanager
def _scratch():
    """A scratch DuckDB file for the per-context rows (aggregates only, no ids), removed at the end."""
    import duckdb

    with tempfile.TemporaryDirectory(prefix="forgetful-pdel-") as d:
        con = duckdb.connect(str(Path(d) / "rows.duckdb"))
        try:
            yield con
        finally:
            con.close()


def _append_rows(con, rows: list[dict]) -> None:
    import pyarrow as pa

    if not rows:
        return
    tbl = pa.Table.from_pylist(rows)
    for i, f in enumerate(tbl.schema):  # a column empty in this batch (outside the refit sample): typed, not NULL
        if pa.types.is_null(f.type):
            tbl = tbl.set_column(i, f.name, tbl.column(i).cast(pa.bool_() if f.name == "partition_match"
                                                                   else pa.float64()))
    con.register("_rows", tbl)
    exists = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [ROWS]).fetchone()[0]
    con.execute(f"INSERT INTO {ROWS} BY NAME SELECT * FROM _rows" if exists else
                f"CREATE TABLE {ROWS} AS SELECT * FROM _rows")
    con.unregister("_rows")


@flow(name="patient-deletion", log_prints=True)
@runner.warehouse_locked
def patient_deletion_flow(warehouse: str = "runs/warehouse.duckdb", runs_dir: str = "runs",
                          settings: DeletionSettings = DeletionSettings(), progress: bool = True) -> dict:
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    wh.require(warehouse)
    s, spec = settings, ContextSpec.of(settings)
    per_context, seed, gammas = s.per_context, s.seed, spec.gammas
    study_inputs.require_patients(warehouse, "patient-deletion", per_context,
                                  f"one context shares {per_context} patients")
    h = wh.content_hash(warehouse)
    groups = pdel.plan_contexts(wh.stays(warehouse), per_context, seed, contexts=s.max_contexts, n_stays=s.max_stays)
    targets = np.random.default_rng([seed, 1]).integers(0, per_context, size=len(groups))
    data = wh.data_kind(warehouse)
    if s.persist_gates:
        with wh.transaction(warehouse) as con:
            gate_store.drop_study(con, PENDING)  # what a killed run left
    keys = for_warehouse(warehouse)  # the command's handle's (pipelines.store.keys.for_warehouse)
    macs: dict[int, str] = {}  # staged context id -> its MAC under the published name
    slots = scaleout.local_slots()
    bar = tqdm(total=len(groups), desc="patient-deletion (contexts)", disable=not progress, leave=False)
    with _scratch() as scratch:
        for batch in runner.chunks(list(enumerate(zip(groups, targets))), s.batch_contexts):
            jobs = [[[int(x) for x in g], int(t), i < s.refit_sample] for i, (g, t) in batch]
            per_task = -(-len(jobs) // slots)  # one task per worker slot and batch
            futures = [context_task.submit(warehouse, h, part, spec) for part in runner.chunks(jobs, per_task)]
            res = [r for part in runner.gather(futures, "patient-deletion (batch)", progress=False) for r in part]
            _append_rows(scratch, [pdel.context_row(r) for r in res if r.get("completed")])
            if s.persist_gates:
                with wh.transaction(warehouse) as con:
                    macs.update(gate_store.append_contexts(con, PENDING, _stored(res), keys, promote_to=STUDY))
            bar.update(len(batch))
            del res, futures
        bar.close()
        has_rows = scratch.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?",
                                   [ROWS]).fetchone()[0]
        m = (pres.aggregate(scratch, ROWS, len(groups), list(gammas)) if has_rows
             else {"contexts_attempted": len(groups), "contexts_completed": 0})
    if s.persist_gates:
        with wh.transaction(warehouse) as con:
            gate_store.promote_study(con, PENDING, STUDY, macs)
    m["gates_persisted"] = len(macs)
    comp = seed_comparability(STUDY, data)
    result = pres.study_result(
        m, data=data, seed_comparable=comp["comparable"], gammas=list(gammas), runtime_s=time.perf_counter() - t0,
        config={"nu": s.nu, "sigma": s.sigma, "patients_per_context": per_context, "max_hours": s.max_hours,
                "dedupe_tol_sd": s.dedupe_tol, "dedupe": "within each patient", "gammas": list(gammas),
                "seed_gammas": list(pdel.SEED_GAMMAS), "decay_sigmas": list(s.decay_sigmas), "seed": seed,
                "sample": ("every eligible patient" if s.max_contexts is None and s.max_stays is None else
                           f"first {len(groups)} contexts of the seeded shuffle"),
                "queries": "the forgotten patient's own keys", "values": "keys (z-scored vitals)",
                "naive_removal": "tokens dropped, other α renormalised to sum 1, ρ kept, no re-solve",
                "batch_contexts": s.batch_contexts,
                "refit_sample": {"requested": int(s.refit_sample), "contexts": min(int(s.refit_sample), len(groups)),
                                 "choice": "the first contexts of the seeded shuffle (a uniform sample)"}})
    result["seed_figure"] = seed_field(STUDY)
    done = m.get("contexts_completed", 0)
    result["receipts"] = {"count": done, "certified": m.get("certified", 0),
                          "chain_verified": _ledger_verified(warehouse), "attempted": len(groups), "completed": done}
    runner.write_study_result(result, runs_dir)
    return result


def settings_of(args) -> DeletionSettings:
    """The command line's study settings (validated here, once)."""
    return DeletionSettings(nu=args.nu, sigma=args.sigma, max_contexts=args.contexts, max_stays=args.stays,
                            seed=args.seed, decay_sigmas=tuple(args.decay_sigmas or ()),
                            persist_gates=not args.no_persist, refit_sample=args.refit_sample)


def _main(args) -> int:
    r = runner.run_cli_flow(patient_deletion_flow, args, warehouse=args.warehouse, runs_dir=args.runs,
                            settings=settings_of(args), progress=not args.no_progress)
    m = r["metrics"]
    print(f"patient_deletion: {m['contexts_completed']}/{m['contexts_attempted']} contexts")
    if m["contexts_completed"]:
        print(f"  {m['headline']}")
        d = m["decay_leakage_mean"]
        print("  decay leakage " + ", ".join(f"{k}: {v:.3f}" for k, v in d.items()))
        print(f"  refit oracle on {m['refit_contexts']}/{m['contexts_completed']} contexts (the gaps are over these)")
        print(f"  KKT residual max {m['kkt_residual_max']:.2e}; refit score dev max {m['refit_score_dev_max']:.2e}; "
              f"others' readout change mean {m['others_readout_change_mean']:.3g}")
        print(f"  others' self-retrieval {m['others_self_retrieval_before']:.3f} -> "
              f"{m['others_self_retrieval_after']:.3f}")
    if m["power"]["low_power"]:
        print(f"  low power: this result {m['power']['label']}")
    print("  " + seed_line(STUDY, r["data"]))
    print(f"  runtime {r['runtime_s']:.1f}s")
    jsonout.emit(args, r)
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("patient-deletion", help="forget one of five patients sharing a context (leakage, KKT, decay)",
                       description=__doc__)
    p.add_argument("--nu", type=NU, default=0.5, help="SVDD ν of each context's gate (default %(default)s)")
    p.add_argument("--sigma", type=POSITIVE, default=2.0, help="RBF kernel width σ (default %(default)s)")
    p.add_argument("--contexts", "--max-contexts", dest="contexts", type=COUNT, default=None, metavar="N",
                   help="run N five-patient contexts, a deterministic sample (default: every eligible patient)")
    p.add_argument("--stays", type=COUNT, default=None, metavar="N",
                   help="run on N patients' first stays, a deterministic sample (N // 5 contexts; default: all)")
    p.add_argument("--decay-sigmas", type=POSITIVE, nargs="*", default=None, metavar="SIGMA",
                   help="also report decay leakage with the gate solved at these σ (the leakage investigation)")
    p.add_argument("--seed", type=SEED, default=0, help="grouping and forgotten-patient seed (default %(default)s)")
    p.add_argument("--refit-sample", type=COUNT, default=REFIT_SAMPLE, metavar="N",
                   help="check N contexts (the first of the seeded shuffle) against the independent refit; the "
                        "gaps to the refit are over these (default %(default)s)")
    p.add_argument("--no-persist", action="store_true", help="do not store the gates in the warehouse")
    runner.add_common_args(p)
    jsonout.add_json_arg(p)
    p.set_defaults(func=_main)
