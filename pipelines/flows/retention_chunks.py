"""The chunk functions of ``forgetful retention`` / ``heldout-spo2`` (:mod:`pipelines.flows.clinical_retention`).

Each chunk reads its own stays from the warehouse (read-only, given stay ids; one connection held
open while the local tasks read, :func:`held_open`) and returns a few numbers per stay
(:func:`batch_columns`); its full result, with every stay's gate state, goes to the authenticated
task cache (:func:`retention_batch_full`), from which :func:`staged_contexts` later feeds the gates
to the warehouse batch by batch. Also here: the timed pilot chunk (:func:`pilot`), the look-ahead
read of which stays have an event (:func:`event_stays`), and the refit-audit and ν × σ sensitivity
chunk functions — the same functions on the local thread pool (Prefect tasks) and on a Dask
cluster (:mod:`pipelines.runtime.scaleout`). Every chunk function takes the stays' ids and one
:class:`~evaluation.clinical.retention_spec.StaySpec`.
"""
from __future__ import annotations

import contextlib

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

from evaluation.clinical import retention as study
from evaluation.clinical.retention_spec import StaySpec
from pipelines.runtime import runner, scaleout, task_cache
from pipelines.runtime.scaleout import one_blas_thread
from pipelines.store import gate_store
from pipelines.store import warehouse as wh

#: DuckDB memory cap of the study's own connections (reads of a batch, staged gate writes): the buffer pool
#: keeps written gate blocks up to the cap, so a small cap keeps retention's peak RSS flat in the number of
#: stays (set by the longest stay; pipelines.bench.scale measures it)
DUCKDB_MEMORY = "64MB"


def read_only(warehouse: str):
    """A read-only connection with the study's memory cap. While :func:`held_open` keeps one open,
    every further one in this process shares its database instance (otherwise each batch pays
    the opening)."""
    import duckdb

    con = duckdb.connect(str(wh.require(warehouse)), read_only=True)
    con.execute(f"SET memory_limit = '{DUCKDB_MEMORY}'")  # the instance's buffer pool stays bounded
    return con


@contextlib.contextmanager
def held_open(warehouse: str):
    """Keep one read-only connection open while the batch tasks read (closed before any write)."""
    con = read_only(warehouse)
    try:
        yield
    finally:
        con.close()


def read_stays(warehouse: str, stay_ids: list[int], con=None) -> list:
    """The batch's :class:`cohort.streams.StayStream` objects, read in one query, on ``con`` or
    a read-only connection that is closed before any computation."""
    from cohort.streams import iter_stays

    if con is not None:
        return list(iter_stays(con, stay_ids=list(stay_ids)))
    own = read_only(warehouse)
    try:
        return list(iter_stays(own, stay_ids=list(stay_ids)))
    finally:
        own.close()


def batch_results(warehouse: str, stay_ids: list[int], spec: StaySpec, con=None) -> dict:
    """Map step over a batch of stays: ``{"columns": per-stay columns (with stay_id, subject_id),
    "gates": [{stay_id, subject_id, staged, hours}]}`` (gates only with ``spec.build_gate``;
    ``staged``: :func:`pipelines.store.gate_store.staged_record`, serialised here, where the gate was
    built and validated); read through ``con`` when given."""
    built = study.build_policies(spec.policies, nu=spec.nu, sigma=spec.sigma)
    rows, gates, ids, subj, d = [], [], [], [], None
    with one_blas_thread():
        for s in read_stays(warehouse, stay_ids, con):
            X, ev = spec.keys_events(s)
            d = int(X.shape[1])
            r = study.stay_retention(X, ev, built, build_gate=spec.build_gate)
            g = None if r is None else r.pop("gate", None)
            if g is not None:
                gates.append({"stay_id": s.stay_id, "subject_id": s.subject_id,
                              "staged": gate_store.staged_record(g), "hours": s.hours.copy()})
            rows.append(r)
            ids.append(s.stay_id)
            subj.append(s.subject_id)
    cols = study.rows_to_columns(rows, list(built), d=d)
    cols["stay_id"] = np.asarray(ids, dtype=np.int64)
    cols["subject_id"] = np.asarray(subj, dtype=np.int64)
    return {"columns": cols, "gates": gates}


@task_cache.cached
def retention_batch_full(warehouse: str, content_hash: str, stay_ids: list[int], spec: StaySpec) -> dict:
    """:func:`batch_results`, cached (gates as staged records)."""
    return batch_results(warehouse, stay_ids, spec)


def batch_columns(warehouse: str, content_hash: str, stay_ids: list[int], spec: StaySpec) -> dict:
    """The chunk function (local thread pool and Dask alike, :mod:`pipelines.runtime.scaleout`): the
    chunk's per-stay columns only (a few numbers per stay); its gates stay in the task cache."""
    return retention_batch_full(warehouse, content_hash, stay_ids, spec)["columns"]


@task_cache.cached
def pilot_batch(warehouse: str, content_hash: str, stay_ids: list[int], spec: StaySpec) -> dict:
    """The first chunk, computed and timed in the flow's own process: ``{"columns", "seconds"}``.
    Cached, so a rerun after a crash plans the same chunks and resumes from the task cache."""
    with scaleout.timed(stay_ids) as clock:
        cols = batch_columns(warehouse, content_hash, stay_ids, spec)
    return {"columns": cols, "seconds": float(clock.seconds)}


@task(name="retention-batch", cache_policy=NO_CACHE, persist_result=False,
      retries=2, retry_delay_seconds=runner.IO_RETRY_DELAYS, retry_condition_fn=runner.retry_transient_io)
def retention_batch(warehouse: str, content_hash: str, stay_ids: list[int], spec: StaySpec) -> dict:
    """:func:`batch_columns` as a Prefect task (the local thread pool)."""
    return batch_columns(warehouse, content_hash, stay_ids, spec)


@task_cache.cached
def sensitivity_rows(warehouse: str, content_hash: str, stay_ids: list[int], spec: StaySpec,
                     nus: list[float]) -> list[dict]:
    """Chunk function of the ν × σ sensitivity table: one row per stay with an event."""
    from evaluation.clinical.retention_sensitivity import settings, stay_sensitivity

    grid = settings(spec.sigma, nus)
    out = []
    with one_blas_thread():
        for s in read_stays(warehouse, stay_ids):
            r = stay_sensitivity(*spec.keys_events(s), grid)
            if r is not None:
                out.append({"stay_id": s.stay_id, **r})
    return out


@task(name="retention-sensitivity", cache_policy=NO_CACHE, persist_result=False)
def sensitivity_batch(warehouse: str, content_hash: str, stay_ids: list[int], spec: StaySpec,
                      nus: list[float]) -> list[dict]:
    return sensitivity_rows(warehouse, content_hash, stay_ids, spec, nus)


@task_cache.cached
def audit_rows(warehouse: str, content_hash: str, stay_ids: list[int], spec: StaySpec) -> list[dict]:
    """Chunk function of the refit audit: one row per stay."""
    from evaluation.clinical.retention_audit import audit_stay
    from evaluation.policies import SupportVectorPolicy

    pol = SupportVectorPolicy(nu=spec.nu, sigma=spec.sigma)
    with one_blas_thread():
        return [audit_stay(s.keys(spec.drop), pol.box_C(s.hours.size), spec.sigma)
                for s in read_stays(warehouse, stay_ids)]


@task(name="retention-audit", cache_policy=NO_CACHE, persist_result=False)
def audit_batch(warehouse: str, content_hash: str, stay_ids: list[int], spec: StaySpec) -> list[dict]:
    return audit_rows(warehouse, content_hash, stay_ids, spec)


def event_stays(warehouse: str, stay_ids: list[int], spec: StaySpec) -> dict[str, np.ndarray]:
    """Per stay of ``stay_ids`` (in that order): ``{"stay_id", "included" (any event hour),
    "n" (hours)}`` — what the batches' columns will say, read up front in one grouped query."""
    con = read_only(warehouse)
    try:
        got = {int(s): (bool(e), int(n)) for s, e, n in con.execute(
            f"SELECT stay_id, coalesce(bool_or({spec.event_sql()}), false), count(*) FROM vitals_hourly "
            "WHERE stay_id IN (SELECT unnest(?::BIGINT[])) GROUP BY stay_id", [list(map(int, stay_ids))]).fetchall()}
    finally:
        con.close()
    inc = [got.get(int(s), (False, 0)) for s in stay_ids]
    return {"stay_id": np.asarray(stay_ids, dtype=np.int64), "included": np.asarray([i for i, _ in inc], dtype=bool),
            "n": np.asarray([n for _, n in inc], dtype=np.int64)}


def pilot(warehouse: str, content_hash: str, ids: list[int], hours: dict[int, int], spec: StaySpec,
          stays_per_task: int | None) -> tuple[list[int], dict | None, float]:
    """The pilot chunk (the first :data:`~pipelines.runtime.scaleout.PILOT_STAYS` stays), run and
    timed in the flow's own process unless ``stays_per_task`` fixes the chunks: ``(its stays, its
    columns or None, measured seconds per cost unit)``."""
    if stays_per_task is not None or not ids:
        return [], None, 0.0
    stays = ids[:scaleout.PILOT_STAYS]
    out = pilot_batch(warehouse, content_hash, stays, spec)
    return stays, out["columns"], scaleout.seconds_per_unit(out["seconds"], [hours[s] for s in stays])


def staged_contexts(warehouse: str, content_hash: str, batches: list[list[int]], spec: StaySpec):
    """``f(con)`` yielding each batch's gates as :class:`gate_store.StagedState` lists, from the
    task cache (recomputed through ``con`` if an entry is gone): the blobs serialised by the chunk
    that built and validated the gates, each checked against its SHA-256
    (:func:`gate_store.staged_state`), stored as they are."""

    def contexts(con):
        for b in batches:
            hit, full = retention_batch_full.lookup(warehouse, content_hash, b, spec)
            if not hit:  # the entry is gone (removed by hand): recomputed, read through this connection
                full = batch_results(warehouse, b, spec, con=con)
            yield [gate_store.staged_state(gs["staged"], gs["subject_id"], gs["stay_id"], gs["hours"])
                   for gs in sorted(full["gates"], key=lambda x: x["stay_id"])]
    return contexts
