"""The three stages of a watermark step of the incremental ingest (:mod:`pipelines.ingest`):
*stage* the step's files (one transaction), recompute the affected stays in *batches* (one
transaction each, :mod:`pipelines.ingest.batch`), *finish* (series, content hash; one
transaction). The step's pending record in ``ingest_state`` carries its running totals, so a
killed run's step is completed by the next run (:func:`process_step` skips stays whose gate
already carries the step).
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from cohort.constants import VITALS
from cohort.incremental import SCAN_TABLE, STAYS_TABLE, scan_file
from pipelines.errors import IngestError
from pipelines.ingest import state as st

KILL_ENV = "FORGETFUL_INGEST_KILL"  # test hook: "<step>:<phase>" -> SIGKILL self there
HOUR_MS = 3_600_000


def kill_point(step: int, phase: str) -> None:
    """Test hook: SIGKILL this process at ``<step>:<phase>`` when :data:`KILL_ENV` names it
    (:func:`pipelines.store.killpoint.hit`)."""
    from pipelines.store import killpoint

    killpoint.hit(f"{step}:{phase}", KILL_ENV)


def now_utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


PENDING_KEY = "pending_step"
MEMORY_LIMIT = "1GB"  # DuckDB memory limit of an ingest run (default)


def configure_run(con, memory_limit: str = MEMORY_LIMIT) -> None:
    """DuckDB settings of an ingest run's connection (its database instance).

    * ``memory_limit``: the run's memory cap (block cache included; sorts and joins spill).
    * ``index_scan_max_count = 0``: DuckDB answers a selective range filter on an indexed column
      (``ingest_gates``' key) with per-row index fetches; over a gate table rewritten every night
      that costs far more than the zone-mapped scan.
    * ``wal_autocheckpoint`` = a quarter of ``memory_limit`` (:data:`WAL_SHARE`): DuckDB
      checkpoints when the WAL passes this size (16 MB by default), and a checkpoint rewrites
      every updated column of a touched row group whole; one batch of 2,000 gate blobs is about
      16 MB, so every batch's commit would rewrite the whole gate table. Each commit stays durable (WAL,
      one fsync per commit; a killed
      run's committed batches are replayed when the warehouse is next opened); the tables are
      rewritten every quarter of the memory limit of WAL (a few times a night at 42,000 stays)
      and by the ``CHECKPOINT`` after the steps. Not the whole limit: updates not yet
      checkpointed stay in the buffer pool, and at the full limit a day 2 at 42,000 stays left
      the content hash's sort no memory (OutOfMemoryException).
    """
    mem = str(memory_limit).strip().upper()
    con.execute(f"SET memory_limit = '{mem}'")
    con.execute("SET index_scan_max_count = 0")
    con.execute(f"SET wal_autocheckpoint = '{max(16, int(memory_megabytes(mem) * WAL_SHARE))}MB'")


#: the share of the run's memory limit the WAL may reach before DuckDB checkpoints
WAL_SHARE = 0.25
_UNITS = {"B": 1e-6, "KB": 1e-3, "MB": 1.0, "GB": 1e3, "TB": 1e6,
          "KIB": 1.024e-3, "MIB": 1.048576, "GIB": 1073.741824, "TIB": 1099511.627776}


def memory_megabytes(mem: str) -> float:
    """``"1GB"`` -> 1000.0: a DuckDB memory size in MB (IngestError when it is not one)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]I?B|B)\s*", str(mem).upper())
    if not m:
        raise IngestError(f"not a memory size: {mem!r} (e.g. 1GB, 512MB)")
    return float(m.group(1)) * _UNITS[m.group(2)]


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
        for (_, fid), r in zip(files, recs):
            con.execute(f"INSERT INTO {st.FILES} (name, size, sha256, step, n_rows, n_usable, n_late, watermark_us, "
                        "ingested_utc, mtime_ns) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        [*r, w_new, now_utc(), fid.mtime_ns])
        pend = {"step": step, "w_new": w_new, "files": [r[0] for r in recs], "n_rows": sum(r[4] for r in recs),
                "n_usable": sum(r[5] for r in recs), "late_rows": sum(r[6] for r in recs),
                "stays_entered": int(new_stays), "new": 0, "replaced": 0, "reopened": 0, "readmissions": 0,
                "stays_updated": 0, "tokens_rewritten": 0, "future_safe_all": True, "batches": 0,
                "stage_s": time.perf_counter() - t0}
        st.set_state(con, "watermark_us", w_new)
        st.set_state(con, "step", step)
        st.set_state(con, PENDING_KEY, pend)
        con.execute("DELETE FROM build_info WHERE key = 'content_hash'")
        kill_point(step, "stage_before_commit")
        return pend

    pend = _transaction(con, body)
    kill_point(step, "staged")
    return pend


def process_step(con, keys, pend: dict, frozen: dict, pool, batch_stays: int | None = None) -> dict:
    """Stage 2: the step's affected stays in batches, one committed transaction each (the
    pending record's totals advance with every batch). Returns the pending record."""
    from pipelines.ingest import batch as ib
    from pipelines.ingest import gates as ig

    step, w_new = int(pend["step"]), pend["w_new"]
    p = ib.StepParams(step, w_new, float(st.get_state(con, "C")), float(st.get_state(con, "sigma")),
                      *(np.array([frozen[v][k] for v in VITALS]) for k in ("mean", "sd", "median")))
    timing = {"todo_s": 0.0, "read_s": 0.0, "gates_s": 0.0, "write_s": 0.0}
    cpu0, runq0, main_runq0 = pool.worker_cpu_s, pool.worker_runq_s, ig.runq_wait_s()
    t = time.perf_counter()
    todo = ib.affected_stays(con, step, w_new)
    timing["todo_s"] += time.perf_counter() - t

    t_commit = [0.0]

    def commit(prev):
        work, get = prev
        t1 = time.perf_counter()
        results = get()
        t2 = time.perf_counter()
        timing["gates_s"] += t2 - t1

        def body():
            c = ib.write(con, keys, work, results, step, timing)
            for k in ("new", "replaced", "reopened", "readmissions", "stays_updated", "tokens_rewritten"):
                pend[k] = int(pend[k]) + int(c[k])
            pend["future_safe_all"] = bool(pend["future_safe_all"] and c["future_safe_all"])
            pend["batches"] = int(pend["batches"]) + 1
            st.set_state(con, PENDING_KEY, pend)
            kill_point(step, f"batch{pend['batches']}")
            t_commit[0] = time.perf_counter()

        _transaction(con, body)
        timing["write_s"] += time.perf_counter() - t2
        timing["commit_s"] = timing.get("commit_s", 0.0) + time.perf_counter() - t_commit[0]

    prev = None
    kw = {} if batch_stays is None else {"max_stays": int(batch_stays)}
    for sl in ib.batches(todo, **kw):
        t = time.perf_counter()
        work = ib.prepare(con, keys, {k: v[sl] for k, v in todo.items()}, p)
        timing["read_s"] += time.perf_counter() - t
        get = pool.submit(p.C, p.sigma, work["items"], parallel=todo["ids"].size >= ig.PARALLEL_MIN_STAYS)
        if prev is not None:
            commit(prev)
        prev = (work, get)
    if prev is not None:
        commit(prev)
    timing["worker_cpu_s"] = pool.worker_cpu_s - cpu0
    timing["worker_peak_rss_mb"] = pool.worker_peak_rss_mb
    timing["worker_runq_s"] = pool.worker_runq_s - runq0
    timing["runq_s"] = ig.runq_wait_s() - main_runq0  # this process, waiting for a CPU
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
        kill_point(step, "before_commit")

    _transaction(con, body)
    kill_point(step, "after_commit")
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
