"""``forgetful retention`` and ``forgetful heldout-spo2``: certified event-hour retention per ICU stay.

A thin Prefect wrapper around :mod:`evaluation.clinical.retention` (the study's arithmetic). Per
stay: the gate is solved by the certified solve (ν = 0.3, σ = 3, the whole stay; fp64, KKT
checked), budget k = |S∪E|, and SV, H2O-style density, recency, random (its exact expectation
k/n) and the key-only peers each keep k hours. Mean event-hour retention over stays with ≥ 1
event; paired SV − baseline differences with a 10,000× stay-level bootstrap, seed 0.

``retention``: label = composite threshold event, selectors see the 6 z-scored vitals; the
maintained C&P gates are persisted in the warehouse (``gate_states``) for ``forgetful forget``.
``heldout-spo2``: label = raw SpO₂ < 90 (``event_spo2``), SpO₂ removed from every selector's
input (5-d keys). ``--events FILE``: your own event (:mod:`cohort.events`), its channels removed
from every selector; no gates stored.

One straight path: the command (:mod:`pipelines.flows.retention_cli`) builds the study's
:class:`~pipelines.settings.RetentionSettings` once and opens the warehouse once (its session);
the flow (:func:`run`) takes that handle, :func:`pipelines.flows.retention_plan.compute` samples
the stays and runs every chunk (:mod:`pipelines.flows.retention_chunks`, on the local thread pool
or Dask: :mod:`pipelines.runtime.scaleout`), and the flow writes the gates and per-stay values
(:func:`pipelines.store.stay_results.write_study`: staged batch by batch, promoted in one short
transaction; a crash leaves the previous ones) while the bootstrap runs, then the result file.
Each batch's full result goes to the authenticated task cache first, so a rerun after a crash
resumes there. ``--stays N`` runs on a deterministic sample (:mod:`evaluation.clinical.sampling`);
the refit audit and the ν × σ sensitivity run on the first stays with an event in that order.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from prefect import flow

from dashboards.seed_figures import seed_field
from evaluation.clinical import retention as study
from pipelines import study_inputs
from pipelines.errors import SettingsError, StudyInputError
from pipelines.flows import retention_plan
from pipelines.flows.retention_chunks import DUCKDB_MEMORY
from pipelines.runtime import runner, scaleout
from pipelines.settings import RetentionSettings
from pipelines.store import stay_results
from pipelines.store import warehouse as wh

POLICIES = list(study.DEFAULT_POLICIES)


@flow(name="icu-retention", log_prints=True)
def retention_flow(warehouse: str = "runs/warehouse.duckdb", runs_dir: str = "runs",
                   settings: RetentionSettings = RetentionSettings(), progress: bool = True) -> dict:
    """Certified retention of composite-event hours (6-d keys), or of your own event (``settings.event``)."""
    if settings.heldout:
        raise SettingsError("retention_flow runs the retention study; the held-out control is heldout_flow")
    return run(warehouse, runs_dir, settings, progress)


@flow(name="heldout-spo2", log_prints=True)
def heldout_flow(warehouse: str = "runs/warehouse.duckdb", runs_dir: str = "runs",
                 settings: RetentionSettings = RetentionSettings(heldout=True), progress: bool = True) -> dict:
    """Held-out SpO₂ control: raw SpO₂ < 90 label (or your own event), its channel removed from the selectors."""
    if not settings.heldout:
        raise SettingsError("heldout_flow runs the held-out control: its settings need heldout=True")
    return run(warehouse, runs_dir, settings, progress)


def run(warehouse: str, runs_dir: str, settings: RetentionSettings, progress: bool) -> dict:
    """The study, inside the command's warehouse handle (opened once by the command's session and
    reused here; a flow started on its own — a deployment, another flow — opens it itself)."""
    with wh.Warehouse.open(warehouse) as w:
        what = (f"an hour of {settings.event.describe()}" if settings.event is not None else
                "an SpO2 < 90 % hour" if settings.heldout else "a composite-event hour")
        study_inputs.require_event_stays(str(w.path), settings.command, settings.event or settings.label, 1,
                                         what=f"{what} (only those stays are compared)")
        return _study(w, runs_dir, settings, progress)


def _study(w: wh.Warehouse, runs_dir: str, settings: RetentionSettings, progress: bool) -> dict:
    t0 = time.perf_counter()
    warehouse = str(w.path)
    out = retention_plan.compute(warehouse, settings, progress)
    cols = out.columns
    if not np.asarray(cols["included"], dtype=bool).any():  # what the comparison would refuse, before any write
        raise StudyInputError(f"{settings.study}: no sampled stay has an event hour; nothing to compare")
    # the writes (DuckDB, outside the GIL) overlap the bootstrap statistics: the lead's serial tail after
    # the chunks is the longer of the two, not their sum (pipelines.bench.dask_workers measures it as flow_s)
    with scaleout.one_blas_thread(), ThreadPoolExecutor(1, thread_name_prefix="forgetful-write") as writer:
        writing = writer.submit(  # the gates as the chunks serialised them (digest-checked, gate_store.staged_state)
            stay_results.write_study, warehouse, settings.study, cols, out.gates, memory_limit=DUCKDB_MEMORY,
            keys=w.keys)
        fields = study.comparison_from_columns(
            cols, policies=POLICIES, nu=settings.nu, sigma=settings.sigma, seed=settings.seed,
            n_boot=settings.n_boot).to_result_fields(settings.study)
        sens = _sensitivity(out.sensitivity_rows, cols, settings)
        n_persisted = writing.result()
    _complete(fields, cols, out, settings, sens, n_persisted)
    data = wh.data_kind(warehouse)
    result = {"study": settings.study, "title": f"{_title(settings)} ({data})", "data": data,
              "runtime_s": time.perf_counter() - t0, "seed_figure": seed_field(settings.study), **fields}
    runner.write_study_result(result, runs_dir)
    return result


def _sensitivity(rows: list, cols: dict, settings: RetentionSettings):
    """The ν × σ sensitivity table and summary, or None without rows."""
    from evaluation.clinical.retention_sensitivity import NUS, sensitivity_table
    from evaluation.clinical.retention_sensitivity import settings as grid

    if not rows:
        return None
    rows.sort(key=lambda r: r["stay_id"])
    n_inc = int(cols["included"].sum())
    note = (f"all {len(rows)} stays with an event" if len(rows) == n_inc
            else f"the first {len(rows)} of {n_inc} stays with an event in the seeded order (capped)")
    return sensitivity_table(grid(settings.sigma, NUS), rows, seed=settings.seed, n_boot=settings.n_boot,
                             sample_note=note)


def _title(settings: RetentionSettings) -> str:
    if settings.event is not None:
        return (f"Event-hour retention of your event {settings.event.name!r}, "
                f"{', '.join(settings.drop)} withheld from the selectors")
    return "Held-out SpO2 control" if settings.heldout else "ICU event-hour retention by policy"


def _complete(fields: dict, cols: dict, out: retention_plan.Computed, settings: RetentionSettings, sens,
              n_persisted: int) -> None:
    """Add to the comparison's result fields what the run measured besides it: keys, solve
    certificates, gates, the refit audit, the sensitivity table, the config (aggregates only)."""
    from evaluation.clinical.retention_audit import audit_summary

    m = fields["metrics"]
    dims = sorted(set(cols["d"].tolist()))
    inc = cols["included"]
    m.update({"key_dim": dims[0] if len(dims) == 1 else dims, "label": settings.label, "n_stays": int(inc.size),
              "n_stays_eligible": out.n_eligible, "gates_persisted": n_persisted})
    kkt = cols["solve_kkt"][inc]
    m["solve"] = {"method": "sv_core.solve (SMO + bordered KKT system, certified by the recomputed gradient)",
                  "kkt_max": float(kkt.max()), "kkt_median": float(np.median(kkt)),
                  "fallbacks": int(cols["solve_fallback"][inc].sum()),
                  "polished": int(cols["solve_polished"][inc].sum())}
    if settings.stores_gates:
        built = inc & cols["gate_built"]
        m["gate_build_failures"] = int(inc.sum() - built.sum())
        if built.any():
            dev = cols["gate_score_dev"][built]
            m["gate_vs_solve_score_dev_max"] = float(dev.max())
            m["gate_vs_solve_score_dev_median"] = float(np.median(dev))
            m["gate_vs_solve_score_dev_gt_1e-6"] = int((dev > 1e-6).sum())
            m["gate_vs_solve_alpha_dev_max"] = float(cols["gate_alpha_dev"][built].max())
    if settings.audit_stays:
        m["refit_audit"] = audit_summary(out.audit_rows, candidates=settings.audit_stays, skipped_long=out.too_long)
    if sens is not None:
        table, summary = sens
        fields["tables"].append(table)
        m["sensitivity"] = summary
    stays, seed = settings.stays, settings.seed
    fields["config"].update({
        "label": settings.label, "stays_per_task": settings.stays_per_task, "chunking": out.chunking,
        "stays_requested": stays, "audit_stays": settings.audit_stays,
        "sensitivity_stays": settings.sensitivity_stays,
        "selector_input": f"{dims[0]}-d z-scored vitals" + (f" without {', '.join(settings.drop)}"
                                                           if settings.drop else ""),
        "sample": ("every eligible stay" if stays is None or stays >= out.n_eligible else
                   f"{out.n_sampled} of {out.n_eligible} eligible stays, seeded hash order (seed {seed})")})
    if settings.event is not None:
        fields["config"]["event"] = settings.event.describe()
