"""Build the hourly vital-sign warehouse (DuckDB) from MIMIC-IV, CLIF or MEDS source files.

Sources: MIMIC-IV native files, CLIF tables or a MEDS dataset (:mod:`cohort.meds`).

Command line::

    python -m cohort.build --source {mimic,clif,meds,demo} --root DIR --warehouse FILE \\
        [--min-hours 48] [--sample N --seed S | --all-stays] [--memory-limit 4GB] \\
        [--export-parquet DIR] [--convention {seed,mimic_code}] [--meds-codes FILE]

Pipeline (SPEC §2)
------------------
1. Stays: every ICU stay of the source → one subject per stay (a stay listed under two
   subjects is dropped, never assigned) → not forgotten (the forget registry, when given) →
   valid times (intime < outtime) → LOS ≥ min_hours → optional deterministic sample.
   n_hours = ⌈LOS / 1 h⌉.
2. One streamed DuckDB scan of chartevents / clif_vitals with the six vitals' itemids
   (categories) pushed into the scan (MIMIC: a join to a small itemid map, which DuckDB pushes
   into the Parquet reader), joined to the cohort's stays; each row leaves DuckDB as
   one packed BIGINT key and its value, in Arrow batches (no row-level Python).
   Temperature: itemid 223761 is °F; a Celsius-charted value above 50 is plainly °F; both are
   converted with (v − 32)·5/9. A null ``valuenum`` (text such as "Unable to assess" in
   ``value``) is not a measurement.
3. Filters, each counted in the funnel: numeric value; intime ≤ charttime ≤ outtime;
   plausible range (after unit conversion). Stays that never record a plausible vital are dropped.
   The usable rows are spooled to scratch files in buckets of contiguous stays
   (``batch_stays`` stays each), so every later step holds one bucket at a time: memory grows
   with the number of stays and hours, not with the number of chartevents rows.
4. Hourly mean, per bucket in NumPy (:mod:`cohort._hourly`): hour = ⌊(charttime − intime)/1 h⌋,
   capped at n_hours − 1 (a row exactly at outtime falls in the last hour). Rows with the same
   (stay, itemid kind, charttime to the ms) are averaged first, so a duplicated charting counts
   once; then the hourly mean per source; arterial and non-invasive BP in the same hour are
   averaged (mean of the two source means).
5. Splits by subject (train/val/test, :func:`cohort.selection.assign_splits`).
6. Per bucket: dense hours 0..n_hours−1, ``_observed`` flags, forward fill within stay → back
   fill → cohort median (median of the training split's observed hourly values, so no val/test
   value reaches training features), event labels on the filled values.
7. Standardisation (mean, sample sd; sd 0 → 1) on training-split rows only →
   ``standardisation``; ``<vital>_z = (value − mean)/sd``.

Scratch tables live in an in-memory DuckDB (spilling to disk past ``memory_limit``) and scratch
files in a ``.buckets`` folder beside the output (removed at the end); only the output tables
are written to the warehouse file, ``vitals_hourly`` in one streamed INSERT. The slow reference of all of this is
:func:`cohort.reference.reference_build`.

Memory: DuckDB holds at most ``memory_limit`` (default 4GB; past it, it spills to the owner-only
folder ``<warehouse>.building-<pid>.spill`` beside the warehouse, removed at the end); NumPy holds
one Arrow batch of the scan (2^20 rows) and one bucket (``batch_stays`` stays: their vital rows
and dense hours) at a time, so the build's peak RSS is about ``memory_limit`` + 0.5 GB whatever the
size of chartevents (the build's peak RSS per size is measured by :mod:`pipelines.bench_scale`;
docs/SCALE.md). The bucket spool is
owner-only too: both hold record-level values. ``BuildSummary.cpu_phases`` splits the build's
CPU seconds into stays, scan, hourly, write, hash and finish (the scale benchmark reports it).

The warehouse is written to a temporary file next to the target and swapped in on success;
a failed build leaves an existing warehouse untouched.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa

from ._hourly import (
    HOUR_MS,
    MAX_STAYS,
    MS_MASK,
    MS_SHIFT,
    SIDX_SHIFT,
    BucketSpool,
    Moments,
    events,
    fill_within_stays,
    hourly_means,
)
from .constants import (
    EVENT_COLUMNS,
    OBSERVED_COLUMNS,
    PLAINLY_FAHRENHEIT_ABOVE,
    PLAUSIBLE,
    VITAL_CODE,
    VITALS,
)
from .conventions import CONVENTIONS, SEED, get_convention
from .errors import BadParameterError, CohortError, EmptyCohortError, UnreadableInputError, format_funnel, redact
from .selection import assign_splits, sample_stays
from .sources import make_adapter

HOUR_US = 3_600_000_000
DERIVED_TABLES = ("cohort_stays", "vitals_hourly")
OUTPUT_TABLES = ("cohort_stays", "vitals_hourly", "standardisation", "cohort_funnel")


@dataclass
class BuildSummary:
    """What a build produced.

    funnel : list of (step, n_stays, n_rows) — n_rows is None for stay-only steps.
    content_hash : sha256 over the ordered contents of cohort_stays, vitals_hourly and
        standardisation (independent of DuckDB's storage layout).
    """

    warehouse: Path
    n_stays: int
    n_rows: int
    funnel: list[tuple[str, int, int | None]]
    content_hash: str
    source: str
    seconds: float = 0.0
    params: dict = field(default_factory=dict)
    cpu_seconds: float = 0.0  # user + system of this process (every thread) during the build
    cpu_phases: dict = field(default_factory=dict)  # the same, per phase (stays, scan, hourly, write, hash, finish)

    def to_json(self) -> dict:
        d = asdict(self)
        d["warehouse"] = str(self.warehouse)
        return d


def _parse_memory(limit: str) -> str:
    s = str(limit).strip().upper().replace(" ", "")
    num = s.rstrip("KMGTIB")
    try:
        float(num)
    except ValueError:
        raise BadParameterError(f"memory limit {limit!r} is not like '4GB' or '512MB'") from None
    return s


def value_sql(convention: str = SEED) -> str:
    """Converted value: °F itemid always; Celsius-charted temperature > 50 is plainly °F (seed;
    other conventions: :meth:`cohort.conventions.Convention.value_sql`)."""
    if convention != SEED:
        return get_convention(convention).value_sql()
    t = VITAL_CODE["temp_c"]
    return (
        f"CASE WHEN vital = {t} AND (unit_f OR value > {PLAINLY_FAHRENHEIT_ABOVE}) "
        "THEN (value - 32.0) * 5.0 / 9.0 ELSE value END"
    )


def plausible_case_sql(col: str = "value", code: str = "vs // 4", convention: str = SEED) -> str:
    """Plausible-range test as one CASE on the vital code (cheaper than an OR chain); other
    conventions: :meth:`cohort.conventions.Convention.plausible_case_sql` (may read ``unit_f``)."""
    if convention != SEED:
        return get_convention(convention).plausible_case_sql(col, code)
    whens = " ".join(f"WHEN {VITAL_CODE[v]} THEN {col} BETWEEN {lo} AND {hi}" for v, (lo, hi) in PLAUSIBLE.items())
    return f"(CASE {code} {whens} ELSE false END)"


def _connect(path: Path, memory_limit: str, threads: int | None) -> duckdb.DuckDBPyConnection:
    """Scratch work runs in an in-memory database (spilling to ``<path>.spill`` beyond the
    memory limit); the output file is attached as ``wh`` and receives only the final tables."""
    tmp = path.parent / (path.name + ".spill")
    os.mkdir(tmp, 0o700)  # owner-only before DuckDB spills a row into it (the caller removed any stale one)
    os.chmod(tmp, 0o700)
    con = duckdb.connect(":memory:")
    con.execute(f"SET memory_limit = '{_parse_memory(memory_limit)}'")
    con.execute("SET preserve_insertion_order = false")
    con.execute(f"SET temp_directory = '{tmp}'")
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    attach_private(con, path, "wh")
    return con


def attach_private(con: duckdb.DuckDBPyConnection, path: Path, alias: str) -> None:
    """ATTACH a new DuckDB file as ``alias``, owner-only from the start: the file is made 0600
    while it holds only DuckDB's header (no row yet), and its WAL is created 0600 before DuckDB
    writes any row to it (DuckDB keeps an existing WAL's mode)."""
    con.execute(f"ATTACH '{path}' AS {alias}")
    os.chmod(path, 0o600, follow_symlinks=False)
    wal = path.parent / (path.name + ".wal")
    try:
        os.close(os.open(wal, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    except FileExistsError:
        os.chmod(wal, 0o600, follow_symlinks=False)


def _rm(p: Path) -> None:
    """Remove a build's temporaries; a link in their place is removed itself, never followed."""
    import shutil
    import stat

    for q in (p, p.parent / (p.name + ".wal"), p.parent / (p.name + ".spill"), p.parent / (p.name + ".buckets")):
        try:
            mode = os.lstat(q).st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(mode):
            shutil.rmtree(q, ignore_errors=True)
        else:
            q.unlink()


class _TableHasher:
    """One sha256 per column of a table, fed Arrow record batches in the table's hash order."""

    def __init__(self, columns: list[str]):
        self.columns = list(columns)
        self.hashers = {c: hashlib.sha256() for c in self.columns}
        self.rows = 0

    def update(self, batch) -> None:
        self.rows += batch.num_rows
        for name, arr in zip(batch.schema.names, batch.columns):
            h = self.hashers.get(name)
            if h is None:
                continue
            if arr.type == "string" or str(arr.type) in ("string", "large_string"):
                h.update("\0".join("" if x is None else x for x in arr.to_pylist()).encode())
                h.update(b"\1")
            else:
                npv = arr.to_numpy(zero_copy_only=False)
                if npv.dtype == bool:
                    npv = npv.astype(np.uint8)
                if npv.dtype.kind == "f":
                    npv = np.round(np.nan_to_num(npv.astype(np.float64), nan=-1e300), 6) + 0.0
                h.update(np.ascontiguousarray(npv).tobytes())

    def combine(self, outer, table: str) -> None:
        outer.update(table.encode())
        for c in self.columns:
            outer.update(c.encode() + self.hashers[c].digest())


_HASH_ORDER = {"cohort_stays": "stay_id", "vitals_hourly": "stay_id, hour", "standardisation": "vital"}


def _scalar(con: duckdb.DuckDBPyConnection, sql: str) -> Any:
    """The single value of a one-row, one-column query (the result is fully fetched)."""
    rows = con.execute(sql).fetchall()
    return rows[0][0] if rows else None


def content_hash(con: duckdb.DuckDBPyConnection, schema: str = "", _precomputed: dict | None = None) -> str:
    """sha256 over the ordered contents of the output tables, one hasher per column.

    Timestamps hash as int64 microseconds, booleans as uint8, strings as UTF-8 with a NUL
    separator, floats rounded to 6 decimals (parallel aggregation may change the last bits of
    a mean); the ``_z`` columns are left out (they are a function of the raw column and the
    hashed ``standardisation``). The final digest combines the per-column digests in order.
    ``_precomputed`` (table → :class:`_TableHasher`) is the build's own hash of a table it
    has just written in hash order (``vitals_hourly``), so that table is not read back.
    """
    outer = hashlib.sha256()
    for table, order in _HASH_ORDER.items():
        cols = [r[0] for r in con.execute(f"DESCRIBE {schema}{table}").fetchall() if not r[0].endswith("_z")]
        th = (_precomputed or {}).get(table)
        if th is None or th.columns != cols or th.rows != _scalar(con, f"SELECT count(*) FROM {schema}{table}"):
            th = _TableHasher(cols)
            sel = ", ".join(
                f"epoch_us({c}) AS {c}" if c in ("intime", "outtime") else c for c in cols
            )
            for batch in con.sql(f"SELECT {sel} FROM {schema}{table} ORDER BY {order}").to_arrow_reader(1_000_000):
                th.update(batch)
        th.combine(outer, table)
    return outer.hexdigest()


class _Funnel:
    def __init__(self, con: duckdb.DuckDBPyConnection):
        self.rows: list[tuple[str, int, int | None]] = []
        self.con = con
        self.cpu_phases: dict[str, float] = {}
        self._t = time.process_time()

    def mark(self, phase: str) -> None:
        """Charge the process CPU seconds since the last mark to ``phase``."""
        t = time.process_time()
        self.cpu_phases[phase] = round(self.cpu_phases.get(phase, 0.0) + t - self._t, 3)
        self._t = t

    def add(self, step: str, n_stays: int, n_rows: int | None = None) -> None:
        self.rows.append((step, int(n_stays), None if n_rows is None else int(n_rows)))

    def require(self, n_stays: int, why: str) -> None:
        if n_stays == 0:
            raise EmptyCohortError(f"empty cohort after filters ({why})", self.rows)


def _scan(con, sql: str, files, what: str, stream: bool = False):
    """Run ``sql`` (or, with ``stream``, iterate its Arrow record batches), turning a read
    failure of the input files into :class:`UnreadableInputError`."""

    def wrap(exc):
        names = ", ".join(str(f) for f in files)
        return UnreadableInputError(
            f"reading {what} from {names} failed ({type(exc).__name__}: {redact(str(exc).splitlines()[0][:300])})"
        )

    readable = (duckdb.IOException, duckdb.InvalidInputException, duckdb.ConversionException)
    if not stream:
        try:
            return con.execute(sql)
        except readable as exc:
            if _is_storage_failure(exc):
                raise
            raise wrap(exc) from exc
    return _stream(con, sql, readable, wrap)


def _is_storage_failure(exc: BaseException) -> bool:
    """A full disk, an exhausted quota or a read-only file system while DuckDB writes (spill
    files): not a property of the input, so never reported as an unreadable input."""
    import errno

    return any(os.strerror(e) in str(exc) for e in (errno.ENOSPC, errno.EDQUOT, errno.EROFS))


def _stream(con, sql, readable, wrap, rows: int = 1 << 20):
    try:
        reader = con.sql(sql).to_arrow_reader(rows)
        yield from reader
    except readable as exc:
        if _is_storage_failure(exc):
            raise
        raise wrap(exc) from exc


def exclude_stays(con, table: str, exclude_subjects=None) -> tuple[int, int | None]:
    """Apply the id rules to the source's stay rows in ``table`` (``stay_id``, ``subject_id``, …)
    before any measurement is read, in this order:

    1. a stay listed under more than one subject is dropped, every row of it: the source cannot
       say whose it is, and assigning it to one of them could re-attach a forgotten patient's
       data to another id;
    2. with ``exclude_subjects``: every stay that any row lists under an excluded (forgotten)
       subject, and every stay the exclusion names by its own id (``exclude_subjects.stays``,
       when present: the forgotten stays), so a stay relabelled to another subject in a later
       source extract stays out too.

    Returns the number of rows left after 1 and after 2 (None without ``exclude_subjects``).
    Only counts leave this function."""
    con.execute(f"DELETE FROM {table} WHERE stay_id IN (SELECT stay_id FROM {table} WHERE subject_id IS NOT NULL "
                "GROUP BY stay_id HAVING count(DISTINCT subject_id) > 1)")
    n_one = int(con.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    if exclude_subjects is None:
        return n_one, None
    ids = np.asarray(con.execute(f"SELECT DISTINCT subject_id FROM {table} WHERE subject_id IS NOT NULL"
                                 ).fetchnumpy()["subject_id"], dtype=np.int64)
    mask = np.asarray(exclude_subjects(ids), dtype=bool)
    if mask.shape != ids.shape:
        raise BadParameterError("exclude_subjects must return one boolean per subject id")
    x_stays = np.zeros(0, dtype=np.int64)
    by_stay = getattr(exclude_subjects, "stays", None)
    if by_stay is not None:
        sids = np.asarray(con.execute(f"SELECT DISTINCT stay_id FROM {table} WHERE stay_id IS NOT NULL"
                                      ).fetchnumpy()["stay_id"], dtype=np.int64)
        smask = np.asarray(by_stay(sids), dtype=bool)
        if smask.shape != sids.shape:
            raise BadParameterError("exclude_subjects.stays must return one boolean per stay id")
        x_stays = sids[smask]
    if mask.any() or x_stays.size:
        con.register("_x_subjects", pa.table({"subject_id": pa.array(ids[mask], type=pa.int64())}))
        con.register("_x_stays", pa.table({"stay_id": pa.array(x_stays, type=pa.int64())}))
        con.execute(f"DELETE FROM {table} WHERE subject_id IN (SELECT subject_id FROM _x_subjects) "
                    f"OR stay_id IN (SELECT stay_id FROM _x_stays) "
                    f"OR stay_id IN (SELECT stay_id FROM {table} "
                    "WHERE subject_id IN (SELECT subject_id FROM _x_subjects))")
        con.unregister("_x_subjects")
        con.unregister("_x_stays")
    return n_one, int(con.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def check_frozen(frozen) -> dict[str, tuple[float, float, float]]:
    """Validate a frozen standardisation: vital -> ``{"mean", "sd", "median"}`` (or a 3-tuple)
    for every vital; returns vital -> (mean, sd, median) as floats."""
    if not isinstance(frozen, dict) or set(frozen) != set(VITALS):
        raise BadParameterError(f"a frozen standardisation needs exactly the vitals {list(VITALS)}")
    out = {}
    for v in VITALS:
        x = frozen[v]
        m, sd, med = (x["mean"], x["sd"], x["median"]) if isinstance(x, dict) else x
        m, sd, med = float(m), float(sd), float(med)
        if not (np.isfinite(m) and np.isfinite(sd) and np.isfinite(med)) or sd <= 0:
            raise BadParameterError(f"frozen standardisation of {v!r} must be finite with sd > 0")
        out[v] = (m, sd, med)
    return out


def _build_into(con, source: str, root: Path, min_hours: float, sample: int | None, seed: int,
                progress: bool, batch_stays: int, scratch: Path, exclude_subjects=None,
                fill: str = "backfill", frozen: dict | None = None,
                convention: str = SEED, meds_codes=None) -> tuple[_Funnel, dict]:
    adapter = make_adapter(source, root, con, convention, meds_codes)
    funnel = _Funnel(con)
    q = lambda sql: con.execute(sql).fetchone()  # noqa: E731

    # 1. stays ---------------------------------------------------------------------------
    _scan(con, f"CREATE TABLE _src_stays AS {adapter.stays_sql()}", [adapter.scan_files[0].parent], "ICU stays")
    funnel.add("icu_stays_in_source", q("SELECT count(*) FROM _src_stays")[0])
    n_one, n_kept = exclude_stays(con, "_src_stays", exclude_subjects)
    funnel.add("one_subject_per_stay", n_one)  # a stay listed under two subjects is nobody's: dropped
    if n_kept is not None:
        funnel.add("not_in_forget_registry", n_kept)
    con.execute(
        "CREATE TABLE _valid AS SELECT *, epoch_us(intime) AS in_us, epoch_us(outtime) AS out_us "
        "FROM _src_stays WHERE stay_id IS NOT NULL AND subject_id IS NOT NULL AND intime IS NOT NULL "
        "AND outtime IS NOT NULL AND outtime > intime "
        "QUALIFY row_number() OVER (PARTITION BY stay_id ORDER BY intime) = 1"
    )
    funnel.add("valid_times", q("SELECT count(*) FROM _valid")[0])
    min_us = int(round(min_hours * HOUR_US))
    con.execute(f"CREATE TABLE _long AS SELECT * FROM _valid WHERE out_us - in_us >= {min_us}")
    funnel.add(f"los_ge_{min_hours:g}h", q("SELECT count(*) FROM _long")[0])
    funnel.require(funnel.rows[-1][1], f"no stay with LOS ≥ {min_hours:g} h")
    if sample is not None:
        ids = np.array([r[0] for r in con.execute("SELECT stay_id FROM _long").fetchall()], dtype=np.int64)
        keep = pl.DataFrame({"stay_id": sample_stays(ids, sample, seed)})
        con.register("_keep_df", keep.to_arrow())
        con.execute("CREATE TABLE _cohort0 AS SELECT * FROM _long WHERE stay_id IN (SELECT stay_id FROM _keep_df)")
        con.unregister("_keep_df")
        funnel.add(f"sampled_{sample}_seed_{seed}", q("SELECT count(*) FROM _cohort0")[0])
    else:
        con.execute("CREATE TABLE _cohort0 AS SELECT * FROM _long")
    con.execute(
        f"ALTER TABLE _cohort0 ADD COLUMN n_hours INTEGER; "
        f"UPDATE _cohort0 SET n_hours = CAST(ceil((out_us - in_us) / {HOUR_US}.0) AS INTEGER)"
    )
    funnel.mark("stays")

    # 2+3. one streamed scan of the measurements ----------------------------------------
    # Each vital row becomes one packed BIGINT: usable rows (numeric, within the stay,
    # plausible) carry  stay_idx << 43 | ms since intime << 5 | vital·4+source  (≥ 0) and
    # their value; every other row carries ~(stay_idx·4 + status) (< 0), status 0 no number,
    # 1 outside the stay, 2 implausible. NumPy counts the funnel per stay and spools the
    # usable rows into buckets of contiguous stays (cohort._hourly), so no aggregation over
    # all rows ever has to fit in memory.
    n_cohort = q("SELECT count(*) FROM _cohort0")[0]
    if n_cohort >= MAX_STAYS:
        raise BadParameterError(f"{n_cohort} stays exceed the {MAX_STAYS - 1:,} a build can pack; use --sample")
    max_hours = q("SELECT coalesce(max(n_hours), 0) FROM _cohort0")[0]
    if max_hours * HOUR_MS > MS_MASK:
        raise BadParameterError(f"a stay of {max_hours} hours exceeds the {MS_MASK // HOUR_MS} hours a build can pack")
    con.execute("CREATE TABLE _sidx AS SELECT stay_id, "
                "CAST(row_number() OVER (ORDER BY stay_id) - 1 AS BIGINT) AS sidx, in_us, out_us, n_hours "
                "FROM _cohort0")
    sx = con.sql("SELECT stay_id, n_hours FROM _sidx ORDER BY sidx").fetchnumpy()
    stay_of_sidx = np.asarray(sx["stay_id"], dtype=np.int64)
    hours_of_sidx = np.asarray(sx["n_hours"], dtype=np.int64)
    spool = BucketSpool(scratch, n_cohort, max(1, min(256, -(-n_cohort // max(1, batch_stays)))))
    status = np.zeros(4 * n_cohort, dtype=np.int64)  # per stay: no number, outside, implausible, usable
    n_ok = np.zeros(n_cohort, dtype=np.int64)
    t = time.perf_counter()
    sql = f"""
        WITH m AS (
            SELECT c.sidx, CAST(m.vital * 4 + m.src AS BIGINT) AS vs, m.ts_us, c.in_us, m.unit_f,
                   {value_sql(convention)} AS value,
                   (m.ts_us >= c.in_us AND m.ts_us <= c.out_us) AS in_win
            FROM ({adapter.measurements_sql('_cohort0')}) AS m JOIN _sidx AS c USING (stay_id)),
        m2 AS (SELECT *, COALESCE(in_win AND {plausible_case_sql(convention=convention)}, false) AS ok FROM m)
        SELECT CASE WHEN ok THEN (sidx << {SIDX_SHIFT}) | (((ts_us - in_us) // 1000) << {MS_SHIFT}) | vs
                    ELSE -(sidx * 4 + (CASE WHEN value IS NULL THEN 0 WHEN NOT in_win THEN 1 ELSE 2 END)) - 1
               END AS k, value AS v
        FROM m2"""
    try:
        for batch in _scan(con, sql, adapter.scan_files, "vital-sign rows", stream=True):
            k = batch.column(0).to_numpy()
            bad = k < 0
            if bad.any():
                status += np.bincount(~k[bad], minlength=status.size)
                keep = ~bad
                k, v = k[keep], batch.column(1).to_numpy(zero_copy_only=False)[keep]
            else:
                v = batch.column(1).to_numpy(zero_copy_only=False)
            n_ok += np.bincount(k >> SIDX_SHIFT, minlength=n_cohort)
            spool.add(k, v)
    finally:
        spool.close()
    if progress:
        print(f"[cohort] scanned vitals in {time.perf_counter() - t:.1f}s", file=sys.stderr)
    funnel.mark("scan")
    st = status.reshape(n_cohort, 4)
    st[:, 3] = n_ok
    per_stay = {"n_all": st.sum(1), "n_num": st[:, 1:].sum(1), "n_win": st[:, 2:].sum(1), "n_ok": st[:, 3]}
    for step, col in (("vital_rows", "n_all"), ("numeric_value", "n_num"),
                      ("charttime_within_stay", "n_win"), ("plausible_range", "n_ok")):
        funnel.add(step, int((per_stay[col] > 0).sum()), int(per_stay[col].sum()))

    # 5. final cohort + splits ------------------------------------------------------------
    final = per_stay["n_ok"] > 0
    con.register("_final_ids", pa.table({"stay_id": stay_of_sidx[final]}))
    con.execute(
        "CREATE TABLE _final AS SELECT c.stay_id, c.subject_id, c.hadm_id, c.intime, c.outtime, c.n_hours "
        "FROM _cohort0 AS c WHERE c.stay_id IN (SELECT stay_id FROM _final_ids)"
    )
    con.unregister("_final_ids")
    n_final, n_tok = q("SELECT count(*), coalesce(sum(n_hours), 0) FROM _final")
    funnel.add("stays_with_a_vital", n_final, n_tok)
    funnel.require(n_final, "no stay records a plausible vital sign")
    subj = np.array([r[0] for r in con.execute("SELECT DISTINCT subject_id FROM _final").fetchall()], dtype=np.int64)
    splits = assign_splits(subj, seed)
    con.register("_split_df", pl.DataFrame({"subject_id": list(splits), "split": list(splits.values())},
                                           schema={"subject_id": pl.Int64, "split": pl.Utf8}).to_arrow())
    con.execute(
        "CREATE TABLE cohort_stays (stay_id BIGINT PRIMARY KEY, subject_id BIGINT NOT NULL, hadm_id BIGINT, "
        "intime TIMESTAMP NOT NULL, outtime TIMESTAMP NOT NULL, n_hours INTEGER NOT NULL, split VARCHAR NOT NULL)"
    )
    con.execute(
        "INSERT INTO cohort_stays SELECT f.stay_id, f.subject_id, f.hadm_id, f.intime, f.outtime, f.n_hours, s.split "
        "FROM _final f JOIN _split_df s USING (subject_id) ORDER BY f.stay_id"
    )
    con.unregister("_split_df")
    tr = con.sql("SELECT s.sidx FROM cohort_stays c JOIN _sidx s USING (stay_id) WHERE c.split = 'train'").fetchnumpy()
    train = np.zeros(n_cohort, dtype=bool)
    train[np.asarray(tr["sidx"], dtype=np.int64)] = True

    # 4+6a. per bucket: hourly means, dense grid, fill within stay; training-split moments and
    # observed values (for the medians) are gathered on the way. Grid rows: final stays in
    # stay_id order, hours 0..n_hours−1.
    nv = len(VITALS)
    grid_hours = np.where(final, hours_of_sidx, 0)
    grid_start = np.cumsum(grid_hours) - grid_hours  # grid offset of each stay index
    moments = Moments(nv)
    n_unfilled = np.zeros(nv)
    med_files = {(j, part): scratch / f"median_{j}_{part}.f8" for j in range(nv) for part in ("train", "other")}
    med_fh = {key: open(p, "ab") for key, p in med_files.items()}

    def one_bucket(b: int):
        """Hourly means and the within-stay fill of bucket ``b`` (saved to scratch); returns the
        observed values per vital (training split, others) and the training rows' moments."""
        lo, hi = spool.stay_range(b)
        k, v = spool.read(b)
        o_sidx, o_hour, o_val = hourly_means(k, v, hours_of_sidx)
        del k, v
        is_tr = train[o_sidx]
        values = []
        for j in range(nv):
            col = o_val[:, j]
            has = ~np.isnan(col)
            values.append((col[has & is_tr], col[has & ~is_tr]))
        filled, observed = fill_within_stays(grid_start[o_sidx] - int(grid_start[lo]) + o_hour, o_val,
                                             grid_hours[lo:hi], fill=fill)
        np.save(scratch / f"filled_{b:05d}.npy", filled)
        np.save(scratch / f"observed_{b:05d}.npy", observed)
        row_train = np.repeat(train[lo:hi], grid_hours[lo:hi])
        groups = []
        for j in range(nv):
            x = filled[row_train, j]
            miss = np.isnan(x)
            groups.append((int(miss.sum()), *Moments.group(x[~miss])))
        return values, groups

    buckets = range(spool.n_buckets)
    if progress and spool.n_buckets > 1:
        from tqdm import tqdm

        buckets = tqdm(buckets, desc="[cohort] hourly", unit="bucket", file=sys.stderr)
    try:
        for b in buckets:
            values, groups = one_bucket(b)
            for j in range(nv):
                values[j][0].tofile(med_fh[(j, "train")])
                values[j][1].tofile(med_fh[(j, "other")])
                n_miss, n, mu, m2 = groups[j]
                n_unfilled[j] += n_miss
                moments.add_group(j, n, mu, m2)
    finally:
        for fh in med_fh.values():
            fh.close()

    # 6b. medians of the training split's observed hourly values (all stays if none) --------
    medians = np.empty(nv)
    for j, v in enumerate(VITALS):
        vals = np.fromfile(med_files[(j, "train")])
        if vals.size == 0:
            vals = np.fromfile(med_files[(j, "other")])
        if frozen is not None:
            medians[j] = frozen[v][2]
        elif vals.size == 0:
            raise EmptyCohortError(f"vital {v!r} is never observed in the cohort; cannot impute", funnel.rows)
        else:
            medians[j] = float(np.median(vals))
        del vals
        for part in ("train", "other"):
            med_files[(j, part)].unlink()

    funnel.mark("hourly")

    # 7. standardisation on the training split only (the never-recorded vitals of a training
    # stay take the median), then the output rows bucket by bucket ---------------------------
    # causal / frozen builds also record the medians (the frozen table of a streaming warehouse)
    with_median = fill == "causal" or frozen is not None
    std_ddl = ("standardisation (vital VARCHAR PRIMARY KEY, mean DOUBLE NOT NULL, sd DOUBLE NOT NULL"
               + (", median DOUBLE NOT NULL)" if with_median else ")"))
    con.execute("CREATE TABLE " + std_ddl)
    stats = {}
    for j, v in enumerate(VITALS):
        if frozen is not None:  # supplied: never recomputed
            stats[v] = (frozen[v][0], frozen[v][1])
        else:
            moments.add_group(j, n_unfilled[j], medians[j], 0.0)
            if moments.n[j] == 0:
                raise EmptyCohortError("no training-split hour to standardise on", funnel.rows)
            sd = moments.sd(j)
            sd = 1.0 if sd is None or not np.isfinite(sd) or sd <= 0 else sd
            stats[v] = (float(moments.mean[j]), sd)
        con.execute(f"INSERT INTO standardisation VALUES (?, ?, ?{', ?' if with_median else ''})",
                    [v, stats[v][0], stats[v][1]] + ([float(medians[j])] if with_median else []))
    schema = pa.schema(
        [("stay_id", pa.int64()), ("hour", pa.int32())] + [(v, pa.float64()) for v in VITALS]
        + [(c, pa.bool_()) for c in OBSERVED_COLUMNS] + [(f"{v}_z", pa.float64()) for v in VITALS]
        + [(c, pa.bool_()) for c in EVENT_COLUMNS]
    )
    types = {pa.int64(): "BIGINT", pa.int32(): "INTEGER", pa.float64(): "DOUBLE", pa.bool_(): "BOOLEAN"}
    con.execute("CREATE TABLE wh.vitals_hourly (" + ", ".join(f"{f.name} {types[f.type]}" for f in schema) + ")")
    mean_row = np.array([stats[v][0] for v in VITALS])
    sd_row = np.array([stats[v][1] for v in VITALS])
    buckets = range(spool.n_buckets)
    if progress and spool.n_buckets > 1:
        from tqdm import tqdm

        buckets = tqdm(buckets, desc="[cohort] write", unit="bucket", file=sys.stderr)

    out_hash = _TableHasher([f.name for f in schema if not f.name.endswith("_z")])

    def out_batches():
        for b in buckets:
            lo, hi = spool.stay_range(b)
            filled = np.load(scratch / f"filled_{b:05d}.npy")
            observed = np.load(scratch / f"observed_{b:05d}.npy")
            (scratch / f"filled_{b:05d}.npy").unlink()
            (scratch / f"observed_{b:05d}.npy").unlink()
            if filled.shape[0] == 0:
                continue
            np.copyto(filled, np.broadcast_to(medians, filled.shape), where=np.isnan(filled))
            z = (filled - mean_row) / sd_row
            gh = grid_hours[lo:hi]
            ends = np.cumsum(gh)
            cols = ([np.repeat(stay_of_sidx[lo:hi], gh),
                     (np.arange(ends[-1], dtype=np.int64) - np.repeat(ends - gh, gh)).astype(np.int32)]
                    + [filled[:, j] for j in range(nv)] + [observed[:, j] for j in range(nv)]
                    + [z[:, j] for j in range(nv)] + list(events(filled)))
            batch = pa.RecordBatch.from_arrays([pa.array(c) for c in cols], schema=schema)
            out_hash.update(batch)  # rows leave in (stay_id, hour) order: the hash order
            yield batch

    # one INSERT from a stream of record batches: one transaction, so DuckDB writes
    # compressed row groups straight to the file instead of logging every bucket to the WAL
    con.register("_out_rows", pa.RecordBatchReader.from_batches(schema, out_batches()))
    con.execute("INSERT INTO wh.vitals_hourly SELECT * FROM _out_rows")
    con.unregister("_out_rows")
    con.execute("CREATE INDEX vitals_hourly_stay ON wh.vitals_hourly (stay_id)")
    funnel.add("hourly_tokens", n_final, int(grid_hours.sum()))
    con.execute("CREATE TABLE wh.cohort_funnel (step VARCHAR, n_stays BIGINT, n_rows BIGINT, ord INTEGER)")
    for i, (step, ns, nr) in enumerate(funnel.rows):
        con.execute("INSERT INTO wh.cohort_funnel VALUES (?, ?, ?, ?)", [step, ns, nr, i])
    con.execute(
        "CREATE TABLE wh.cohort_stays (stay_id BIGINT PRIMARY KEY, subject_id BIGINT NOT NULL, hadm_id BIGINT, "
        "intime TIMESTAMP NOT NULL, outtime TIMESTAMP NOT NULL, n_hours INTEGER NOT NULL, split VARCHAR NOT NULL)")
    con.execute("INSERT INTO wh.cohort_stays SELECT * FROM cohort_stays ORDER BY stay_id")
    con.execute("CREATE TABLE wh." + std_ddl)
    con.execute("INSERT INTO wh.standardisation SELECT * FROM standardisation")
    for tname in ("_src_stays", "_valid", "_long", "_cohort0", "_sidx", "_final", "cohort_stays", "standardisation"):
        con.execute(f"DROP TABLE IF EXISTS {tname}")
    funnel.mark("write")
    return funnel, {"vitals_hourly": out_hash}


def build_warehouse(source: str, root: str | Path | None, warehouse: str | Path = "warehouse.duckdb",
                    min_hours: float = 48, sample: int | None = None, seed: int = 0,
                    memory_limit: str = "4GB", progress: bool = True, threads: int | None = None,
                    export_parquet: str | Path | None = None, batch_stays: int = 1000,
                    exclude_subjects=None, fill: str = "backfill", frozen: dict | None = None,
                    convention: str = SEED, meds_codes=None) -> BuildSummary:
    """Build the warehouse and return a :class:`BuildSummary`.

    Parameters
    ----------
    source : {"mimic", "clif", "meds", "demo"}
        ``demo`` = the CLIF adapter on the real MIMIC-IV demo cache (see :mod:`cohort.demo_data`);
        ``root`` may then be None (default cache). ``meds``: a MEDS v0.4 dataset (:mod:`cohort.meds`).
    root : path of the source files.
    warehouse : output DuckDB file; replaced atomically on success only.
    min_hours : minimum LOS in hours (default 48).
    sample : keep a deterministic sample of this many eligible stays (None: all stays).
    seed : seed of the sample and of the subject split.
    memory_limit : DuckDB memory limit, e.g. "4GB".
    export_parquet : optional folder that receives one Parquet file per output table.
    threads : DuckDB threads (default: DuckDB's choice, all cores).
    batch_stays : stays per scratch bucket (at most 256 buckets); a bucket's rows are what the
        hourly step holds in memory at once.
    exclude_subjects : optional ``f(subject_ids: int64 array) -> bool array`` naming subjects that
        must never enter the warehouse (the forget registry, :meth:`pipelines.warehouse.Warehouse.exclusion`);
        if it also has a method ``stays(stay_ids) -> bool array``, the stays it names are excluded
        too, whichever subject the source lists them under. Applied to the source's stays before
        any measurement is scanned (:func:`exclude_stays`). The funnel gains the step
        ``not_in_forget_registry`` (a count only). Independently of it, a stay the source lists
        under more than one subject is dropped (step ``one_subject_per_stay``).
    fill : "backfill" (default: forward fill, back fill, cohort median) or "causal" (forward
        fill within the stay, the cohort median for leading gaps; no value from the future).
    frozen : optional frozen standardisation, vital -> {"mean", "sd", "median"} (see
        :func:`check_frozen`; e.g. a streaming warehouse's): used instead of the training-split
        moments and medians, never recomputed. Causal and frozen builds add a ``median`` column
        to ``standardisation``.
    convention : vital-sign convention, "seed" (default: the seed's itemids and ranges) or
        "mimic_code" (mimic-code's ``vitalsign`` itemids and limits); see :mod:`cohort.conventions`
        and docs/VITALS.md. A non-default convention is recorded in ``build_info`` params.
    meds_codes : source ``meds`` only: the MEDS code -> vital map, a JSON file path or dict
        (:func:`cohort.meds.load_code_map`; None: :func:`cohort.meds.default_code_map`, the
        MIMIC_IV_MEDS chartevents codes of the convention's itemids and this project's export
        codes). A custom map's digest is recorded in ``build_info`` params.
    """
    t0, c0 = time.perf_counter(), time.process_time()
    if min_hours < 0:
        raise BadParameterError(f"min_hours must be ≥ 0, got {min_hours}")
    if sample is not None and sample < 1:
        raise BadParameterError(f"sample must be ≥ 1, got {sample}")
    if fill not in ("backfill", "causal"):
        raise BadParameterError(f"fill must be 'backfill' or 'causal', got {fill!r}")
    frozen = None if frozen is None else check_frozen(frozen)
    convention = get_convention(convention).name
    if source == "demo":
        from .demo_data import ensure_demo

        root = ensure_demo(root)
        adapter_source = "clif"
    elif source in ("mimic", "clif", "meds"):
        if root is None:
            raise BadParameterError(f"--root is required for source {source!r}")
        adapter_source = source
    else:
        raise BadParameterError(f"unknown source {source!r}; expected one of mimic, clif, meds, demo")
    if meds_codes is not None:
        if source != "meds":
            raise BadParameterError("meds_codes (--meds-codes) applies only to --source meds")
        from .meds import load_code_map

        meds_codes = load_code_map(meds_codes, convention)  # checked before any file is written
    _parse_memory(memory_limit)
    if os.path.islink(warehouse):  # os.replace below would replace the link's target
        raise BadParameterError(f"warehouse {warehouse} is a symbolic link; the build replaces the warehouse file and "
                                "never writes through a link: give the real path")
    warehouse = Path(warehouse).resolve()
    warehouse.parent.mkdir(parents=True, exist_ok=True)
    tmp = warehouse.parent / f".{warehouse.name}.building-{os.getpid()}"
    _rm(tmp)
    try:
        con = _connect(tmp, memory_limit, threads)
    except BaseException:
        _rm(tmp)  # e.g. a full disk while creating the file: no temporary left behind
        raise
    try:
        funnel, hashed = _build_into(con, adapter_source, Path(root), min_hours, sample, seed, progress, batch_stays,
                                     tmp.parent / (tmp.name + ".buckets"), exclude_subjects, fill, frozen,
                                     convention=convention, meds_codes=meds_codes)
        h = content_hash(con, "wh.", _precomputed=hashed)
        funnel.mark("hash")
        params = {"source": source, "min_hours": min_hours, "sample": sample, "seed": seed}
        if fill != "backfill":
            params["fill"] = fill
        if frozen is not None:
            params["frozen_standardisation"] = True
        if convention != SEED:
            params["convention"] = convention
        if meds_codes is not None:
            params["meds_codes"] = meds_codes.digest()
        con.execute("CREATE TABLE wh.build_info (key VARCHAR PRIMARY KEY, value VARCHAR)")
        info = {"content_hash": h, "params": json.dumps(params), "duckdb": duckdb.__version__,
                "built_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        for k, v in info.items():
            con.execute("INSERT INTO wh.build_info VALUES (?, ?)", [k, v])
        counts = con.execute("SELECT (SELECT count(*) FROM wh.cohort_stays), "
                             "(SELECT count(*) FROM wh.vitals_hourly)").fetchone()
        assert counts is not None  # a scalar subquery row always exists
        n_stays, n_rows = counts
        if export_parquet is not None:
            out = Path(export_parquet)
            out.mkdir(parents=True, exist_ok=True)
            for tname in OUTPUT_TABLES:
                order = " ORDER BY ord" if tname == "cohort_funnel" else ""
                target = out / (tname + ".parquet")
                con.execute(f"COPY (SELECT * FROM wh.{tname}{order}) TO '{target}' (FORMAT parquet)")
        con.execute("CHECKPOINT wh")
        con.execute("DETACH wh")
        con.close()
        funnel.mark("finish")
    except BaseException:
        try:
            con.close()
        finally:
            _rm(tmp)
        raise
    _rm(warehouse.parent / (warehouse.name + ".wal"))
    os.replace(tmp, warehouse)
    _rm(tmp)
    summary = BuildSummary(warehouse=warehouse, n_stays=int(n_stays), n_rows=int(n_rows), funnel=funnel.rows,
                           content_hash=h, source=source, seconds=time.perf_counter() - t0, params=params,
                           cpu_seconds=time.process_time() - c0, cpu_phases=funnel.cpu_phases)
    if progress:
        print(format_funnel(funnel.rows), file=sys.stderr)
    return summary


def read_funnel(con_or_path) -> list[tuple[str, int, int | None]]:
    """The stored funnel of a warehouse, in build order."""
    from .streams import warehouse_connection

    with warehouse_connection(con_or_path) as con:
        return [(s, int(a), None if b is None else int(b))
                for s, a, b in con.execute("SELECT step, n_stays, n_rows FROM cohort_funnel ORDER BY ord").fetchall()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cohort.build", description=__doc__.split("\n")[0])
    p.add_argument("--source", required=True, choices=["mimic", "clif", "meds", "demo"])
    p.add_argument("--root", default=None, help="source folder (demo: the cache folder; default cache if omitted)")
    p.add_argument("--warehouse", default="warehouse.duckdb")
    p.add_argument("--min-hours", type=float, default=48)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--sample", type=int, default=None, help="deterministic sample of N eligible stays")
    g.add_argument("--all-stays", action="store_true", help="keep every eligible stay (default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--memory-limit", default="4GB")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--export-parquet", default=None, help="folder for one Parquet file per output table")
    p.add_argument("--convention", choices=list(CONVENTIONS), default=SEED,
                   help="vital-sign itemids and ranges: seed (default) or mimic_code (docs/VITALS.md)")
    p.add_argument("--meds-codes", default=None, metavar="FILE",
                   help="meds: JSON code -> vital map (default: MIMIC_IV_MEDS chartevents codes; cohort.meds)")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    try:
        s = build_warehouse(a.source, a.root, a.warehouse, min_hours=a.min_hours,
                            sample=None if a.all_stays else a.sample, seed=a.seed,
                            memory_limit=a.memory_limit, progress=not a.quiet, threads=a.threads,
                            export_parquet=a.export_parquet, convention=a.convention, meds_codes=a.meds_codes)
    except CohortError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if a.quiet:
        print(format_funnel(s.funnel))
    print(json.dumps({"warehouse": str(s.warehouse), "n_stays": s.n_stays, "n_rows": s.n_rows,
                      "content_hash": s.content_hash, "seconds": round(s.seconds, 2)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
