"""Incremental clinical ingest into a streaming warehouse (``forgetful ingest``).

A *streaming warehouse* is created once (``init``) with a **frozen standardisation** — the
training-split moments and medians of a causal batch build of the files present at creation, or
a supplied table — recorded in ``standardisation`` (with a ``median`` column) and never
recomputed. Every later run ingests only the measurement part files it has not seen
(:func:`cohort.incremental.measurement_files`; name + size + sha256 recorded in ``ingest_files``;
a changed file is refused).

Watermark step (one per new file, in name order). In ONE DuckDB transaction: the file's usable
rows go to ``ingest_rows``; the watermark W (max charttime seen, ``ingest_state``) advances;
stays with a first usable row enter ``cohort_stays``; every hour whose end is ≤ W is *closed*
and becomes a ``vitals_hourly`` row (causal fill, frozen z-scores) and a token of the stay's
``StreamingGate`` (``ingest_gates``, ``ingest_tokens``); the file row is written; COMMIT. A run
killed anywhere leaves the last committed step: the next run redoes the uncommitted file from
scratch (no double admission: the gates, tokens and rows of that step were never committed).

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
from cohort.incremental import (
    SCAN_TABLE,
    STAYS_TABLE,
    SourceChangedError,
    causal_rows,
    closed_hours,
    empty_scan,
    file_identity,
    frozen_from_batch,
    load_stays,
    measurement_files,
    out_table,
    scan_file,
)

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
class _Stays:
    """Eligible stays of the source (arrays sorted by stay id)."""

    def __init__(self, con):
        t = con.execute(f"SELECT stay_id, subject_id, in_us, out_us, n_hours FROM {STAYS_TABLE} ORDER BY stay_id"
                        ).fetchnumpy()
        self.ids = np.asarray(t["stay_id"], np.int64)
        self.subject = np.asarray(t["subject_id"], np.int64)
        self.in_us = np.asarray(t["in_us"], np.int64)
        self.out_us = np.asarray(t["out_us"], np.int64)
        self.n_hours = np.asarray(t["n_hours"], np.int64)

    def index(self, stay_ids) -> np.ndarray:
        return np.searchsorted(self.ids, np.asarray(stay_ids, np.int64))


def _reg(con, name: str, table) -> None:
    con.register(name, table)


def _update_splits(con, seed: int) -> None:
    from cohort.selection import assign_splits

    subj = np.asarray(con.execute("SELECT DISTINCT subject_id FROM cohort_stays").fetchnumpy()["subject_id"], np.int64)
    sp = assign_splits(subj, seed)
    _reg(con, "_ing_split", pa.table({"subject_id": pa.array(np.asarray(list(sp), np.int64)),
                                      "split": pa.array(list(sp.values()))}))
    con.execute("UPDATE cohort_stays SET split = s.split FROM _ing_split s "
                "WHERE cohort_stays.subject_id = s.subject_id")
    con.unregister("_ing_split")


CHUNK_STAYS = 256  # stays recomputed per batch inside a step (bounds the rows held in memory)


def run_step(con, keys, stays: _Stays, step: int, part: Path | None, fid, source: str, root: Path,
             as_of_us: int | None, final: bool, frozen: dict, seed: int, set_hash: bool) -> dict:
    """One watermark step inside one transaction (COMMIT at the end; ROLLBACK on any error)."""
    t0 = time.perf_counter()
    con.execute("BEGIN TRANSACTION")
    try:
        w_old = st.get_state(con, "watermark_us")
        n_rows, n_ok, max_ts = scan_file(con, source, root, part) if part is not None else (0, 0, None)
        if part is None:
            empty_scan(con)
        cands = [x for x in (w_old, max_ts, as_of_us) if x is not None]
        if final and stays.ids.size:
            cands.append(int(stays.out_us.max()))
        w_new = max(cands) if cands else None
        # late rows: usable rows of an hour the stay has already emitted (closed) -> re-open
        late = con.execute(
            f"WITH em AS (SELECT stay_id, count(*) AS n FROM vitals_hourly GROUP BY stay_id) "
            f"SELECT s.stay_id, min(least(s.ms // {HOUR_MS}, t.n_hours - 1)), count(*) FROM {SCAN_TABLE} s "
            f"JOIN {STAYS_TABLE} t USING (stay_id) JOIN em USING (stay_id) "
            f"WHERE least(s.ms // {HOUR_MS}, t.n_hours - 1) < em.n GROUP BY s.stay_id").fetchall()
        late_min = {int(s): int(h) for s, h, _ in late}
        n_late = sum(int(c) for _, _, c in late)
        con.execute(f"INSERT INTO {st.ROWS} SELECT stay_id, ms, vs, value, {int(step)} FROM {SCAN_TABLE}")
        new_stays = [int(r[0]) for r in con.execute(
            f"SELECT DISTINCT stay_id FROM {SCAN_TABLE} WHERE stay_id NOT IN (SELECT stay_id FROM cohort_stays)"
        ).fetchall()]
        con.execute(f"DROP TABLE {SCAN_TABLE}")
        if new_stays:
            con.execute("INSERT INTO cohort_stays SELECT stay_id, subject_id, hadm_id, intime, outtime, n_hours, "
                        f"'train' FROM {STAYS_TABLE} WHERE stay_id IN (SELECT unnest(?::BIGINT[]))", [new_stays])
            _update_splits(con, seed)
        emitted = dict(con.execute("SELECT stay_id, count(*) FROM vitals_hourly GROUP BY stay_id").fetchall())
        coh = np.asarray(sorted(int(r[0]) for r in con.execute("SELECT stay_id FROM cohort_stays").fetchall()),
                         np.int64)
        coh = coh[np.isin(coh, stays.ids)]
        ci = stays.index(coh)
        closed = closed_hours(w_new, stays.in_us[ci], stays.out_us[ci], stays.n_hours[ci])
        em = np.asarray([emitted.get(int(s), 0) for s in coh], np.int64)
        lm = np.asarray([late_min.get(int(s), 1 << 40) for s in coh], np.int64)
        aff = (closed > em) | (lm < em)
        todo = (coh[aff], np.minimum(em, lm)[aff], closed[aff], stays.subject[ci][aff], stays.n_hours[ci][aff])
        tot = {"new": 0, "replaced": 0, "reopened": 0}
        certs: list[dict] = []
        for lo in range(0, todo[0].size, CHUNK_STAYS):
            _recompute(con, keys, step, frozen, *(x[lo:lo + CHUNK_STAYS] for x in todo), tot, certs)
        st.set_state(con, "watermark_us", w_new)
        st.set_state(con, "step", step)
        stats = {"step": step, "file": None if fid is None else fid.name, "n_rows": n_rows, "n_usable": n_ok,
                 "late_rows": n_late, "reopened_hours": tot["reopened"], "new_tokens": tot["new"],
                 "replaced_tokens": tot["replaced"], "stays_entered": len(new_stays),
                 "stays_updated": int(todo[0].size),
                 "future_safe_all": all(c.get("future_safe", False) for c in certs if c.get("gated"))}
        _append_series(con, stats, w_new)
        if fid is not None:
            con.execute(f"INSERT INTO {st.FILES} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        [fid.name, fid.size, fid.sha256, step, n_rows, n_ok, n_late, w_new, _now()])
        con.execute("DELETE FROM build_info WHERE key = 'content_hash'")
        if set_hash:
            from cohort.build import content_hash

            con.execute("INSERT INTO build_info VALUES ('content_hash', ?)", [content_hash(con)])
        _kill_point(step, "before_commit")
        con.execute("COMMIT")
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            pass
        raise
    _kill_point(step, "after_commit")
    stats["seconds"] = time.perf_counter() - t0
    return stats


SERIES_KEY, SERIES_MAX = "step_series", 500


def _append_series(con, stats: dict, w_new) -> None:
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


def _recompute(con, keys, step, frozen, a_ids, a_r0, a_r1, a_subj, a_nh, tot, certs) -> None:
    """Rows, tokens and gates of hours [r0, r1) of a batch of stays (inside the step's transaction)."""
    from sv_core import StreamingGate

    mean = np.array([frozen[v]["mean"] for v in VITALS])
    sd = np.array([frozen[v]["sd"] for v in VITALS])
    med = np.array([frozen[v]["median"] for v in VITALS])
    C, sigma = float(st.get_state(con, "C")), float(st.get_state(con, "sigma"))
    _reg(con, "_ing_aff", pa.table({"stay_id": pa.array(a_ids), "lo_ms": pa.array(a_r0 * HOUR_MS),
                                    "r0": pa.array(a_r0.astype(np.int32)),
                                    "sidx": pa.array(np.arange(a_ids.size, dtype=np.int64))}))
    raw = con.execute(f"SELECT a.sidx, r.ms, r.vs, r.value FROM {st.ROWS} r JOIN _ing_aff a USING (stay_id) "
                      "WHERE r.ms >= a.lo_ms ORDER BY a.sidx, r.ms, r.vs, r.value").fetchnumpy()
    carry = np.broadcast_to(med, (a_ids.size, len(VITALS))).copy()
    cr = con.execute(f"SELECT a.sidx, {', '.join('v.' + v for v in VITALS)} FROM vitals_hourly v "
                     "JOIN _ing_aff a USING (stay_id) WHERE v.hour = a.r0 - 1").fetchnumpy()
    if len(cr["sidx"]):
        carry[np.asarray(cr["sidx"], np.int64)] = np.column_stack([cr[v] for v in VITALS])
    old = con.execute(f"SELECT a.sidx, v.hour, {', '.join('v.' + c for c in Z_COLS)} FROM vitals_hourly v "
                      "JOIN _ing_aff a USING (stay_id) WHERE v.hour >= a.r0 ORDER BY a.sidx, v.hour").fetchnumpy()
    rep, hour, filled, observed = causal_rows(raw["ms"], raw["vs"], raw["value"], raw["sidx"], a_nh, a_r0, a_r1, carry)
    del raw
    tab = out_table(a_ids[rep], hour, filled, observed, mean, sd)
    con.execute("DELETE FROM vitals_hourly WHERE EXISTS (SELECT 1 FROM _ing_aff a WHERE "
                "a.stay_id = vitals_hourly.stay_id AND vitals_hourly.hour >= a.r0)")
    _reg(con, "_ing_out", tab)
    con.execute("INSERT INTO vitals_hourly SELECT * FROM _ing_out")
    con.unregister("_ing_out")
    con.unregister("_ing_aff")
    zk = np.column_stack([tab.column(c).to_numpy() for c in Z_COLS])
    ev = tab.column("event_composite").to_numpy(zero_copy_only=False)
    o_s, o_h = np.asarray(old["sidx"], np.int64), np.asarray(old["hour"], np.int64)
    o_z = np.column_stack([old[c] for c in Z_COLS]) if o_s.size else np.zeros((0, len(VITALS)))
    bounds = np.searchsorted(rep, np.arange(a_ids.size + 1))
    obounds = np.searchsorted(o_s, np.arange(a_ids.size + 1))
    tokmap = st.load_tokens(con, a_ids)
    for i, s in enumerate(a_ids.tolist()):
        sl = slice(bounds[i], bounds[i + 1])
        oz = dict(zip(o_h[obounds[i]:obounds[i + 1]].tolist(), o_z[obounds[i]:obounds[i + 1]]))
        evs = {h: e for h, (_, e) in tokmap[s].items()}
        tk = {h: t for h, (t, _) in tokmap[s].items()}
        sg = st.load_gate(con, keys, s, int(a_subj[i]), tk) or StreamingGate(C, sigma)
        admit_h, admit_z, replace = [], [], []
        for h, zrow, e in zip(hour[sl].tolist(), zk[sl], ev[sl].tolist()):
            evs[h] = bool(e)
            if h in tk:  # a re-opened hour: keep its token when the key is unchanged
                tot["reopened"] += 1
                if h in oz and np.array_equal(oz[h], zrow):
                    continue
                replace.append(tk[h])
            admit_h.append(h)
            admit_z.append(zrow)
        if admit_h:  # corrected keys are admitted before the old ones are forgotten (feasibility)
            for h, t in zip(admit_h, sg.admit(np.asarray(admit_z)).tolist()):
                tk[h] = int(t)
        for t in replace:
            sg.forget(t)
        tot["new"] += len(admit_h) - len(replace)
        tot["replaced"] += len(replace)
        cert = sg.evict_reserve()
        cert = cert if cert.get("issued") else sg.certificate(exact=False)
        st.save_gate(con, keys, s, int(a_subj[i]), sg, tk, evs, step, cert)
        certs.append({"gated": cert.get("gated", sg.gated), "future_safe": cert.get("future_safe", False)})


# ------------------------------------------------------------------------ a run
def ingest(warehouse: str | os.PathLike, source: str, root: str | os.PathLike, *, init: bool = False,
           frozen: dict | None = None, min_hours: float = 48, seed: int = 0, as_of_us: int | None = None,
           final: bool = False, max_steps: int | None = None, ledger_dir=None, wait: float | None = None) -> dict:
    """Ingest every new part file (one committed watermark step each). ``init`` creates the
    streaming warehouse (frozen standardisation from ``frozen`` or from a causal batch build of
    the files present). ``as_of_us`` raises the watermark; ``final`` closes every hour up to each
    stay's outtime (the source is complete). Returns aggregates of the run."""
    from .warehouse import Warehouse

    t0 = time.perf_counter()
    root = Path(root)
    if source not in ("mimic", "clif"):
        raise IngestError(f"ingest source must be mimic or clif, got {source!r}")
    if not root.is_dir():
        raise IngestError(f"ingest root {root} is not a directory")
    p = Path(warehouse).resolve()
    with Warehouse.open(p, write=True, must_exist=not init, ledger_dir=ledger_dir, wait=wait) as w:
        if init:
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
        deletions = st.process_deletions(w, source, root, min_hours)
        con = w.connect()
        steps: list[dict] = []
        try:
            frozen_now = read_frozen(con)
            load_stays(con, source, root, min_hours, w.exclusion())
            stays = _Stays(con)
            seen = {r[0]: (int(r[1]), r[2])
                    for r in con.execute(f"SELECT name, size, sha256 FROM {st.FILES}").fetchall()}
            todo = []
            for f in measurement_files(source, root):
                fid = file_identity(root, f)
                if fid.name in seen:
                    if seen[fid.name] != (fid.size, fid.sha256):
                        raise SourceChangedError(f"source file {fid.name} changed after it was ingested "
                                                 "(append-only contract); nothing changed")
                    continue
                todo.append((f, fid))
            if max_steps is not None:
                todo = todo[:max_steps]
            step = int(st.get_state(con, "step") or 0)
            plan = todo if todo else ([(None, None)] if (final or as_of_us is not None) else [])
            for i, (f, fid) in enumerate(plan):
                step += 1
                last = i == len(plan) - 1
                steps.append(run_step(con, w.keys, stays, step, f, fid, source, root, as_of_us if last else None,
                                      final and last, frozen_now, seed, set_hash=last))
            summary = _summary(con)
        finally:
            con.close()
    return {"steps": steps, "deletions": deletions, "runtime_s": time.perf_counter() - t0, **summary}


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
