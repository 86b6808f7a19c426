"""Incremental (streaming) ingest building blocks: new-file discovery, one DuckDB scan per new
measurement file, closed-hour logic and the causal fill with a frozen standardisation.

Source increments are extra measurement files beside the stays tables (append-only contract):

* ``mimic``: ``<root>/icu/chartevents*.parquet|.csv.gz|.csv`` (plus ``icu/icustays``);
* ``clif``: ``<root>/clif_vitals*.parquet`` (plus ``clif_adt`` and ``clif_hospitalization``).

Each file is identified by its relative name, size and the sha256 of its bytes; a file whose
bytes change after it was ingested is refused (:class:`SourceChangedError`), never re-read.
:func:`plan_files` hashes only files that are new or whose size or modification time differ
from what was recorded (a recorded file with the same size and mtime is taken as unchanged
without reading it, so a run with nothing new costs one ``stat`` per file).

Hours and the watermark. ``W`` is the largest charttime of every vital row ingested so far
(optionally raised by an explicit ``as_of``). Contract: every row with charttime ≤ W has arrived.
Hour ``h`` of a stay covers ``[intime + h, intime + h + 1)``; the last hour also takes rows at
``outtime`` (as in the batch build). An hour is *closed* when its end (``intime + h + 1`` h, the
last one: ``outtime``) is ≤ W; only closed hours become rows/tokens. A usable row that falls in
an already closed hour is *late*; :mod:`pipelines.ingest` re-opens its stay from that hour.

The hourly means reuse :func:`cohort._hourly.hourly_means` on the same packed keys as the batch
build; the fill is causal (forward within the stay, the frozen median before the first record).
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np

from cohort._hourly import MS_SHIFT, SIDX_SHIFT, events, fill_within_stays, hourly_means
from cohort.build import HOUR_US, exclude_stays, plausible_case_sql, value_sql
from cohort.constants import VITALS
from cohort.errors import BadParameterError, CohortError

PATTERNS = {"mimic": ("icu", "chartevents"), "clif": (".", "clif_vitals")}
_EXTS = (".parquet", ".csv.gz", ".csv")
STAYS_TABLE = "_ing_stays"


class SourceChangedError(CohortError):
    """An already-ingested source file changed (append-only contract broken); nothing changed."""


@dataclass(frozen=True)
class FileId:
    name: str          # path relative to the root
    size: int
    sha256: str
    mtime_ns: int | None = None


def measurement_files(source: str, root: str | Path) -> list[Path]:
    """Every measurement part file of the source root, sorted by name."""
    if source not in PATTERNS:
        raise BadParameterError(f"unknown ingest source {source!r}; expected mimic or clif")
    sub, stem = PATTERNS[source]
    d = Path(root) / sub
    exts = (".parquet",) if source == "clif" else _EXTS
    out = [p for p in d.glob(stem + "*") if p.is_file() and any(p.name.endswith(e) for e in exts)]
    return sorted(out, key=lambda p: p.name)


def _rel(root: str | Path, path: Path) -> str:
    return str(Path(path).resolve().relative_to(Path(root).resolve()))


def file_identity(root: str | Path, path: Path, chunk: int = 1 << 22) -> FileId:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
        sr = os.fstat(f.fileno())
    return FileId(_rel(root, path), sr.st_size, h.hexdigest(), sr.st_mtime_ns)


def plan_files(source: str, root: str | Path, recorded: dict[str, tuple]) -> tuple[list, list[FileId], int]:
    """New part files of the root against ``recorded`` (name -> (size, sha256, mtime_ns or None)).

    Returns ``(new [(path, FileId)] in name order, touched [FileId], files hashed)``: ``touched``
    are recorded files whose mtime changed but whose bytes did not (the caller records the new
    mtime). A recorded file with another size, or another sha256, is :class:`SourceChangedError`."""
    new, touched, hashed = [], [], 0
    for f in measurement_files(source, root):
        name = _rel(root, f)
        rec = recorded.get(name)
        if rec is not None:
            sr = f.stat()
            if sr.st_size != int(rec[0]):
                raise SourceChangedError(f"source file {name} changed after it was ingested (append-only "
                                         "contract); nothing changed")
            if rec[2] is not None and int(rec[2]) == sr.st_mtime_ns:
                continue
        fid = file_identity(root, f)
        hashed += 1
        if rec is None:
            new.append((f, fid))
        elif (fid.size, fid.sha256) != (int(rec[0]), rec[1]):
            raise SourceChangedError(f"source file {name} changed after it was ingested (append-only "
                                     "contract); nothing changed")
        else:
            touched.append(fid)
    return new, touched, hashed


def _adapter(source: str, root: Path, con, part: Path | None):
    """The batch adapter's SQL (stays, measurements) over one part file (no full layout needed)."""
    from cohort.sources import REQUIRED_COLUMNS, STAYS_TABLES, ClifAdapter, MimicNativeAdapter, Table, check_layout

    def fresh(cls):
        obj = cls.__new__(cls)
        try:  # the seed vital-sign convention (cohort.conventions), where the adapters have one
            from cohort.conventions import SEED, get_convention

            obj.convention = get_convention(SEED)
        except ImportError:  # pragma: no cover
            pass
        return obj

    stays = check_layout(source, root, STAYS_TABLES[source], con)  # present, readable, required columns
    if source == "mimic":
        a = fresh(MimicNativeAdapter)
        a.icustays = stays["icu/icustays"]
        if part is not None:
            a.chartevents = Table("icu/chartevents", part)
            a.chartevents.check(con, REQUIRED_COLUMNS["mimic"]["icu/chartevents"])
        a.scan_files = [part or a.icustays.path]
        return a
    a = fresh(ClifAdapter)
    a.adt, a.hosp = stays["clif_adt"], stays["clif_hospitalization"]
    if part is not None:
        a.vitals = Table("clif_vitals", part)
        a.vitals.check(con, REQUIRED_COLUMNS["clif"]["clif_vitals"])
    a.scan_files = [part or a.adt.path]
    a._con = con
    return a


def load_stays(con, source: str, root: str | Path, min_hours: float, exclude_subjects=None) -> int:
    """Create the temp table ``_ing_stays`` of eligible stays (the batch build's rules: one
    subject per stay and registered subjects and stays dropped (:func:`cohort.build.exclude_stays`)
    before any measurement is scanned, valid times, first row per stay id, LOS ≥ min_hours).
    Returns the number of eligible stays."""
    a = _adapter(source, Path(root), con, None)
    con.execute(f"DROP TABLE IF EXISTS {STAYS_TABLE}")
    con.execute(f"CREATE TEMP TABLE _ing_src AS {a.stays_sql()}")
    exclude_stays(con, "_ing_src", exclude_subjects)
    min_us = int(round(min_hours * HOUR_US))
    con.execute(
        f"CREATE TEMP TABLE {STAYS_TABLE} AS SELECT stay_id, subject_id, hadm_id, intime, outtime, join_key, "
        f"in_us, out_us, CAST(ceil((out_us - in_us) / {HOUR_US}.0) AS INTEGER) AS n_hours FROM ("
        "SELECT *, epoch_us(intime) AS in_us, epoch_us(outtime) AS out_us FROM _ing_src "
        "WHERE stay_id IS NOT NULL AND subject_id IS NOT NULL AND intime IS NOT NULL AND outtime IS NOT NULL "
        "AND outtime > intime QUALIFY row_number() OVER (PARTITION BY stay_id ORDER BY intime) = 1) "
        f"WHERE out_us - in_us >= {min_us}")
    con.execute("DROP TABLE _ing_src")
    return int(con.execute(f"SELECT count(*) FROM {STAYS_TABLE}").fetchone()[0])


SCAN_TABLE = "_ing_scan"


def scan_file(con, source: str, root: str | Path, part: Path) -> tuple[int, int, int | None]:
    """One DuckDB scan of a part file (itemid/category filter pushed into the reader), joined to
    ``_ing_stays``; unit conversion and the plausibility/in-stay filters as in the batch build.
    The usable rows land in the temp table ``_ing_scan (stay_id, ms, vs, value)`` (DuckDB-managed,
    spilling: nothing is materialised in Python). Returns ``(vital rows, usable rows, max ts µs)``."""
    a = _adapter(source, Path(root), con, part)
    sql = f"""
        WITH m AS (
            SELECT c.stay_id, CAST(m.vital * 4 + m.src AS BIGINT) AS vs, m.ts_us, c.in_us,
                   {value_sql()} AS value, (m.ts_us >= c.in_us AND m.ts_us <= c.out_us) AS in_win
            FROM ({a.measurements_sql(STAYS_TABLE)}) AS m JOIN {STAYS_TABLE} AS c USING (stay_id))
        SELECT stay_id, (ts_us - in_us) // 1000 AS ms, vs, value,
               COALESCE(in_win AND {plausible_case_sql()}, false) AS ok FROM m"""
    try:
        con.execute(f"DROP TABLE IF EXISTS {SCAN_TABLE}")
        con.execute(f"CREATE TEMP TABLE _ing_scan_all AS {sql}")
        n_rows = int(con.execute("SELECT count(*) FROM _ing_scan_all").fetchone()[0])
        con.execute(f"CREATE TEMP TABLE {SCAN_TABLE} AS SELECT stay_id, ms, vs, value FROM _ing_scan_all WHERE ok")
        con.execute("DROP TABLE _ing_scan_all")
        mx = con.execute(f"SELECT max(ts_us) FROM ({a.measurements_sql(STAYS_TABLE)})").fetchone()[0]
    except (duckdb.IOException, duckdb.InvalidInputException, duckdb.ConversionException) as exc:
        from cohort.errors import UnreadableInputError, redact

        raise UnreadableInputError(f"reading vital-sign rows from {part} failed ({type(exc).__name__}: "
                                   f"{redact(str(exc).splitlines()[0][:300])})") from exc
    n_ok = int(con.execute(f"SELECT count(*) FROM {SCAN_TABLE}").fetchone()[0])
    return n_rows, n_ok, None if mx is None else int(mx)


def closed_hours(w_us: int | None, in_us: np.ndarray, out_us: np.ndarray, n_hours: np.ndarray) -> np.ndarray:
    """Number of closed hours per stay at watermark ``w_us`` (hours 0..k−1 are closed)."""
    in_us = np.asarray(in_us, np.int64)
    n_hours = np.asarray(n_hours, np.int64)
    if w_us is None:
        return np.zeros(in_us.size, np.int64)
    full = np.clip((int(w_us) - in_us) // HOUR_US, 0, np.maximum(n_hours - 1, 0))
    return np.where(int(w_us) >= np.asarray(out_us, np.int64), n_hours, full)


def causal_rows(ms: np.ndarray, vs: np.ndarray, value: np.ndarray, sidx: np.ndarray,
                n_hours: np.ndarray, r0: np.ndarray, r1: np.ndarray, carry: np.ndarray):
    """Filled hourly rows of hours ``[r0, r1)`` of several stays (stay index ``sidx`` of each raw
    row), causally: hourly mean where observed, else the last filled value (``carry`` (s, 6) is
    the filled row of hour r0−1, or the frozen medians when r0 = 0).

    Returns ``(stay_index (N,), hour (N,), filled (N, 6), observed (N, 6))`` in (stay, hour)
    order, N = Σ (r1 − r0)."""
    lens = np.maximum(np.asarray(r1, np.int64) - np.asarray(r0, np.int64), 0)
    n = int(lens.sum())
    starts = np.cumsum(lens) - lens
    k = (np.asarray(sidx, np.int64) << SIDX_SHIFT) | (np.asarray(ms, np.int64) << MS_SHIFT) | np.asarray(vs, np.int64)
    o_sidx, o_hour, o_val = hourly_means(k, np.asarray(value, np.float64), np.asarray(n_hours, np.int64))
    keep = (o_hour >= r0[o_sidx]) & (o_hour < r1[o_sidx])
    o_sidx, o_hour, o_val = o_sidx[keep], o_hour[keep], o_val[keep]
    filled, observed = fill_within_stays(starts[o_sidx] + o_hour - r0[o_sidx], o_val, lens, fill="causal")
    rep = np.repeat(np.arange(lens.size), lens)
    miss = np.isnan(filled)
    if n:
        filled[miss] = np.asarray(carry, np.float64)[rep][miss]
    hour = np.arange(n, dtype=np.int64) - np.repeat(starts, lens) + np.repeat(r0, lens)
    return rep, hour, filled, observed


def out_table(stay_id: np.ndarray, hour: np.ndarray, filled: np.ndarray, observed: np.ndarray,
              mean: np.ndarray, sd: np.ndarray):
    """The ``vitals_hourly`` rows (batch schema and column order) as an Arrow table."""
    import pyarrow as pa

    from cohort.constants import EVENT_COLUMNS, OBSERVED_COLUMNS

    z = (filled - mean) / sd
    comp, spo2 = events(filled)
    cols = {"stay_id": pa.array(np.asarray(stay_id, np.int64)), "hour": pa.array(np.asarray(hour, np.int32))}
    for j, v in enumerate(VITALS):
        cols[v] = pa.array(filled[:, j])
    for j, c in enumerate(OBSERVED_COLUMNS):
        cols[c] = pa.array(observed[:, j])
    for j, v in enumerate(VITALS):
        cols[f"{v}_z"] = pa.array(z[:, j])
    cols[EVENT_COLUMNS[0]] = pa.array(comp)
    cols[EVENT_COLUMNS[1]] = pa.array(spo2)
    return pa.table(cols)


__all__ = ["FileId", "SourceChangedError", "measurement_files", "file_identity", "plan_files", "load_stays",
           "scan_file",
           "closed_hours", "causal_rows", "out_table", "STAYS_TABLE", "SCAN_TABLE"]
