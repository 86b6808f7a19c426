"""Incremental clinical ingest into a streaming warehouse (``forgetful ingest``).

A *streaming warehouse* is created once (``init``) with a **frozen standardisation** — the
training-split moments and medians of a causal batch build of the files present at creation, or
a supplied table — recorded in ``standardisation`` (with a ``median`` column) and never
recomputed. Every later run ingests only the measurement part files it has not seen
(:func:`cohort.incremental.plan_files`; name + size + sha256 recorded in ``ingest_files``, with
the mtime, so an unchanged file is not re-read; a changed file is refused).

Watermark step (one per run, over all of the run's new files, in name order), in three stages:

1. *stage* (one transaction): the files' usable rows go to ``ingest_rows`` (sorted by stay);
   the watermark W (max charttime seen, ``ingest_state``) advances; stays with a first usable
   row enter ``cohort_stays``; the file rows and the step's pending record are written.
2. *batches* (:mod:`pipelines.ingest_batch`, one transaction per batch of consecutive stays):
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

Gates: one ``StreamingGate`` per stay, ``C = 1/(ν·n0)`` fixed when the stay's gate is created,
with the declared ``n0 = 48`` (the cohort's minimum length of stay, so every stay reaches the
warm-up of ⌈1/C⌉ + 2 = 17 keys), ν = 0.3, σ = 3 (the retention study's ν and σ; it sizes C by
the whole stay, which a stream does not know). Keys are the six ``_z`` columns. After each
step's admissions the reserve keys move to the cold tier (``evict_reserve``: future-safe).

Forgotten subjects: the registry is applied at scan time (``Warehouse.exclusion``), and the
deletion-request queue (:mod:`pipelines.ingest_state`) is processed before the scan, one
``forget_subject`` (one receipt) per request.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from cohort.constants import VITALS
from cohort.incremental import SCAN_TABLE, STAYS_TABLE, frozen_from_batch, load_stays, plan_files, scan_file

from . import ingest_state as st
from .ingest_state import IngestError

NU, SIGMA, N0 = 0.3, 3.0, 48
KILL_ENV = "FORGETFUL_INGEST_KILL"  # test hook: "<step>:<phase>" -> SIGKILL self there
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


def _kill_point(step: int, phase: str) -> None:
    spec = os.environ.get(KILL_ENV)
    if spec and spec == f"{step}:{phase}":
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


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
    con.execute("INSERT OR REPLACE INTO build_info VALUES ('built_utc', ?)", [_now()])
    for k, v in {"source": source, "min_hours": min_hours, "seed": seed, "watermark_us": None, "step": 0,
                 "nu": NU, "sigma": SIGMA, "n0": N0, "C": gate_C(), "frozen_origin": origin,
                 "frozen_utc": _now()}.items():
        st.set_state(con, k, v)


# ------------------------------------------------------------------------ one watermark step
PENDING_KEY = "pending_step"


def _update_splits(con, seed: int) -> None:
    from cohort.selection import assign_splits

    subj = np.asarray(con.execute("SELECT DISTINCT subject_id FROM cohort_stays").fetchnumpy()["subject_id"], np.int64)
    sp = assign_splits(subj, seed)
    con.register("_ing_split", pa.table({"subject_id": pa.array(np.asarray(list(sp), np.int64)),
                                         "split": pa.array(list(sp.values()))}))
    con.execute("UPDATE cohort_stays SET split = s.split FROM _ing_split s "
                "WHERE cohort_stays.subject_id = s.subject_id")
    con.unregister("_ing_split")


def _late_count(con, table: str) -> int:
    """Usable rows of ``table`` in an hour their stay has already emitted (closed)."""
    return int(con.execute(
        f"SELECT count(*) FROM {table} s JOIN {STAYS_TABLE} t USING (stay_id) JOIN {st.GATES} g USING (stay_id) "
        f"WHERE least(s.ms // {HOUR_MS}, t.n_hours - 1) < g.n_live").fetchone()[0])


def _transaction(con, fn):
    con.execute("BEGIN TRANSACTION")
    try:
        out = fn()
        con.execute("COMMIT")
        return out
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            pass
        raise


def stage_step(con, step: int, files: list, source: str, root: Path, as_of_us: int | None, final: bool,
               seed: int) -> dict:
    """Stage 1 of a watermark step, one transaction: every file's usable rows into
    ``ingest_rows`` (sorted by stay), the watermark, new stays, the file records, and the
    step's pending record (its running totals). Returns the pending record."""
    t0 = time.perf_counter()

    def body():
        w_old = st.get_state(con, "watermark_us")
        con.execute("CREATE OR REPLACE TEMP TABLE _ing_new (stay_id BIGINT, ms BIGINT, vs BIGINT, value DOUBLE)")
        recs, cands = [], [x for x in (w_old, as_of_us) if x is not None]
        for f, fid in files:
            n_rows, n_ok, max_ts = scan_file(con, source, root, f)
            recs.append([fid.name, fid.size, fid.sha256, step, n_rows, n_ok, _late_count(con, SCAN_TABLE)])
            con.execute(f"INSERT INTO _ing_new SELECT * FROM {SCAN_TABLE}")
            con.execute(f"DROP TABLE {SCAN_TABLE}")
            if max_ts is not None:
                cands.append(int(max_ts))
        if final:
            mx = con.execute(f"SELECT max(out_us) FROM {STAYS_TABLE}").fetchone()[0]
            if mx is not None:
                cands.append(int(mx))
        w_new = max(cands) if cands else None
        con.execute(f"INSERT INTO {st.ROWS} SELECT stay_id, ms, vs, value, {int(step)} FROM _ing_new "
                    "ORDER BY stay_id, ms, vs, value")
        new_stays = con.execute("SELECT count(DISTINCT stay_id) FROM _ing_new WHERE stay_id NOT IN "
                                "(SELECT stay_id FROM cohort_stays)").fetchone()[0]
        if new_stays:
            con.execute("INSERT INTO cohort_stays SELECT stay_id, subject_id, hadm_id, intime, outtime, n_hours, "
                        f"'train' FROM {STAYS_TABLE} WHERE stay_id IN (SELECT stay_id FROM _ing_new) "
                        "AND stay_id NOT IN (SELECT stay_id FROM cohort_stays)")
            _update_splits(con, seed)
        con.execute("DROP TABLE _ing_new")
        for (f, fid), r in zip(files, recs):
            con.execute(f"INSERT INTO {st.FILES} (name, size, sha256, step, n_rows, n_usable, n_late, watermark_us, "
                        "ingested_utc, mtime_ns) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        [*r, w_new, _now(), fid.mtime_ns])
        pend = {"step": step, "w_new": w_new, "files": [r[0] for r in recs], "n_rows": sum(r[4] for r in recs),
                "n_usable": sum(r[5] for r in recs), "late_rows": sum(r[6] for r in recs),
                "stays_entered": int(new_stays), "new": 0, "replaced": 0, "reopened": 0, "readmissions": 0,
                "stays_updated": 0, "tokens_rewritten": 0, "future_safe_all": True, "batches": 0,
                "stage_s": time.perf_counter() - t0}
        st.set_state(con, "watermark_us", w_new)
        st.set_state(con, "step", step)
        st.set_state(con, PENDING_KEY, pend)
        con.execute("DELETE FROM build_info WHERE key = 'content_hash'")
        _kill_point(step, "stage_before_commit")
        return pend

    pend = _transaction(con, body)
    _kill_point(step, "staged")
    return pend


def process_step(con, keys, pend: dict, frozen: dict, pool, batch_stays: int | None = None) -> dict:
    """Stage 2: the step's affected stays in batches, one committed transaction each (the
    pending record's totals advance with every batch). Returns the pending record."""
    from . import ingest_batch as ib

    step, w_new = int(pend["step"]), pend["w_new"]
    p = ib.StepParams(step, w_new, float(st.get_state(con, "C")), float(st.get_state(con, "sigma")),
                      *(np.array([frozen[v][k] for v in VITALS]) for k in ("mean", "sd", "median")))
    timing = {"todo_s": 0.0, "read_s": 0.0, "gates_s": 0.0, "write_s": 0.0}
    cpu0 = pool.worker_cpu_s
    t = time.perf_counter()
    todo = ib.affected_stays(con, step, w_new)
    timing["todo_s"] += time.perf_counter() - t

    def commit(prev):
        work, get = prev
        t1 = time.perf_counter()
        results = get()
        t2 = time.perf_counter()
        timing["gates_s"] += t2 - t1

        def body():
            c = ib.write(con, keys, work, results, step)
            for k in ("new", "replaced", "reopened", "readmissions", "stays_updated", "tokens_rewritten"):
                pend[k] = int(pend[k]) + int(c[k])
            pend["future_safe_all"] = bool(pend["future_safe_all"] and c["future_safe_all"])
            pend["batches"] = int(pend["batches"]) + 1
            st.set_state(con, PENDING_KEY, pend)
            _kill_point(step, f"batch{pend['batches']}")

        _transaction(con, body)
        timing["write_s"] += time.perf_counter() - t2

    prev = None
    kw = {} if batch_stays is None else {"max_stays": int(batch_stays)}
    for sl in ib.batches(todo, **kw):
        t = time.perf_counter()
        work = ib.prepare(con, keys, {k: v[sl] for k, v in todo.items()}, p)
        timing["read_s"] += time.perf_counter() - t
        get = pool.submit(p.C, p.sigma, work["items"], parallel=todo["ids"].size >= ib.PARALLEL_MIN_STAYS)
        if prev is not None:
            commit(prev)
        prev = (work, get)
    if prev is not None:
        commit(prev)
    timing["worker_cpu_s"] = pool.worker_cpu_s - cpu0
    pend["timing"] = {k: round(v, 3) for k, v in timing.items()}
    return pend


def finish_step(con, pend: dict, set_hash: bool) -> dict:
    """Stage 3: the step's series entry, the content hash (last step of a run), the pending
    record cleared; one transaction. Returns the step's statistics."""
    t0 = time.perf_counter()
    step = int(pend["step"])
    files = pend.get("files") or []
    stats = {"step": step, "file": files[0] if len(files) == 1 else None, "files": files,
             "n_rows": int(pend["n_rows"]), "n_usable": int(pend["n_usable"]), "late_rows": int(pend["late_rows"]),
             "reopened_hours": int(pend["reopened"]), "new_tokens": int(pend["new"]),
             "replaced_tokens": int(pend["replaced"]), "readmissions": int(pend["readmissions"]),
             "stays_entered": int(pend["stays_entered"]), "stays_updated": int(pend["stays_updated"]),
             "tokens_rewritten": int(pend["tokens_rewritten"]), "batches": int(pend["batches"]),
             "future_safe_all": bool(pend["future_safe_all"]), "resumed": bool(pend.get("resumed", False))}

    def body():
        _append_series(con, stats)
        con.execute(f"DELETE FROM {st.STATE} WHERE key = ?", [PENDING_KEY])
        con.execute("DELETE FROM build_info WHERE key = 'content_hash'")
        if set_hash:
            from cohort.build import content_hash

            con.execute("INSERT INTO build_info VALUES ('content_hash', ?)", [content_hash(con)])
        _kill_point(step, "before_commit")

    _transaction(con, body)
    _kill_point(step, "after_commit")
    stats["timing"] = dict(pend.get("timing") or {}, stage_s=round(float(pend.get("stage_s", 0.0)), 3),
                           finish_s=round(time.perf_counter() - t0, 3))
    return stats


SERIES_KEY, SERIES_MAX = "step_series", 500


def _append_series(con, stats: dict) -> None:
    """Append this step's aggregates (totals over every stay's gate after the step) to the
    durable per-step series ``ingest_state[step_series]`` (last :data:`SERIES_MAX` steps; counts
    only, inside the step's transaction)."""
    g = con.execute(f"SELECT coalesce(sum(n_live), 0), coalesce(sum(n_hot), 0), coalesce(sum(n_cold), 0), "
                    f"coalesce(sum(readmissions), 0) FROM {st.GATES}").fetchone()
    live, hot, cold, readm = (int(x) for x in g)
    row = {"step": int(stats["step"]), "hours_admitted": live, "new_tokens": int(stats["new_tokens"]),
           "n_hot": hot, "n_cold": cold, "readmissions": readm, "late_rows": int(stats["late_rows"]),
           "reopened_hours": int(stats["reopened_hours"]), "replaced_tokens": int(stats["replaced_tokens"]),
           "certified_retention": hot / live if live else 0.0, "future_safe_all": bool(stats["future_safe_all"])}
    series = list(st.get_state(con, SERIES_KEY) or [])
    series.append(row)
    st.set_state(con, SERIES_KEY, series[-SERIES_MAX:])


def step_series(con) -> list[dict]:
    """The durable per-step aggregate series (oldest first; empty for an older warehouse)."""
    return list(st.get_state(con, SERIES_KEY) or [])


# ------------------------------------------------------------------------ a run
def ingest(warehouse: str | os.PathLike, source: str, root: str | os.PathLike, *, init: bool = False,
           frozen: dict | None = None, min_hours: float = 48, seed: int = 0, as_of_us: int | None = None,
           final: bool = False, max_steps: int | None = None, ledger_dir=None, wait: float | None = None,
           jobs: int | None = None, batch_stays: int | None = None) -> dict:
    """Ingest every new part file: one watermark step for all of them (``max_steps`` caps the
    number of new files taken this run). ``init`` creates the streaming warehouse (frozen
    standardisation from ``frozen`` or from a causal batch build of the files present).
    ``as_of_us`` raises the watermark; ``final`` closes every hour up to each stay's outtime (the
    source is complete). A step left pending by a killed run is completed first. ``jobs``
    worker processes update the gates (default: the usable CPUs, at most 8; results do not
    depend on it); ``batch_stays`` stays per committed batch. Returns aggregates of the run."""
    from .ingest_batch import Pool, default_jobs
    from .warehouse import Warehouse

    t0 = time.perf_counter()
    root = Path(root)
    if source not in ("mimic", "clif"):
        raise IngestError(f"ingest source must be mimic or clif, got {source!r}")
    if not root.is_dir():
        raise IngestError(f"ingest root {root} is not a directory")
    if jobs is not None and (not isinstance(jobs, int) or jobs < 1):
        raise IngestError(f"jobs must be a positive integer, got {jobs!r}")
    p = Path(warehouse).resolve()
    phases: dict[str, float] = {}
    with Warehouse.open(p, write=True, must_exist=not init, ledger_dir=ledger_dir, wait=wait) as w:
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
            t = time.perf_counter()
            recorded = {r[0]: (int(r[1]), r[2], r[3]) for r in
                        con.execute(f"SELECT name, size, sha256, mtime_ns FROM {st.FILES}").fetchall()}
            todo, touched, hashed = plan_files(source, root, recorded)
            for fid in touched:  # same bytes, new mtime: remember it so the file is not hashed again
                con.execute(f"UPDATE {st.FILES} SET mtime_ns = ? WHERE name = ?", [fid.mtime_ns, fid.name])
            phases["files_s"] = time.perf_counter() - t
            if max_steps is not None:
                todo = todo[:max_steps]
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
        from .warehouse import META

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
