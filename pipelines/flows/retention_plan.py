"""What the retention study computes, and in which chunks: one call, :func:`compute`.

The stays (a seeded sample with ``settings.stays``), then the stay batches — a fixed
``stays_per_task``, or sized from a pilot chunk timed in the flow's process
(:func:`pipelines.flows.retention_chunks.pilot`, :func:`pipelines.runtime.scaleout.plan_chunks`) —
and the refit audit and ν × σ sensitivity chunks, all in one pool
(:func:`pipelines.runtime.scaleout.map_phases`, issue 21).

The audit and the sensitivity take "the first N stays with an event in the seeded order"
(:func:`first_included`), which the batches' columns say only once they are done.
:func:`pipelines.flows.retention_chunks.event_stays` reads the same facts — whether a stay has an
event hour and how many hours it has — from the warehouse in one query up front, so the side
chunks are submitted with the stay batches and fill the workers' idle tail (longest first, by
estimated cost: :data:`AUDIT_COST_FACTOR`, :data:`SENSITIVITY_COST_FACTOR` × the retention chunk's
:func:`pipelines.runtime.scaleout.stay_units`). :meth:`SidePlan.finish` checks the stays against
the ones the batches' columns give and, should they differ, computes the side work again on the
right stays: the result never depends on the look-ahead.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from evaluation.clinical import retention as study
from evaluation.clinical.retention_spec import StaySpec
from evaluation.clinical.sampling import sample_stays, seeded_order
from pipelines.flows import retention_chunks as chunks
from pipelines.runtime import runner, scaleout
from pipelines.settings import RetentionSettings
from pipelines.store import warehouse as wh

#: a stay's refit-audit cost over its retention cost in the chunks, per cost unit: fitted on the
#: 1-worker chunk logs of ``python -m pipelines.bench.dask_workers`` (each phase's seconds over its
#: stays' units, relative to the stay batches'; load-dependent)
AUDIT_COST_FACTOR = 6.0
#: the same for a stay's ν × σ sensitivity row (16 solves and peers a stay)
SENSITIVITY_COST_FACTOR = 3.5


def first_included(cols: dict, m: int, seed: int, max_hours: int | None = None) -> tuple[list[int], int]:
    """The first ``m`` stays with an event in the seeded order (shorter than ``max_hours``), and
    how many were passed over for their length."""
    inc = np.asarray(cols["included"], dtype=bool)
    order = seeded_order(cols["stay_id"][inc], seed)[:m]
    if max_hours is None:
        return sorted(order.tolist()), 0
    n_of = dict(zip(cols["stay_id"][inc].tolist(), cols["n"][inc].tolist()))
    keep = [int(s) for s in order if n_of[int(s)] <= max_hours]
    return sorted(keep), len(order) - len(keep)


@dataclass
class SidePlan:
    """The audit and sensitivity chunks of one run (sized like the stay batches)."""

    warehouse: str
    content_hash: str
    settings: RetentionSettings
    spec: StaySpec
    hours: dict[int, int]
    slots: int
    seconds_per_unit: float
    audit_ids: list[int] = field(default_factory=list)
    too_long: int = 0
    sens_ids: list[int] = field(default_factory=list)
    relaunched: bool = False

    def _chunks(self, ids: list[int], factor: float, fixed: int) -> tuple[list[list[int]], list[float]]:
        h = [self.hours.get(s, 1) for s in ids]
        per = self.seconds_per_unit * factor
        chunked = (list(runner.chunks(ids, fixed)) if self.settings.stays_per_task is not None
                   else scaleout.plan_chunks(ids, h, per, slots=self.slots))
        return chunked, [sum(scaleout.stay_cost([self.hours.get(s, 1) for s in c], per)) for c in chunked]

    def phases(self, study_name: str) -> list[scaleout.Phase]:
        """The audit phase and the sensitivity phase (either empty when off)."""
        from evaluation.clinical.retention_sensitivity import NUS

        w, h = self.warehouse, self.content_hash
        a_chunks, a_costs = self._chunks(self.audit_ids, AUDIT_COST_FACTOR, 8)
        fixed = max(1, (self.settings.stays_per_task or 8) // 8)
        s_chunks, s_costs = self._chunks(self.sens_ids, SENSITIVITY_COST_FACTOR, fixed)
        return [scaleout.Phase(chunks.audit_rows, [(w, h, b, self.spec) for b in a_chunks], chunks.audit_batch,
                               f"{study_name} (refit audit)", a_costs, self._memory(a_chunks)),
                scaleout.Phase(chunks.sensitivity_rows, [(w, h, b, self.spec, list(NUS)) for b in s_chunks],
                               chunks.sensitivity_batch, f"{study_name} (sensitivity)", s_costs,
                               self._memory(s_chunks))]

    def _memory(self, chunked: list[list[int]]) -> list[float]:
        """Each chunk's estimated peak bytes (:func:`pipelines.runtime.scaleout.chunk_memory`)."""
        return [scaleout.chunk_memory([self.hours.get(s, 1) for s in b]) for b in chunked]

    def select(self, cols: dict) -> None:
        from evaluation.clinical.retention_audit import AUDIT_MAX_HOURS

        self.audit_ids, self.too_long = first_included(cols, self.settings.audit_stays, self.settings.seed,
                                                       AUDIT_MAX_HOURS)
        self.sens_ids, _ = first_included(cols, self.settings.sensitivity_stays, self.settings.seed)

    def finish(self, cols: dict, results: list[list], study_name: str, progress: bool) -> tuple[list, list, int]:
        """``(audit rows, sensitivity rows, stays passed over for their length)`` given the stay
        batches' columns and the side phases' results (:meth:`phases`): when the look-ahead chose
        other stays than ``cols`` gives, the side work is computed again on those."""
        ahead = (self.audit_ids, self.sens_ids)
        self.select(cols)
        if (self.audit_ids, self.sens_ids) != ahead:
            self.relaunched = True
            results = scaleout.map_phases(self.phases(study_name), progress=progress)
        audit_out, sens = ([r for b in res for r in b] for res in results)
        return audit_out, sens, self.too_long


@dataclass
class Computed:
    """What :func:`compute` returns: every sampled stay's columns, the side rows, the chunking
    (for the result's config) and the gates, batch by batch (``gates(con)``; None when the study
    stores none)."""

    columns: dict[str, np.ndarray]
    audit_rows: list
    sensitivity_rows: list
    too_long: int
    chunking: dict
    n_eligible: int
    n_sampled: int
    gates: object = None


def compute(warehouse: str, settings: RetentionSettings, progress: bool) -> Computed:
    """Sample the stays, plan the chunks and run them: the study's per-stay columns and side rows."""
    spec = settings.stay_spec()
    h = wh.content_hash(warehouse)
    stay_rows = wh.stays(warehouse)
    hours = {int(s[0]): int(s[3]) for s in stay_rows}
    ids = sample_stays([s[0] for s in stay_rows], settings.stays, settings.seed).tolist()
    n_eligible = len(stay_rows)
    del stay_rows
    # the flow's own BLAS limit (a task leaving its limit never restores threads mid-run), and one
    # read-only connection held open while the local tasks read (closed before the writes)
    with scaleout.one_blas_thread(), chunks.held_open(warehouse):
        pilot, parts, per_unit = chunks.pilot(warehouse, h, ids, hours, spec, settings.stays_per_task)
        ahead = (chunks.event_stays(warehouse, ids, spec)
                 if settings.audit_stays or settings.sensitivity_stays else None)
        batches, chunking = _batches(ids, hours, pilot, per_unit, settings.stays_per_task)
        todo = batches[1:] if pilot else batches
        side = SidePlan(warehouse, h, settings, spec, hours, chunking["slots"], per_unit or 1.0)
        if ahead is not None:
            side.select(ahead)
        costs = [sum(scaleout.stay_cost([hours[s] for s in b], per_unit)) if pilot else
                 sum(scaleout.stay_units([hours[s] for s in b])) for b in todo]
        done = scaleout.map_phases(
            [scaleout.Phase(chunks.batch_columns, [(warehouse, h, b, spec) for b in todo], chunks.retention_batch,
                            f"{settings.study} (stay batches)", costs,
                            [scaleout.chunk_memory([hours[s] for s in b]) for b in todo]),
             *side.phases(settings.study)], progress=progress, hold=(chunks.read_only, warehouse))
        cols = study.concat_columns(([parts] if pilot else []) + done[0])
        audit_out, sens_rows, too_long = side.finish(cols, done[1:], settings.study, progress)
    gates = chunks.staged_contexts(warehouse, h, batches, spec) if spec.build_gate else None
    return Computed(cols, audit_out, sens_rows, too_long, chunking, n_eligible, len(ids), gates)


def _batches(ids: list[int], hours: dict[int, int], pilot: list[int], per_unit: float,
             stays_per_task: int | None) -> tuple[list[list[int]], dict]:
    """The study's chunks (a fixed ``stays_per_task``, or the pilot then chunks sized from its
    measured cost) and a description for the result's config."""
    client = scaleout.dask_client()
    slots = scaleout.worker_slots(client, scaleout.local_slots())
    how = {"executor": "dask" if client is not None else "threads", "slots": slots}
    if stays_per_task is not None:
        batches = list(runner.chunks(ids, stays_per_task))
        return batches, {**how, "chunks": len(batches), "sizing": f"fixed {stays_per_task} stays per task"}
    if not pilot:
        return [], {**how, "chunks": 0, "sizing": "no stays"}
    rest = ids[len(pilot):]
    batches = [pilot] + scaleout.plan_chunks(rest, [hours[s] for s in rest], per_unit, slots=slots)
    sizes = sorted(len(b) for b in batches[1:]) or [len(pilot)]
    return batches, {**how, "chunks": len(batches), "stays_per_chunk_median": sizes[len(sizes) // 2],
                     "sizing": f"measured: {scaleout.sizing_text()}"}
