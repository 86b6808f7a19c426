"""Build the hourly vital-sign warehouse (DuckDB) from MIMIC-IV, CLIF or MEDS source files.

SPEC §2: eligible ICU stays, one streamed scan of the six vitals, hourly means, subject splits,
filled dense hours with event labels, training-split standardisation.

Command line::

    python -m cohort.build --source {mimic,clif,meds,demo} --root DIR --warehouse FILE \
        [--min-hours 48] [--sample N --seed S | --all-stays] [--memory-limit 4GB] \
        [--export-parquet DIR] [--convention {seed,mimic_code}] [--meds-codes FILE]

The seven stages are listed at :func:`_build_into`: 1–3 in :mod:`cohort.build.scan`, 4–7 in
:mod:`cohort.build.grid` (each docstring gives inputs, outputs and shapes); the content hash is
:mod:`cohort.warehouse_hash`, the slow reference :func:`cohort.reference.reference_build`. Memory
and atomic replacement: :func:`build_warehouse`. Vital conventions: docs/VITALS.md.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import duckdb

from cohort.build.content import drop_forgotten_content
from cohort.build.grid import final_cohort, hourly_grid, standardise, write_outputs
from cohort.build.scan import (
    HOUR_US,
    Funnel,
    exclude_stays,
    make_adapter,
    plausible_case_sql,
    scan_vitals,
    select_stays,
    value_sql,
)
from cohort.constants import VITALS
from cohort.conventions import CONVENTIONS, SEED, get_convention
from cohort.errors import BadParameterError, CohortError, format_funnel
from cohort.warehouse_hash import content_hash

# the build's public names; exclude_stays, value_sql and plausible_case_sql live in
# cohort.build.scan and content_hash in cohort.warehouse_hash (re-exported: one implementation)
__all__ = ["BuildSummary", "DERIVED_TABLES", "HOUR_US", "OUTPUT_TABLES", "attach_private", "build_warehouse",
           "check_frozen", "content_hash", "exclude_stays", "main", "plausible_case_sql", "read_funnel",
           "value_sql"]
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
        if not (math.isfinite(m) and math.isfinite(sd) and math.isfinite(med)) or sd <= 0:
            raise BadParameterError(f"frozen standardisation of {v!r} must be finite with sd > 0")
        out[v] = (m, sd, med)
    return out



def _build_into(con, source: str, root: Path, min_hours: float, sample: int | None, seed: int,
                progress: bool, batch_stays: int, scratch: Path, exclude_subjects=None,
                fill: str = "backfill", frozen: dict | None = None,
                convention: str = SEED, meds_codes=None) -> tuple[Funnel, dict]:
    """The seven stages below, on the scratch connection ``con`` (output file
    attached as ``wh``). Returns the funnel and ``{"vitals_hourly": hasher}`` (that table's
    content hash, computed as it was written).

    Stages (SPEC §2):

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
       With a forget registry that keeps content fingerprints, a stay whose observed hourly content
       is a forgotten stay's (a re-keyed copy) is dropped too (:mod:`cohort.build.content`).
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
    """
    adapter = make_adapter(source, root, con, convention, meds_codes)
    funnel = Funnel(con)
    select_stays(con, adapter, funnel, min_hours, sample, seed, exclude_subjects)  # 1
    scanned = scan_vitals(con, adapter, funnel, scratch, batch_stays, convention, progress)  # 2, 3
    drop_forgotten_content(scanned, exclude_subjects, funnel)  # 3b: a re-keyed copy of a forgotten stay
    final, train = final_cohort(con, funnel, scanned, seed)  # 5
    grid = hourly_grid(scanned, final, train, scratch, funnel, fill, frozen, progress)  # 4, 6
    stats, std_ddl = standardise(con, grid, funnel, fill, frozen)  # 7
    out_hash = write_outputs(con, scanned, grid, stats, std_ddl, scratch, funnel, progress)
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
        must never enter the warehouse (the forget registry, :meth:`pipelines.store.warehouse.Warehouse.exclusion`);
        if it also has a method ``stays(stay_ids) -> bool array``, the stays it names are excluded
        too, whichever subject the source lists them under. Applied to the source's stays before
        any measurement is scanned (:func:`exclude_stays`). The funnel gains the step
        ``not_in_forget_registry`` (a count only). Independently of it, a stay the source lists
        under more than one subject is dropped (step ``one_subject_per_stay``). If it also has
        ``contents`` (not None: the registry keeps content fingerprints), a stay whose observed
        hourly content matches a forgotten stay's is dropped after the scan (step
        ``content_not_forgotten``; :mod:`cohort.build.content`).
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

    Scratch tables live in an in-memory DuckDB (spilling to disk past ``memory_limit``) and scratch
    files in a ``.buckets`` folder beside the output (removed at the end); only the output tables
    are written to the warehouse file, ``vitals_hourly`` in one streamed INSERT. DuckDB holds at most
    ``memory_limit`` (past it, it spills to the owner-only folder ``<warehouse>.building-<pid>.spill``
    beside the warehouse, removed at the end); NumPy holds one Arrow batch of the scan (2^20 rows) and
    one bucket (``batch_stays`` stays: their vital rows and dense hours) at a time, so the peak RSS
    follows ``memory_limit`` plus one bucket whatever the size of chartevents (measured by
    :mod:`pipelines.bench.scale`; docs/SCALE.md). The bucket spool is owner-only too: both hold
    record-level values. ``BuildSummary.cpu_phases`` splits the build's CPU seconds into stays, scan,
    hourly, write, hash and finish. The warehouse is written to a temporary file next to the target
    and swapped in on success; a failed build leaves an existing warehouse untouched.
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
        from cohort.demo_data import ensure_demo

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
        from cohort.meds import load_code_map

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
        h = content_hash(con, "wh.", precomputed=hashed)
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
    from cohort.streams import warehouse_connection

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
