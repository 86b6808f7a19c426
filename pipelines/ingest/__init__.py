"""Incremental clinical ingest into a streaming warehouse (``forgetful ingest``).

A *streaming warehouse* is created once (``init``) with a **frozen standardisation** (the
training-split moments and medians of a causal batch build of the files present, or a supplied
table, never recomputed). Every later run ingests only the measurement part files it has not
seen (:func:`cohort.incremental.plan_files`: name, size, sha256; a changed file is refused), as
one watermark step: closed hours become ``vitals_hourly`` rows and tokens of each stay's
``StreamingGate``; a late row re-opens its stay by exact decrements; a killed run is completed by
the next. The step's stages, the late-row policy and the gates' settings: :func:`ingest`;
docs/STREAMING.md.
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

import duckdb

from cohort.constants import VITALS
from cohort.incremental import load_stays, plan_files
from cohort.incremental.frozen import frozen_from_batch
from pipelines.ingest import state as st
from pipelines.ingest.state import IngestError
from pipelines.ingest.steps import (
    KILL_ENV,
    MEMORY_LIMIT,
    PENDING_KEY,
    configure_run,
    finish_step,
    now_utc,
    process_step,
    stage_step,
    step_series,
)
from pipelines.settings import IngestSettings

__all__ = ["ingest", "init_tables", "read_frozen", "summary_line", "step_series", "gate_C", "KILL_ENV", "NU", "SIGMA",
           "N0"]

NU, SIGMA, N0 = 0.3, 3.0, 48
Z_COLS = [f"{v}_z" for v in VITALS]
HOUR_MS = 3_600_000
VITALS_DDL = ("CREATE TABLE IF NOT EXISTS vitals_hourly (stay_id BIGINT, hour INTEGER, "
              + ", ".join(f"{v} DOUBLE" for v in VITALS) + ", "
              + ", ".join(f"{v}_observed BOOLEAN" for v in VITALS) + ", "
              + ", ".join(f"{v}_z DOUBLE" for v in VITALS) + ", event_composite BOOLEAN, event_spo2 BOOLEAN)")
STAYS_DDL = ("CREATE TABLE IF NOT EXISTS cohort_stays (stay_id BIGINT PRIMARY KEY, subject_id BIGINT NOT NULL, "
             "hadm_id BIGINT, intime TIMESTAMP NOT NULL, outtime TIMESTAMP NOT NULL, n_hours INTEGER NOT NULL, "
             "split VARCHAR NOT NULL)")
STD_DDL = ("CREATE TABLE IF NOT EXISTS standardisation (vital VARCHAR PRIMARY KEY, mean DOUBLE NOT NULL, "
           "sd DOUBLE NOT NULL, median DOUBLE NOT NULL)")


def gate_C() -> float:
    from sv_core import calibrate_C

    return calibrate_C(nu=NU, n0=N0)


# ------------------------------------------------------------------------ frozen standardisation
def read_frozen(con) -> dict:
    rows = con.execute("SELECT vital, mean, sd, median FROM standardisation").fetchall()
    return {v: {"mean": float(m), "sd": float(s), "median": float(md)} for v, m, s, md in rows}


def init_tables(con, source: str, frozen: dict, min_hours: float, seed: int, origin: str) -> None:
    from cohort.build import check_frozen

    fz = check_frozen(frozen)
    st.ensure_tables(con)
    for ddl in (VITALS_DDL, STAYS_DDL, STD_DDL):
        con.execute(ddl)
    con.execute("CREATE TABLE IF NOT EXISTS build_info (key VARCHAR PRIMARY KEY, value VARCHAR)")
    for v in VITALS:
        con.execute("INSERT INTO standardisation VALUES (?, ?, ?, ?)", [v, *fz[v]])
    import json

    con.execute("INSERT OR REPLACE INTO build_info VALUES ('params', ?)",
                [json.dumps({"source": source, "min_hours": min_hours, "sample": None, "seed": seed,
                             "fill": "causal", "frozen_standardisation": True, "streaming": True})])
    con.execute("INSERT OR REPLACE INTO build_info VALUES ('built_utc', ?)", [now_utc()])
    for k, v in {"source": source, "min_hours": min_hours, "seed": seed, "watermark_us": None, "step": 0,
                 "nu": NU, "sigma": SIGMA, "n0": N0, "C": gate_C(), "frozen_origin": origin,
                 "frozen_utc": now_utc()}.items():
        st.set_state(con, k, v)


# ------------------------------------------------------------------------ a run
def ingest(warehouse: str | os.PathLike, source: str, root: str | os.PathLike, *, init: bool = False,
           final: bool = False, settings: IngestSettings = IngestSettings(), ledger_dir=None,
           wait: float | None = None) -> dict:
    """Ingest every new part file: one watermark step for all of them (``settings.max_steps`` caps
    the number of new files taken this run). ``init`` creates the streaming warehouse (frozen
    standardisation from ``settings.frozen`` or from a causal batch build of the files present).
    ``settings.as_of_us`` raises the watermark; ``final`` closes every hour up to each stay's
    outtime (the source is complete). A step left pending by a killed run is completed first.
    ``settings.jobs`` worker processes update the gates (default: the usable CPUs, at most 8;
    results do not depend on it); ``batch_stays`` stays per committed batch; ``memory_limit``
    DuckDB's memory limit for the run (its block cache included; sorts and joins spill beyond it;
    default :data:`MEMORY_LIMIT`). Returns aggregates of the run.

    Watermark step (one per run, over all of the run's new files, in name order), in three stages:

    1. *stage* (one transaction): the files' usable rows go to ``ingest_rows`` (sorted by stay);
       the watermark W (max charttime seen, ``ingest_state``) advances; stays with a first usable
       row enter ``cohort_stays``; the file rows and the step's pending record are written.
    2. *batches* (:mod:`pipelines.ingest.batch`, one transaction per batch of consecutive stays):
       every hour whose end is ≤ W is *closed* and becomes a ``vitals_hourly`` row (causal fill,
       frozen z-scores) and a token of the stay's ``StreamingGate`` (``ingest_gates``,
       ``ingest_tokens``); each gate is saved with the step number.
    3. *finish* (one transaction): the per-step series, the content hash; the pending record goes.

    A run killed anywhere leaves committed stages: the next run completes a pending step first
    (its staged rows are kept; a stay whose gate already carries the step is not recomputed), so
    nothing is admitted twice and no row is lost. Readers of a warehouse with a pending step see
    some stays advanced to W and the rest not yet (each stay consistent: one live token per
    emitted hour); the content hash is absent until the step finishes.

    Late rows (a usable row for an hour already closed): **re-open** policy. The stay is recomputed
    from the earliest late hour (its raw rows are kept in ``ingest_rows``); every recomputed hour
    whose key changed has its old token forgotten (exact C&P decrement, ``StreamingGate.forget``)
    and the corrected key admitted; the count is reported (``late_rows``, ``reopened_hours``,
    ``replaced_tokens``). Nothing is silently ignored.

    Gates: one ``StreamingGate`` per stay, ``C = 1/(ν·n0)`` fixed when the stay's gate is created
    (:func:`gate_C`), with the declared ``n0 = 48`` (the cohort's minimum length of stay, so every
    stay reaches the warm-up of ⌈1/C⌉ + 2 = 17 keys), ν = 0.3, σ = 3 (the retention study's ν and σ;
    it sizes C by the whole stay, which a stream does not know). Keys are the six ``_z`` columns.
    After each step's admissions the reserve keys move to the cold tier (``evict_reserve``).
    Forgotten subjects: the registry is applied at scan time (``Warehouse.exclusion``), and the
    deletion-request queue (:mod:`pipelines.ingest.state`) is processed before the scan, one
    ``forget_subject`` (one receipt) per request.
    """
    from pipelines.ingest.gates import Pool, default_jobs
    from pipelines.store.warehouse import Warehouse

    t0 = time.perf_counter()
    root = Path(root)
    frozen, min_hours, seed, as_of_us = settings.frozen, settings.min_hours, settings.seed, settings.as_of_us
    jobs, batch_stays, memory_limit = settings.jobs, settings.batch_stays, settings.memory_limit or MEMORY_LIMIT
    if source not in ("mimic", "clif"):
        raise IngestError(f"ingest source must be mimic or clif, got {source!r}")
    if not root.is_dir():
        raise IngestError(f"ingest root {root} is not a directory")
    if not re.fullmatch(r"\d+(\.\d+)?(KB|MB|GB|TB|KIB|MIB|GIB|TIB)", str(memory_limit).strip().upper()):
        raise IngestError(f"memory limit {memory_limit!r} is not like '1GB' or '512MB'")
    p = Path(warehouse).resolve()
    phases: dict[str, float] = {}
    from pipelines.store.registries import source_key

    # the source is recorded, so every forget registry this configuration keeps for it applies
    with Warehouse.open(p, write=True, must_exist=not init, ledger_dir=ledger_dir, wait=wait,
                        source=source_key(source, root)) as w:
        phases["open_s"] = time.perf_counter() - t0
        if init:
            _create(w, p, source, root, frozen, min_hours, seed)
        con = w.connect(read_only=True)
        try:
            if st.STATE not in {r[0] for r in con.execute("SHOW TABLES").fetchall()}:
                raise IngestError(f"{p.name} is not a streaming warehouse; create one with `forgetful ingest --init`")
            src0 = st.get_state(con, "source")
            min_hours = float(st.get_state(con, "min_hours"))
            seed = int(st.get_state(con, "seed"))
        finally:
            con.close()
        if src0 != source:
            raise IngestError(f"this streaming warehouse ingests source {src0!r}, not {source!r}")
        t = time.perf_counter()
        deletions = st.process_deletions(w, source, root, min_hours)
        phases["deletions_s"] = time.perf_counter() - t
        con = w.connect()
        steps: list[dict] = []
        try:
            configure_run(con, memory_limit)
            t = time.perf_counter()
            recorded = {r[0]: (int(r[1]), r[2], r[3]) for r in
                        con.execute(f"SELECT name, size, sha256, mtime_ns FROM {st.FILES}").fetchall()}
            todo, touched, hashed = plan_files(source, root, recorded)
            for fid in touched:  # same bytes, new mtime: remember it so the file is not hashed again
                con.execute(f"UPDATE {st.FILES} SET mtime_ns = ? WHERE name = ?", [fid.mtime_ns, fid.name])
            phases["files_s"] = time.perf_counter() - t
            if settings.max_steps is not None:
                todo = todo[:settings.max_steps]
            pending = st.get_state(con, PENDING_KEY)
            fresh = bool(todo) or final or as_of_us is not None
            if pending or fresh:
                t = time.perf_counter()
                load_stays(con, source, root, min_hours, w.exclusion())
                frozen_now = read_frozen(con)
                phases["stays_s"] = time.perf_counter() - t
                pool = Pool(jobs or default_jobs())
                try:
                    if pending:
                        t = time.perf_counter()
                        pend = process_step(con, w.keys, dict(pending, resumed=True), frozen_now, pool, batch_stays)
                        steps.append(dict(finish_step(con, pend, set_hash=not fresh), seconds=time.perf_counter() - t))
                    if fresh:
                        t = time.perf_counter()
                        step = int(st.get_state(con, "step") or 0) + 1
                        pend = stage_step(con, step, todo, source, root, as_of_us, final, seed)
                        pend = process_step(con, w.keys, pend, frozen_now, pool, batch_stays)
                        steps.append(dict(finish_step(con, pend, set_hash=True), seconds=time.perf_counter() - t))
                finally:
                    pool.close()
                t = time.perf_counter()
                con.execute("CHECKPOINT")  # the run's one rewrite of the updated tables
                phases["checkpoint_s"] = time.perf_counter() - t
            t = time.perf_counter()
            summary = _summary(con)
            phases["summary_s"] = time.perf_counter() - t
        finally:
            con.close()
    return {"steps": steps, "deletions": deletions, "runtime_s": time.perf_counter() - t0,
            "files": {"known": len(recorded), "new": len(todo), "hashed": hashed}, "phases": phases, **summary}


def _create(w, p: Path, source: str, root: Path, frozen: dict | None, min_hours: float, seed: int) -> None:
    """``--init``: a new streaming warehouse file with its frozen standardisation."""
    if p.exists():
        raise IngestError(f"{p.name} already exists; --init creates a new streaming warehouse")
    origin = "supplied" if frozen is not None else "initial causal batch build"
    if frozen is None:
        frozen = frozen_from_batch(source, root, p.parent / f".{p.name}.ingest-init-{os.getpid()}",
                                   min_hours, seed, w.exclusion())
    tmp = p.parent / f".{p.name}.building-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    c = duckdb.connect(str(tmp))
    try:
        init_tables(c, source, frozen, min_hours, seed, origin)
        from pipelines.store.warehouse import META

        c.execute(f"CREATE TABLE IF NOT EXISTS {META} (key VARCHAR PRIMARY KEY, value VARCHAR)")
        for k, v in w.ledger_meta().items():
            c.execute(f"INSERT OR REPLACE INTO {META} VALUES (?, ?)", [k, v])
        c.execute("CHECKPOINT")
    finally:
        c.close()
    os.replace(tmp, p)


def _summary(con) -> dict:
    """Aggregates over every stay's gate (certified / event-hour retention)."""
    g = con.execute(f"SELECT count(*), coalesce(sum(n_live), 0), coalesce(sum(n_hot), 0), coalesce(sum(n_cold), 0), "
                    f"coalesce(sum(readmissions), 0), coalesce(sum(CASE WHEN gated THEN 1 ELSE 0 END), 0), "
                    f"coalesce(sum(CASE WHEN gated AND future_safe THEN 1 ELSE 0 END), 0) FROM {st.GATES}").fetchone()
    e = con.execute(f"SELECT coalesce(sum(CASE WHEN event THEN 1 ELSE 0 END), 0), "
                    f"coalesce(sum(CASE WHEN event AND hot THEN 1 ELSE 0 END), 0) FROM {st.TOKENS}").fetchone()
    per = con.execute(f"SELECT avg(h::DOUBLE / e) FROM (SELECT sum(CASE WHEN event AND hot THEN 1 ELSE 0 END) AS h, "
                      f"sum(CASE WHEN event THEN 1 ELSE 0 END) AS e FROM {st.TOKENS} GROUP BY stay_id) WHERE e > 0"
                      ).fetchone()[0]
    n_stays, live, hot, cold, readm, gated, safe = (int(x) for x in g)
    return {"n_stays": n_stays, "n_tokens": live, "n_hot": hot, "n_cold": cold, "readmissions": readm,
            "gated_stays": gated, "future_safe_stays": safe,
            "certified_retention": hot / live if live else 0.0,
            "event_hours": int(e[0]), "event_hours_hot": int(e[1]),
            "event_hour_retention_pooled": e[1] / e[0] if e[0] else 0.0,
            "event_hour_retention_mean_stay": float(per) if per is not None else 0.0,
            "watermark_us": st.get_state(con, "watermark_us"), "step": st.get_state(con, "step"),
            "series": step_series(con)}


def summary_line(r: dict) -> str:
    """One human line for a run of :func:`ingest` (what ``forgetful ingest`` prints)."""
    steps = r["steps"]
    secs = r.get("runtime_s", 0.0)
    tot = r["n_tokens"]
    ware = (f"warehouse {r['n_stays']:,} stays, {tot:,} live tokens "
            f"({100.0 * r['n_hot'] / tot if tot else 0.0:.1f} % hot)")
    dele = r.get("deletions") or {}
    dl = f", {dele['processed']} deletion request(s) processed" if dele.get("processed") else ""
    if not steps:
        f = r.get("files") or {}
        return (f"ingest: nothing new ({f.get('known', 0)} files known, {f.get('hashed', 0)} hashed){dl}; "
                f"{ware}; {secs:.1f} s")
    s = lambda k: sum(int(x.get(k, 0)) for x in steps)  # noqa: E731
    nf = sum(len(x.get("files") or []) for x in steps)
    late = f" ({s('replaced_tokens')} replaced after {s('late_rows')} late rows)" if s("late_rows") else ""
    res = " (a pending step completed)" if any(x.get("resumed") for x in steps) else ""
    return (f"ingest: {nf} new file(s){res}, {s('stays_updated'):,} stays touched, {s('new_tokens'):,} tokens "
            f"admitted{late}, {s('readmissions'):,} re-admissions{dl}; {ware}; {secs:.1f} s")
