"""Build the hourly vital-sign warehouse (DuckDB) from MIMIC-IV native files or CLIF tables.

Command line::

    python -m cohort.build --source {mimic,clif,demo} --root DIR --warehouse FILE \\
        [--min-hours 48] [--sample N --seed S | --all-stays] [--memory-limit 4GB] \\
        [--export-parquet DIR]

Pipeline (SPEC §2)
------------------
1. Stays: every ICU stay of the source → valid times (intime < outtime) → LOS ≥ min_hours
   → optional deterministic sample. n_hours = ⌈LOS / 1 h⌉.
2. One DuckDB scan of chartevents / clif_vitals with the six vitals' itemids (categories)
   pushed into the scan, joined to the cohort's stays (nothing row-level is loaded into Python).
   Temperature: itemid 223761 is °F; a Celsius-charted value above 50 is plainly °F; both are
   converted with (v − 32)·5/9. A null ``valuenum`` (text such as "Unable to assess" in
   ``value``) is not a measurement.
3. Filters, each counted in the funnel: numeric value; intime ≤ charttime ≤ outtime;
   plausible range (after unit conversion). Stays that never record a plausible vital are dropped.
4. Hourly mean: hour = ⌊(charttime − intime)/1 h⌋, capped at n_hours − 1 (a row exactly at
   outtime falls in the last hour). Rows with the same (stay, itemid kind, charttime) are
   averaged first, so a duplicated charting counts once; then the hourly mean per source;
   arterial and non-invasive BP in the same hour are averaged (mean of the two source means).
   This runs in the same aggregation as the scan, on one packed BIGINT key per row.
5. Splits by subject (train/val/test, :func:`cohort.selection.assign_splits`).
6. Polars, in batches of stays (:func:`cohort.fill.fill_batch`): dense hours 0..n_hours−1,
   ``_observed`` flags, forward fill within stay → back fill → cohort median (median of the
   training split's observed hourly values, so no val/test value reaches training features),
   event labels on the filled values.
7. Standardisation (mean, sample sd; sd 0 → 1) on training-split rows only →
   ``standardisation``; ``<vital>_z = (value − mean)/sd``.

Scratch tables live in an in-memory DuckDB (spilling to disk past ``memory_limit``); only the
output tables are written to the warehouse file. The slow reference of all of this is
:func:`cohort.reference.reference_build`.

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

import duckdb
import numpy as np
import polars as pl

from .constants import (
    EVENT_COLUMNS, ITEMIDS, OBSERVED_COLUMNS, PLAINLY_FAHRENHEIT_ABOVE, PLAUSIBLE,
    VITAL_CODE, VITALS,
)
from .errors import BadParameterError, CohortError, EmptyCohortError, UnreadableInputError, format_funnel
from .fill import fill_batch
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


def _value_sql() -> str:
    """Converted value: °F itemid always; Celsius-charted temperature > 50 is plainly °F."""
    t = VITAL_CODE["temp_c"]
    return (
        f"CASE WHEN vital = {t} AND (unit_f OR value > {PLAINLY_FAHRENHEIT_ABOVE}) "
        "THEN (value - 32.0) * 5.0 / 9.0 ELSE value END"
    )


def _plausible_sql(col: str = "value") -> str:
    return "(" + " OR ".join(
        f"(vital = {VITAL_CODE[v]} AND {col} BETWEEN {lo} AND {hi})" for v, (lo, hi) in PLAUSIBLE.items()
    ) + ")"


def _plausible_case_sql(col: str = "value", code: str = "vs // 4") -> str:
    """Plausible-range test as one CASE on the vital code (cheaper than an OR chain)."""
    whens = " ".join(f"WHEN {VITAL_CODE[v]} THEN {col} BETWEEN {lo} AND {hi}" for v, (lo, hi) in PLAUSIBLE.items())
    return f"(CASE {code} {whens} ELSE false END)"


def _connect(path: Path, memory_limit: str, threads: int | None) -> duckdb.DuckDBPyConnection:
    """Scratch work runs in an in-memory database (spilling to ``<path>.spill`` beyond the
    memory limit); the output file is attached as ``wh`` and receives only the final tables."""
    con = duckdb.connect(":memory:")
    con.execute(f"SET memory_limit = '{_parse_memory(memory_limit)}'")
    con.execute("SET preserve_insertion_order = false")
    tmp = path.parent / (path.name + ".spill")
    con.execute(f"SET temp_directory = '{tmp}'")
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    con.execute(f"ATTACH '{path}' AS wh")
    return con


def _rm(p: Path) -> None:
    import shutil

    for q in (p, p.parent / (p.name + ".wal"), p.parent / (p.name + ".spill")):
        if q.is_dir():
            shutil.rmtree(q, ignore_errors=True)
        elif q.exists():
            q.unlink()


def content_hash(con: duckdb.DuckDBPyConnection, schema: str = "") -> str:
    """sha256 over the ordered contents of the output tables, one hasher per column.

    Timestamps hash as int64 microseconds, booleans as uint8, strings as UTF-8 with a NUL
    separator, floats rounded to 6 decimals (parallel aggregation may change the last bits of
    a mean); the ``_z`` columns are left out (they are a function of the raw column and the
    hashed ``standardisation``). The final digest combines the per-column digests in order.
    """
    orders = {"cohort_stays": "stay_id", "vitals_hourly": "stay_id, hour", "standardisation": "vital"}
    outer = hashlib.sha256()
    for table, order in orders.items():
        cols = [r[0] for r in con.execute(f"DESCRIBE {schema}{table}").fetchall() if not r[0].endswith("_z")]
        hashers = {c: hashlib.sha256() for c in cols}
        sel = ", ".join(
            f"epoch_us({c}) AS {c}" if c in ("intime", "outtime") else c for c in cols
        )
        reader = con.sql(f"SELECT {sel} FROM {schema}{table} ORDER BY {order}").to_arrow_reader(1_000_000)
        for batch in reader:
            for name, arr in zip(batch.schema.names, batch.columns):
                h = hashers[name]
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
        outer.update(table.encode())
        for c in cols:
            outer.update(c.encode() + hashers[c].digest())
    return outer.hexdigest()


class _Funnel:
    def __init__(self, con: duckdb.DuckDBPyConnection):
        self.rows: list[tuple[str, int, int | None]] = []
        self.con = con

    def add(self, step: str, n_stays: int, n_rows: int | None = None) -> None:
        self.rows.append((step, int(n_stays), None if n_rows is None else int(n_rows)))

    def require(self, n_stays: int, why: str) -> None:
        if n_stays == 0:
            raise EmptyCohortError(f"empty cohort after filters ({why})", self.rows)


def _scan(con, sql: str, files, what: str):
    try:
        return con.execute(sql)
    except duckdb.Error as exc:
        if isinstance(exc, (duckdb.IOException, duckdb.InvalidInputException, duckdb.ConversionException)):
            names = ", ".join(str(f) for f in files)
            raise UnreadableInputError(
                f"reading {what} from {names} failed ({type(exc).__name__}: {str(exc).splitlines()[0][:300]})"
            ) from exc
        raise


def _build_into(con, source: str, root: Path, min_hours: float, sample: int | None, seed: int,
                progress: bool, batch_stays: int) -> _Funnel:
    adapter = make_adapter(source, root, con)
    funnel = _Funnel(con)
    q = lambda sql: con.execute(sql).fetchone()  # noqa: E731

    # 1. stays ---------------------------------------------------------------------------
    _scan(con, f"CREATE TABLE _src_stays AS {adapter.stays_sql()}", [adapter.scan_files[0].parent], "ICU stays")
    funnel.add("icu_stays_in_source", q("SELECT count(*) FROM _src_stays")[0])
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

    # 2+3. one scan of the measurements, fused with the charttime de-duplication ----------
    # Every row gets one packed BIGINT group key (one-column keys hash much faster than three):
    #   usable row:  stay_idx << 43 | (vital·4+src) << 38 | ms since intime
    #   other rows:  stay_idx << 43 | 31 << 38 | status (0 no number, 1 outside stay, 2 implausible)
    # so duplicated chartings (same stay, item kind, charttime) collapse to their mean, and
    # the per-key counts carry the funnel. ms since intime is capped at n_hours·3600000 − 1
    # (a row exactly at outtime joins the last hour).
    n_cohort = q("SELECT count(*) FROM _cohort0")[0]
    if n_cohort >= 2 ** 20:
        raise BadParameterError(f"{n_cohort} stays exceed the 1,048,575 a build can pack; use --sample")
    con.execute("CREATE TABLE _sidx AS SELECT stay_id, CAST(row_number() OVER (ORDER BY stay_id) - 1 AS BIGINT) AS sidx, "
                "in_us, out_us, n_hours FROM _cohort0")
    t = time.perf_counter()
    _scan(
        con,
        f"""CREATE TABLE _o1 AS
        WITH m AS (
            SELECT c.sidx, CAST(m.vital * 4 + m.src AS BIGINT) AS vs, m.ts_us, c.in_us, c.n_hours,
                   {_value_sql()} AS value,
                   (m.ts_us >= c.in_us AND m.ts_us <= c.out_us) AS in_win
            FROM ({adapter.measurements_sql('_cohort0')}) AS m JOIN _sidx AS c USING (stay_id)),
        m2 AS (SELECT *, COALESCE(in_win AND {_plausible_case_sql()}, false) AS ok FROM m)
        SELECT CASE WHEN ok THEN (sidx << 43) | (vs << 38)
                                 | LEAST((ts_us - in_us) // 1000, CAST(n_hours AS BIGINT) * 3600000 - 1)
                    ELSE (sidx << 43) | (31::BIGINT << 38)
                         | (CASE WHEN value IS NULL THEN 0 WHEN NOT in_win THEN 1 ELSE 2 END) END AS k,
               count(*) AS n, avg(value) AS v
        FROM m2 GROUP BY k""",
        adapter.scan_files, "vital-sign rows",
    )
    if progress:
        print(f"[cohort] scanned vitals in {time.perf_counter() - t:.1f}s", file=sys.stderr)
    # per-stay funnel counts: status 0 rows are not numeric, 1 outside the stay, 2 implausible
    con.execute(
        """CREATE TABLE _stay_counts AS
        WITH x AS (SELECT k >> 43 AS sidx, CASE WHEN (k >> 38) & 31 = 31 THEN k & 3 ELSE 3 END AS st, n FROM _o1)
        SELECT s.stay_id, sum(n) AS n_all, sum(n) FILTER (WHERE st >= 1) AS n_num,
               sum(n) FILTER (WHERE st >= 2) AS n_win, sum(n) FILTER (WHERE st = 3) AS n_ok
        FROM x JOIN _sidx AS s USING (sidx) GROUP BY s.stay_id"""
    )
    for step, col in (("vital_rows", "n_all"), ("numeric_value", "n_num"),
                      ("charttime_within_stay", "n_win"), ("plausible_range", "n_ok")):
        n_st, n_r = q(f"SELECT count(*) FILTER (WHERE {col} > 0), coalesce(sum({col}), 0) FROM _stay_counts")
        funnel.add(step, n_st, n_r)

    # 4. hourly means per (vital, source), pivoted wide; a vital charted by two sources (BP)
    # is the mean of the two source means: (coalesce(a, n) + coalesce(n, a)) / 2.
    cols, outs = [], []
    for v in VITALS:
        code = VITAL_CODE[v]
        srcs = sorted({s for (vv, s, _) in ITEMIDS.values() if vv == v})
        for s_ in srcs:
            cols.append(f"avg(CASE WHEN vs = {code * 4 + s_} THEN v END) AS {v}_{s_}")
        if len(srcs) == 1:
            outs.append(f"{v}_{srcs[0]} AS {v}")
        else:
            a, n = (f"{v}_{s_}" for s_ in srcs[:2])
            outs.append(f"(coalesce({a}, {n}) + coalesce({n}, {a})) / 2 AS {v}")
    con.execute(
        f"""CREATE TABLE _obs AS
        WITH x AS (SELECT k >> 43 AS sidx, (k >> 38) & 31 AS vs, (k & 274877906943) // 3600000 AS h, v
                   FROM _o1 WHERE (k >> 38) & 31 < 31),
        w AS (SELECT (sidx << 20) | h AS k2, {', '.join(cols)} FROM x GROUP BY k2)
        SELECT s.stay_id, CAST(w.k2 & 1048575 AS INTEGER) AS hour, {', '.join(outs)}
        FROM w JOIN _sidx AS s ON s.sidx = w.k2 >> 20"""
    )
    con.execute("DROP TABLE _o1")

    # 5. final cohort + splits ------------------------------------------------------------
    con.execute(
        "CREATE TABLE _final AS SELECT c.stay_id, c.subject_id, c.hadm_id, c.intime, c.outtime, c.n_hours "
        "FROM _cohort0 AS c WHERE c.stay_id IN (SELECT stay_id FROM _stay_counts WHERE n_ok > 0)"
    )
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

    # 6. medians on the training split, then Polars fill in batches -----------------------
    med_sql = ", ".join(f"median({v}) FILTER (WHERE c.split = 'train'), median({v})" for v in VITALS)
    med = q(f"SELECT {med_sql} FROM _obs JOIN cohort_stays AS c USING (stay_id)")
    medians = {}
    for v, mt, ma in zip(VITALS, med[0::2], med[1::2]):
        if mt is None and ma is None:
            raise EmptyCohortError(f"vital {v!r} is never observed in the cohort; cannot impute", funnel.rows)
        medians[v] = float(mt if mt is not None else ma)

    cols_sql = ", ".join(
        ["stay_id BIGINT", "hour INTEGER"] + [f"{v} DOUBLE" for v in VITALS]
        + [f"{c} BOOLEAN" for c in OBSERVED_COLUMNS] + [f"{c} BOOLEAN" for c in EVENT_COLUMNS]
    )
    con.execute(f"CREATE TABLE _filled ({cols_sql})")
    stay_rows = con.execute("SELECT stay_id, n_hours FROM cohort_stays ORDER BY stay_id").fetchall()
    batches = [stay_rows[i:i + batch_stays] for i in range(0, len(stay_rows), batch_stays)]
    it = batches
    if progress and len(batches) > 1:
        from tqdm import tqdm

        it = tqdm(batches, desc="[cohort] fill", unit="batch", file=sys.stderr)
    for b in it:
        lo, hi = b[0][0], b[-1][0]
        stays_df = pl.DataFrame({"stay_id": [r[0] for r in b], "n_hours": [r[1] for r in b]},
                                schema={"stay_id": pl.Int64, "n_hours": pl.Int64})
        obs = pl.from_arrow(con.sql(f"SELECT * FROM _obs WHERE stay_id BETWEEN {lo} AND {hi}").to_arrow_table())
        filled = fill_batch(obs, stays_df, medians)
        con.register("_batch_df", filled.to_arrow())
        con.execute("INSERT INTO _filled SELECT * FROM _batch_df")
        con.unregister("_batch_df")

    # 7. standardisation on the training split only ----------------------------------------
    stats_sql = ", ".join(f"avg({v}), stddev_samp({v})" for v in VITALS)
    st = q(f"SELECT {stats_sql} FROM _filled WHERE stay_id IN (SELECT stay_id FROM cohort_stays WHERE split = 'train')")
    con.execute("CREATE TABLE standardisation (vital VARCHAR PRIMARY KEY, mean DOUBLE NOT NULL, sd DOUBLE NOT NULL)")
    stats = {}
    for i, v in enumerate(VITALS):
        mean, sd = st[2 * i], st[2 * i + 1]
        sd = 1.0 if sd is None or not np.isfinite(sd) or sd <= 0 else float(sd)
        stats[v] = (float(mean), sd)
        con.execute("INSERT INTO standardisation VALUES (?, ?, ?)", [v, float(mean), sd])
    z_sql = ", ".join(f"({v} - {stats[v][0]!r}) / {stats[v][1]!r} AS {v}_z" for v in VITALS)
    con.execute(
        "CREATE TABLE wh.vitals_hourly AS SELECT stay_id, hour, "
        + ", ".join(VITALS) + ", " + ", ".join(OBSERVED_COLUMNS) + f", {z_sql}, "
        + ", ".join(EVENT_COLUMNS) + " FROM _filled"
    )
    con.execute("CREATE INDEX vitals_hourly_stay ON wh.vitals_hourly (stay_id)")
    n_st, n_r = q("SELECT count(DISTINCT stay_id), count(*) FROM _filled")
    funnel.add("hourly_tokens", n_st, n_r)
    con.execute("CREATE TABLE wh.cohort_funnel (step VARCHAR, n_stays BIGINT, n_rows BIGINT, ord INTEGER)")
    for i, (step, ns, nr) in enumerate(funnel.rows):
        con.execute("INSERT INTO wh.cohort_funnel VALUES (?, ?, ?, ?)", [step, ns, nr, i])
    con.execute(
        "CREATE TABLE wh.cohort_stays (stay_id BIGINT PRIMARY KEY, subject_id BIGINT NOT NULL, hadm_id BIGINT, "
        "intime TIMESTAMP NOT NULL, outtime TIMESTAMP NOT NULL, n_hours INTEGER NOT NULL, split VARCHAR NOT NULL)")
    con.execute("INSERT INTO wh.cohort_stays SELECT * FROM cohort_stays ORDER BY stay_id")
    con.execute("CREATE TABLE wh.standardisation (vital VARCHAR PRIMARY KEY, mean DOUBLE NOT NULL, sd DOUBLE NOT NULL)")
    con.execute("INSERT INTO wh.standardisation SELECT * FROM standardisation")
    for tname in ("_src_stays", "_valid", "_long", "_cohort0", "_stay_counts", "_obs", "_final", "_filled",
                  "cohort_stays", "standardisation"):
        con.execute(f"DROP TABLE IF EXISTS {tname}")
    return funnel


def build_warehouse(source: str, root: str | Path | None, warehouse: str | Path = "warehouse.duckdb",
                    min_hours: float = 48, sample: int | None = None, seed: int = 0,
                    memory_limit: str = "4GB", progress: bool = True, threads: int | None = None,
                    export_parquet: str | Path | None = None, batch_stays: int = 4000) -> BuildSummary:
    """Build the warehouse and return a :class:`BuildSummary`.

    Parameters
    ----------
    source : {"mimic", "clif", "demo"}
        ``demo`` = the CLIF adapter on the real MIMIC-IV demo cache (see :mod:`cohort.demo_data`);
        ``root`` may then be None (default cache).
    root : path of the source files.
    warehouse : output DuckDB file; replaced atomically on success only.
    min_hours : minimum LOS in hours (default 48).
    sample : keep a deterministic sample of this many eligible stays (None: all stays).
    seed : seed of the sample and of the subject split.
    memory_limit : DuckDB memory limit, e.g. "4GB".
    export_parquet : optional folder that receives one Parquet file per output table.
    """
    t0 = time.perf_counter()
    if min_hours < 0:
        raise BadParameterError(f"min_hours must be ≥ 0, got {min_hours}")
    if sample is not None and sample < 1:
        raise BadParameterError(f"sample must be ≥ 1, got {sample}")
    if source == "demo":
        from .demo_data import ensure_demo

        root = ensure_demo(root)
        adapter_source = "clif"
    elif source in ("mimic", "clif"):
        if root is None:
            raise BadParameterError(f"--root is required for source {source!r}")
        adapter_source = source
    else:
        raise BadParameterError(f"unknown source {source!r}; expected one of mimic, clif, demo")
    _parse_memory(memory_limit)
    warehouse = Path(warehouse).resolve()
    warehouse.parent.mkdir(parents=True, exist_ok=True)
    tmp = warehouse.parent / f".{warehouse.name}.building-{os.getpid()}"
    _rm(tmp)
    con = _connect(tmp, memory_limit, threads)
    try:
        funnel = _build_into(con, adapter_source, Path(root), min_hours, sample, seed, progress, batch_stays)
        h = content_hash(con, "wh.")
        params = {"source": source, "min_hours": min_hours, "sample": sample, "seed": seed}
        con.execute("CREATE TABLE wh.build_info (key VARCHAR PRIMARY KEY, value VARCHAR)")
        info = {"content_hash": h, "params": json.dumps(params), "duckdb": duckdb.__version__,
                "built_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        for k, v in info.items():
            con.execute("INSERT INTO wh.build_info VALUES (?, ?)", [k, v])
        n_stays, n_rows = con.execute("SELECT (SELECT count(*) FROM wh.cohort_stays), (SELECT count(*) FROM wh.vitals_hourly)").fetchone()
        if export_parquet is not None:
            out = Path(export_parquet)
            out.mkdir(parents=True, exist_ok=True)
            for tname in OUTPUT_TABLES:
                order = " ORDER BY ord" if tname == "cohort_funnel" else ""
                con.execute(f"COPY (SELECT * FROM wh.{tname}{order}) TO '{out / (tname + '.parquet')}' (FORMAT parquet)")
        con.execute("CHECKPOINT wh")
        con.execute("DETACH wh")
        con.close()
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
                           content_hash=h, source=source, seconds=time.perf_counter() - t0, params=params)
    if progress:
        print(format_funnel(funnel.rows), file=sys.stderr)
    return summary


def read_funnel(con_or_path) -> list[tuple[str, int, int | None]]:
    """The stored funnel of a warehouse, in build order."""
    from .streams import _connection

    with _connection(con_or_path) as con:
        return [(s, int(a), None if b is None else int(b))
                for s, a, b in con.execute("SELECT step, n_stays, n_rows FROM cohort_funnel ORDER BY ord").fetchall()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cohort.build", description=__doc__.split("\n")[0])
    p.add_argument("--source", required=True, choices=["mimic", "clif", "demo"])
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
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    try:
        s = build_warehouse(a.source, a.root, a.warehouse, min_hours=a.min_hours,
                            sample=None if a.all_stays else a.sample, seed=a.seed,
                            memory_limit=a.memory_limit, progress=not a.quiet, threads=a.threads,
                            export_parquet=a.export_parquet)
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
