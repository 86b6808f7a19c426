"""Build stages 1–3: the stays, then one streamed scan of the measurements (:mod:`cohort.build`).

:func:`select_stays` writes the in-memory table ``_cohort0`` (the eligible stays, with
``n_hours``); :func:`scan_vitals` streams the source's vital-sign rows of those stays through
DuckDB once, counts the funnel per stay and spools the usable rows into buckets of contiguous
stays (:class:`cohort._hourly.BucketSpool`). The SQL pieces (:func:`value_sql`,
:func:`plausible_case_sql`) and the id rules (:func:`exclude_stays`) are shared with the
incremental ingest (:mod:`cohort.incremental`).
"""
from __future__ import annotations

import errno
import functools
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa

from cohort._hourly import HOUR_MS, MAX_STAYS, MS_MASK, MS_SHIFT, SIDX_SHIFT, BucketSpool
from cohort.constants import PLAINLY_FAHRENHEIT_ABOVE, PLAUSIBLE, VITAL_CODE
from cohort.conventions import SEED, Convention, get_convention
from cohort.errors import BadParameterError, EmptyCohortError, UnreadableInputError, redact
from cohort.meds import MedsAdapter
from cohort.selection import sample_stays
from cohort.sources import Adapter, ClifAdapter, MimicNativeAdapter

HOUR_US = 3_600_000_000


def one_row(con: duckdb.DuckDBPyConnection, sql: str) -> tuple:
    """The one row of an aggregate query (``SELECT count(*) …``: always a row)."""
    row = con.execute(sql).fetchone()
    assert row is not None  # an aggregate without GROUP BY returns one row
    return row


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



class Funnel:
    """The build's funnel rows (step, n_stays, n_rows) and its CPU seconds per phase."""

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



def scan(con, sql: str, files, what: str, stream: bool = False):
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
            if is_storage_failure(exc):
                raise
            raise wrap(exc) from exc
    return _stream(con, sql, readable, wrap)


def _stream(con, sql, readable, wrap, rows: int = 1 << 20):
    try:
        reader = con.sql(sql).to_arrow_reader(rows)
        yield from reader
    except readable as exc:
        if is_storage_failure(exc):
            raise
        raise wrap(exc) from exc



def is_storage_failure(exc: BaseException) -> bool:
    """A full disk, an exhausted quota or a read-only file system while DuckDB writes (spill
    files): not a property of the input, so never reported as an unreadable input."""
    return any(os.strerror(e) in str(exc) for e in (errno.ENOSPC, errno.EDQUOT, errno.EROFS))


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



def make_adapter(source: str, root: str | Path, con: duckdb.DuckDBPyConnection,
                 convention: str | Convention = SEED, meds_codes=None) -> Adapter:
    """Adapter for ``source`` in {"mimic", "clif", "meds"} (``demo`` is resolved by the caller),
    reading the itemids / categories of ``convention`` (:mod:`cohort.conventions`); ``meds_codes``
    is the MEDS code map (:func:`cohort.meds.load_code_map`; None: the default)."""
    if source == "mimic":
        return MimicNativeAdapter(root, con, convention)
    if source == "clif":
        return ClifAdapter(root, con, convention)
    if source == "meds":
        return MedsAdapter(root, con, convention, meds_codes)
    raise BadParameterError(f"unknown source {source!r}; expected one of mimic, clif, meds, demo")


def select_stays(con: duckdb.DuckDBPyConnection, adapter, funnel: Funnel, min_hours: float, sample: int | None,
                 seed: int, exclude_subjects=None) -> None:
    """Stage 1: the eligible stays.

    Reads the source's ICU stays (``adapter.stays_sql()``) into ``_src_stays``; applies the id
    rules (:func:`exclude_stays`); keeps stays with valid times (one row per stay, the earliest
    ``intime``) and LOS ≥ ``min_hours``; optionally a deterministic sample of ``sample`` stays
    (:func:`cohort.selection.sample_stays` with ``seed``). Writes ``_cohort0``: one row per
    stay, the source's stay columns plus ``in_us``/``out_us`` (int64 µs since the epoch) and
    ``n_hours = ⌈LOS / 1 h⌉``. Each step adds its stay count to ``funnel``; an empty cohort
    after the LOS filter raises :class:`cohort.errors.EmptyCohortError`.
    """
    q = functools.partial(one_row, con)
    scan(con, f"CREATE TABLE _src_stays AS {adapter.stays_sql()}", [adapter.scan_files[0].parent], "ICU stays")
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


@dataclass
class ScannedVitals:
    """What the scan leaves for the later stages (``n`` = stays of ``_cohort0``).

    spool : the usable rows, in buckets of contiguous stay indices (closed, readable).
    stay_of_sidx : (n,) int64, stay_id of each stay index (stay_id order).
    hours_of_sidx : (n,) int64, n_hours of each stay index.
    per_stay : name -> (n,) int64 row counts: ``n_all`` (vital rows), ``n_num`` (with a
        number), ``n_win`` (and within the stay), ``n_ok`` (and plausible: the usable rows).
    """

    spool: BucketSpool
    stay_of_sidx: np.ndarray
    hours_of_sidx: np.ndarray
    per_stay: dict


def scan_vitals(con: duckdb.DuckDBPyConnection, adapter, funnel: Funnel, scratch: Path, batch_stays: int,
                convention: str = SEED, progress: bool = False) -> ScannedVitals:
    """Stages 2–3: one streamed scan of the vital-sign rows of the stays in ``_cohort0``.

    Writes ``_sidx`` (stay_id → stay index ``sidx`` in stay_id order, ``in_us``, ``out_us``,
    ``n_hours``). Each vital row leaves DuckDB as one packed BIGINT and its converted value
    (:func:`value_sql`): a usable row (numeric, within the stay, plausible) carries
    ``sidx << 43 | ms since intime << 5 | vital·4+source`` (≥ 0); every other row carries
    ``~(sidx·4 + status)`` (< 0), status 0 no number, 1 outside the stay, 2 implausible. NumPy
    counts the funnel per stay and spools the usable rows into at most 256 buckets of
    ``batch_stays`` contiguous stays under ``scratch``, so no aggregation over all rows ever
    has to fit in memory. Adds the funnel steps ``vital_rows``, ``numeric_value``,
    ``charttime_within_stay`` and ``plausible_range`` (stays with ≥ 1 such row, and rows).
    """
    q = functools.partial(one_row, con)
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
        for batch in scan(con, sql, adapter.scan_files, "vital-sign rows", stream=True):
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
    return ScannedVitals(spool, stay_of_sidx, hours_of_sidx, per_stay)
