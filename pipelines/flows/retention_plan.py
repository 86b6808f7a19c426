"""The retention study's refit audit and ν × σ sensitivity, planned before its stay batches so that
all three run in one pool (:func:`pipelines.runtime.scaleout.map_phases`, issue 21).

Both take "the first N stays with an event in the seeded order" (:func:`first_included`), which
the stay batches' columns say only once they are done. :func:`event_stays` reads the same facts
— whether a stay has an event hour and how many hours it has — from the warehouse in one query
up front, so the audit and sensitivity chunks are submitted with the stay batches and fill the
workers' idle tail (longest first, by estimated cost: :data:`AUDIT_COST_FACTOR`,
:data:`SENSITIVITY_COST_FACTOR` × the retention chunk's :func:`pipelines.runtime.scaleout.stay_units`).
:meth:`SidePlan.finish` checks the stays against the ones the batches' columns give and, should
they differ, computes the side work again on the right stays: the result never depends on the
look-ahead.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipelines.errors import StudyInputError
from pipelines.runtime import runner, scaleout

#: a stay's refit-audit cost over its retention cost in the chunks, per cost unit: measured from the
#: 1-worker chunk logs of 1,000-stay runs (``python -m pipelines.bench.dask_workers``, seed-1 set: each phase's
#: measured seconds over its stays' units, relative to the stay batches'): 4.1-8.8× (load-dependent)
AUDIT_COST_FACTOR = 6.0
#: the same for a stay's ν × σ sensitivity row (16 solves and peers a stay): 2.6-5.1×
SENSITIVITY_COST_FACTOR = 3.5
EVENT_COLUMNS = ("event_composite", "event_spo2")


def event_stays(warehouse: str, stay_ids: list[int], label: str) -> dict[str, np.ndarray]:
    """Per stay of ``stay_ids`` (in that order): ``{"stay_id", "included" (any ``label`` hour),
    "n" (hours)}`` — the columns :func:`first_included` reads, from one grouped query."""
    from pipelines.flows.retention_chunks import read_only

    if label not in EVENT_COLUMNS:
        raise StudyInputError(f"label must be one of {EVENT_COLUMNS}, got {label!r}")
    con = read_only(warehouse)
    try:
        got = {int(s): (bool(e), int(n)) for s, e, n in con.execute(
            f"SELECT stay_id, coalesce(bool_or({label}), false), count(*) FROM vitals_hourly "
            "WHERE stay_id IN (SELECT unnest(?::BIGINT[])) GROUP BY stay_id", [list(map(int, stay_ids))]).fetchall()}
    finally:
        con.close()
    inc = [got.get(int(s), (False, 0)) for s in stay_ids]
    return {"stay_id": np.asarray(stay_ids, dtype=np.int64), "included": np.asarray([i for i, _ in inc], dtype=bool),
            "n": np.asarray([n for _, n in inc], dtype=np.int64)}


def first_included(cols: dict, m: int, seed: int, max_hours: int | None = None) -> tuple[list[int], int]:
    """The first ``m`` stays with an event in the seeded order (shorter than ``max_hours``), and
    how many were passed over for their length."""
    from evaluation.clinical.sampling import seeded_order

    inc = np.asarray(cols["included"], dtype=bool)
    order = seeded_order(cols["stay_id"][inc], seed)[:m]
    if max_hours is None:
        return sorted(order.tolist()), 0
    n_of = dict(zip(cols["stay_id"][inc].tolist(), cols["n"][inc].tolist()))
    keep = [int(s) for s in order if n_of[int(s)] <= max_hours]
    return sorted(keep), len(order) - len(keep)


@dataclass
class SidePlan:
    """The audit and sensitivity chunks of one run (:func:`plan_side`)."""

    warehouse: str
    content_hash: str
    label: str
    drop: list[str]
    nu: float
    sigma: float
    seed: int
    audit_stays: int
    sensitivity_stays: int
    hours: dict[int, int]
    stays_per_task: int | None
    slots: int
    seconds_per_unit: float
    audit_ids: list[int] = field(default_factory=list)
    too_long: int = 0
    sens_ids: list[int] = field(default_factory=list)
    relaunched: bool = False

    def _chunks(self, ids: list[int], factor: float, fixed: int) -> tuple[list[list[int]], list[float]]:
        h = [self.hours.get(s, 1) for s in ids]
        per = self.seconds_per_unit * factor
        chunks = (list(runner.chunks(ids, fixed)) if self.stays_per_task is not None
                  else scaleout.plan_chunks(ids, h, per, slots=self.slots))
        return chunks, [sum(scaleout.stay_cost([self.hours.get(s, 1) for s in c], per)) for c in chunks]

    def phases(self, study_name: str) -> list[scaleout.Phase]:
        """The audit phase and the sensitivity phase (either empty when off)."""
        from evaluation.clinical.retention_sensitivity import NUS
        from pipelines.flows.retention_chunks import audit_batch, audit_rows, sensitivity_batch, sensitivity_rows

        w, h = self.warehouse, self.content_hash
        a_chunks, a_costs = self._chunks(self.audit_ids, AUDIT_COST_FACTOR, 8)
        fixed = max(1, (self.stays_per_task or 8) // 8)
        s_chunks, s_costs = self._chunks(self.sens_ids, SENSITIVITY_COST_FACTOR, fixed)
        return [scaleout.Phase(audit_rows, [(w, h, b, self.label, self.drop, self.nu, self.sigma) for b in a_chunks],
                               audit_batch, f"{study_name} (refit audit)", a_costs, self._memory(a_chunks)),
                scaleout.Phase(sensitivity_rows, [(w, h, b, self.label, self.drop, self.sigma, list(NUS))
                                                  for b in s_chunks],
                               sensitivity_batch, f"{study_name} (sensitivity)", s_costs, self._memory(s_chunks))]

    def _memory(self, chunks: list[list[int]]) -> list[float]:
        """Each chunk's estimated peak bytes (:func:`pipelines.runtime.scaleout.chunk_memory`)."""
        return [scaleout.chunk_memory([self.hours.get(s, 1) for s in b]) for b in chunks]

    def select(self, cols: dict) -> None:
        from evaluation.clinical.retention_audit import AUDIT_MAX_HOURS

        self.audit_ids, self.too_long = first_included(cols, self.audit_stays, self.seed, AUDIT_MAX_HOURS)
        self.sens_ids, _ = first_included(cols, self.sensitivity_stays, self.seed)

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


def plan_side(warehouse: str, content_hash: str, ids: list[int], hours: dict[int, int], batches: list[list[int]],
              batch_costs: list[float] | None, *, label: str, drop: list[str], nu: float, sigma: float, seed: int,
              audit_stays: int, sensitivity_stays: int, stays_per_task: int | None,
              slots: int) -> tuple[SidePlan, list[float]]:
    """The side plan (stays chosen from :func:`event_stays`), and the stay batches' costs on the
    same scale: ``batch_costs`` (seconds, from the pilot) when given, else their cost units."""
    units = [sum(scaleout.stay_units([hours.get(s, 1) for s in b])) for b in batches]
    per_unit = sum(batch_costs) / max(1e-300, sum(units)) if batch_costs else 1.0
    plan = SidePlan(warehouse, content_hash, label, drop, nu, sigma, seed, audit_stays, sensitivity_stays, hours,
                    stays_per_task, slots, per_unit)
    if audit_stays or sensitivity_stays:
        plan.select(event_stays(warehouse, ids, label))
    return plan, (list(batch_costs) if batch_costs else units)
