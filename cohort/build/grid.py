"""Build stages 4–7: splits, the dense hourly grid, standardisation and the output tables.

They run after :func:`cohort.build.scan.scan_vitals` (which spooled the usable rows into
buckets of contiguous stays) and hold one bucket at a time: :func:`final_cohort` (stage 5),
:func:`hourly_grid` (stages 4 and 6: hourly means, dense hours, fill within stay, the
training split's moments and medians), :func:`standardise` (stage 7: ``standardisation``) and
:func:`write_outputs` (``vitals_hourly``, ``cohort_funnel``, ``cohort_stays`` and
``standardisation`` into the attached output file ``wh``).
"""
from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa

from cohort._hourly import Moments, events, fill_within_stays, hourly_means
from cohort.build.scan import Funnel, ScannedVitals, one_row
from cohort.constants import EVENT_COLUMNS, OBSERVED_COLUMNS, VITALS
from cohort.errors import EmptyCohortError
from cohort.selection import assign_splits
from cohort.warehouse_hash import TableHasher

COHORT_STAYS_DDL = ("(stay_id BIGINT PRIMARY KEY, subject_id BIGINT NOT NULL, hadm_id BIGINT, "
                    "intime TIMESTAMP NOT NULL, outtime TIMESTAMP NOT NULL, n_hours INTEGER NOT NULL, "
                    "split VARCHAR NOT NULL)")


def final_cohort(con: duckdb.DuckDBPyConnection, funnel: Funnel, scanned: ScannedVitals,
                 seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Stage 5: the final cohort (stays with ≥ 1 usable row) and its subject splits.

    Writes the scratch tables ``_final`` and ``cohort_stays`` (stay_id order; split by subject,
    :func:`cohort.selection.assign_splits` with ``seed``) and the funnel step
    ``stays_with_a_vital`` (stays, hourly tokens). Returns ``final`` and ``train``: (n,) bool
    per stay index, kept / in the training split.
    """
    q = functools.partial(one_row, con)
    n_cohort = scanned.stay_of_sidx.size
    final = scanned.per_stay["n_ok"] > 0
    con.register("_final_ids", pa.table({"stay_id": scanned.stay_of_sidx[final]}))
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
    con.execute("CREATE TABLE cohort_stays " + COHORT_STAYS_DDL)
    con.execute(
        "INSERT INTO cohort_stays SELECT f.stay_id, f.subject_id, f.hadm_id, f.intime, f.outtime, f.n_hours, s.split "
        "FROM _final f JOIN _split_df s USING (subject_id) ORDER BY f.stay_id"
    )
    con.unregister("_split_df")
    tr = con.sql("SELECT s.sidx FROM cohort_stays c JOIN _sidx s USING (stay_id) WHERE c.split = 'train'").fetchnumpy()
    train = np.zeros(n_cohort, dtype=bool)
    train[np.asarray(tr["sidx"], dtype=np.int64)] = True
    return final, train


@dataclass
class HourlyGrid:
    """The dense grid's layout and the training split's statistics (``nv`` = 6 vitals).

    grid_hours : (n,) int64, hours of each stay index on the grid (0 for a dropped stay).
    grid_start : (n,) int64, grid row of each stay index's hour 0.
    medians : (nv,) float64, imputation medians (training split's observed hourly values;
        all stays if the training split has none; the frozen ones when given).
    moments : per-vital running moments of the training rows' filled values.
    n_unfilled : (nv,) float64, training rows still missing after the fill (they take the median).
    n_stays : stays on the grid (the final cohort).
    """

    grid_hours: np.ndarray
    grid_start: np.ndarray
    medians: np.ndarray
    moments: Moments
    n_unfilled: np.ndarray
    n_stays: int


def hourly_grid(scanned: ScannedVitals, final: np.ndarray, train: np.ndarray, scratch: Path, funnel: Funnel,
                fill: str = "backfill", frozen: dict | None = None, progress: bool = False) -> HourlyGrid:
    """Stages 4 and 6: per bucket, hourly means, the dense grid and the fill within stay.

    Grid rows are the final stays in stay_id order, hours 0..n_hours−1. For each bucket the
    filled values and the observed flags are saved to ``scratch`` (``filled_<b>.npy``: (rows,
    nv) float64; ``observed_<b>.npy``: (rows, nv) bool) for :func:`write_outputs`; the training
    split's moments and observed values (for the medians, spooled to scratch files) are
    gathered on the way. A vital never observed raises :class:`cohort.errors.EmptyCohortError`
    (unless ``frozen`` gives its median).
    """
    spool, hours_of_sidx = scanned.spool, scanned.hours_of_sidx
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

    # 6b. medians of the training split's observed hourly values (all stays if none)
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
    return HourlyGrid(grid_hours, grid_start, medians, moments, n_unfilled, int(final.sum()))


def standardise(con: duckdb.DuckDBPyConnection, grid: HourlyGrid, funnel: Funnel, fill: str = "backfill",
                frozen: dict | None = None) -> tuple[dict[str, tuple[float, float]], str]:
    """Stage 7a: mean and sample sd per vital on the training split only (sd 0 → 1; the
    never-recorded vitals of a training stay count as the median), or the ``frozen`` ones.

    Writes the scratch table ``standardisation`` (with a ``median`` column for causal or frozen
    builds: the frozen table of a streaming warehouse). Returns vital -> (mean, sd) and the
    table's DDL (for the output copy).
    """
    with_median = fill == "causal" or frozen is not None
    std_ddl = ("standardisation (vital VARCHAR PRIMARY KEY, mean DOUBLE NOT NULL, sd DOUBLE NOT NULL"
               + (", median DOUBLE NOT NULL)" if with_median else ")"))
    con.execute("CREATE TABLE " + std_ddl)
    moments, stats = grid.moments, {}
    for j, v in enumerate(VITALS):
        if frozen is not None:  # supplied: never recomputed
            stats[v] = (frozen[v][0], frozen[v][1])
        else:
            moments.add_group(j, grid.n_unfilled[j], grid.medians[j], 0.0)
            if moments.n[j] == 0:
                raise EmptyCohortError("no training-split hour to standardise on", funnel.rows)
            sd = moments.sd(j)
            sd = 1.0 if sd is None or not np.isfinite(sd) or sd <= 0 else sd
            stats[v] = (float(moments.mean[j]), sd)
        con.execute(f"INSERT INTO standardisation VALUES (?, ?, ?{', ?' if with_median else ''})",
                    [v, stats[v][0], stats[v][1]] + ([float(grid.medians[j])] if with_median else []))
    return stats, std_ddl


def write_outputs(con: duckdb.DuckDBPyConnection, scanned: ScannedVitals, grid: HourlyGrid,
                  stats: dict[str, tuple[float, float]], std_ddl: str, scratch: Path, funnel: Funnel,
                  progress: bool = False) -> TableHasher:
    """Stage 7b: the output tables in the attached file ``wh``.

    ``vitals_hourly`` (stay_id, hour, the six vitals, ``_observed`` flags, ``_z`` columns, event
    labels) is written bucket by bucket from the scratch grid files (removed as they are read;
    remaining gaps take the median) in ONE streamed INSERT, so DuckDB writes compressed row
    groups straight to the file instead of logging every bucket to the WAL; then
    ``cohort_funnel``, ``cohort_stays`` and ``standardisation``, and the scratch tables are
    dropped. Returns the hasher fed ``vitals_hourly``'s rows in hash order (stay_id, hour).
    """
    spool, stay_of_sidx = scanned.spool, scanned.stay_of_sidx
    grid_hours, medians, nv = grid.grid_hours, grid.medians, len(VITALS)
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

    out_hash = TableHasher([f.name for f in schema if not f.name.endswith("_z")])

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

    con.register("_out_rows", pa.RecordBatchReader.from_batches(schema, out_batches()))
    con.execute("INSERT INTO wh.vitals_hourly SELECT * FROM _out_rows")
    con.unregister("_out_rows")
    con.execute("CREATE INDEX vitals_hourly_stay ON wh.vitals_hourly (stay_id)")
    funnel.add("hourly_tokens", grid.n_stays, int(grid_hours.sum()))
    con.execute("CREATE TABLE wh.cohort_funnel (step VARCHAR, n_stays BIGINT, n_rows BIGINT, ord INTEGER)")
    for i, (step, ns, nr) in enumerate(funnel.rows):
        con.execute("INSERT INTO wh.cohort_funnel VALUES (?, ?, ?, ?)", [step, ns, nr, i])
    con.execute("CREATE TABLE wh.cohort_stays " + COHORT_STAYS_DDL)
    con.execute("INSERT INTO wh.cohort_stays SELECT * FROM cohort_stays ORDER BY stay_id")
    con.execute("CREATE TABLE wh." + std_ddl)
    con.execute("INSERT INTO wh.standardisation SELECT * FROM standardisation")
    for tname in ("_src_stays", "_valid", "_long", "_cohort0", "_sidx", "_final", "cohort_stays", "standardisation"):
        con.execute(f"DROP TABLE IF EXISTS {tname}")
    funnel.mark("write")
    return out_hash
