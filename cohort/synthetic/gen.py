"""Synthetic MIMIC-IV generator in the native layout (same files, columns, itemids, units).

:func:`generate` writes a root; :func:`make_small_warehouse` generates and builds a small
warehouse (tests, examples). The command line is :mod:`cohort.synthetic`. Physiology per stay
comes from :class:`cohort.synthetic.model.Model`, calibrated to the real MIMIC-IV demo
(``cohort/synthetic/synthetic_params.json``); charting mimics the real file's quirks the build
must handle, and most rows are other itemids (:mod:`cohort.synthetic.items`). The output is a
deterministic function of its settings, the same bytes for any number of workers, and memory is
bounded whatever its size (:func:`generate`). ``--fidelity`` compares synthetic with the demo
(:mod:`cohort.fidelity`).
"""
from __future__ import annotations

import json
import multiprocessing
import os
import resource
import shutil
import sys
import tempfile
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cohort.constants import ITEMIDS
from cohort.errors import BadParameterError
from cohort.synthetic.chunk import CHARTEVENTS_SCHEMA, STAY_KEYS, chunk_table, value_table
from cohort.synthetic.files import ChartWriter, small_tables, spool_chunk, write_table
from cohort.synthetic.items import d_items_rows
from cohort.synthetic.model import Model, load_params

#: Stays per chunk: ≈ 0.8M chartevents rows with non-vital rows (≈ 4,200 rows per stay).
CHUNK_STAYS = 200
_OUTPUT_TABLES = ("chartevents", "icustays", "d_items", "patients", "admissions")


@dataclass
class GenerateSummary:
    out_dir: Path
    n_stays: int
    n_chartevents: int
    seconds: float
    fmt: str
    n_vital_rows: int = 0
    workers: int = 1
    cpu_seconds: float = 0.0
    peak_rss_mb: dict = field(default_factory=dict)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


_VITAL_IDS = np.array(sorted(ITEMIDS), dtype=np.int64)


def _n_vital(table) -> int:
    return int(np.isin(table.column("itemid").to_numpy(), _VITAL_IDS).sum())


_WORKER: dict = {}


def _init_worker(params: dict) -> None:
    _WORKER["model"] = Model(params)


def _job(seed, chunk, k0, n, short_share, non_vital, fmt, spool_dir):
    """Worker: one chunk → spool file; returns its counts, stays and the process's resources."""
    t, st = chunk_table(seed, chunk, k0, n, _WORKER["model"], short_share, non_vital)
    path = spool_chunk(t, Path(spool_dir) / f"chunk-{chunk:08d}", fmt)
    return {"chunk": chunk, "spool": str(path), "rows": t.num_rows, "vital_rows": _n_vital(t), "stays": st,
            "pid": os.getpid(), "cpu": _cpu_s(), "rss": _peak_rss_mb()}


class _Progress:
    """A progress line on stderr (rows written, rows/s, ETA), at most once a second."""

    def __init__(self, enabled: bool, total_stays: int | None, target_rows: int | None):
        self.on, self.total_stays, self.target_rows = enabled, total_stays, target_rows
        self.t0 = self.last = time.perf_counter()
        self.tty = sys.stderr.isatty()

    def update(self, rows: int, stays: int, final: bool = False) -> None:
        now = time.perf_counter()
        if not self.on or (not final and now - self.last < (1.0 if self.tty else 10.0)):
            return
        self.last = now
        el = max(now - self.t0, 1e-9)
        frac = (stays / self.total_stays) if self.total_stays else min(rows / max(self.target_rows or 1, 1), 1.0)
        eta = el * (1 - frac) / frac if frac > 0 else float("nan")
        msg = (f"[synthetic] {rows:,} rows, {stays:,} stays, {rows / el / 1e6:.2f}M rows/s, "
               + (f"done in {el:.1f} s" if final else f"ETA {eta:.0f} s"))
        print(("\r" + msg) if self.tty else msg, end="\n" if (final or not self.tty) else "", file=sys.stderr,
              flush=True)


def _mp_context():
    """fork on Linux: workers start in milliseconds with the parameters, NumPy and Arrow already
    loaded, and a caller's script needs no ``__main__`` guard (the children run only
    :func:`_job`: NumPy and Arrow compute and IPC writes, whose thread pools are fork-safe);
    spawn elsewhere."""
    return multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")


_SPOOL_PREFIX = "forgetful-synthetic-"


def _spool_root(out: Path) -> Path:
    """Where workers hand chunks to the writer: /dev/shm (memory) when writable, else ``out``.
    Spool folders left by a killed run (their pid is gone) are removed first."""
    shm = Path("/dev/shm")
    root = shm if shm.is_dir() and os.access(shm, os.W_OK) else out
    for old in root.glob(f"{_SPOOL_PREFIX}*-*"):
        pid = old.name[len(_SPOOL_PREFIX):].split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists() and sys.platform.startswith("linux"):
            shutil.rmtree(old, ignore_errors=True)
    return root


def generate(out_dir: str | Path, stays: int | None = None, seed: int = 0, target_rows: int | None = None,
             fmt: str = "csv.gz", progress: bool = False, params: str | Path | dict | None = None,
             short_stay_share: float | None = None, workers: int | None = None, chunk_stays: int = CHUNK_STAYS,
             non_vital: bool = True) -> GenerateSummary:
    """Write a synthetic MIMIC-IV native layout into ``out_dir``.

    Parameters
    ----------
    out_dir : folder receiving ``icu/`` and ``hosp/``
    stays : number of ICU stays (all lengths; with the default parameters about 54 % are under
        48 h, as in the demo and in MIMIC-IV, and the build keeps the others)
    seed : RNG seed (the output is a deterministic function of seed, stays/target_rows,
        chunk_stays, non_vital and the parameters; not of ``workers``)
    target_rows : instead of ``stays``, add chunks of stays until chartevents has at least this
        many rows
    fmt : "csv.gz" (as distributed; written as concatenated gzip members) or "parquet"
    params : calibration parameters (dict or JSON path, from ``--calibrate``); None: the
        committed default ``cohort/synthetic/synthetic_params.json``
    short_stay_share : share of stays under 48 h (None: the calibrated share)
    workers : processes generating chunks (None: every core; 1: in this process)
    chunk_stays : stays per chunk (the unit of randomness, work and memory)
    non_vital : also write the non-vital itemids' rows (≈ 89 % of chartevents); False writes the
        vital rows only — the same vital rows, so the build gives the same warehouse

    Physiology: a copula onto the demo's marginals of a between-stay offset, a slow diagonal VAR(1)
    and heavy-tailed (multivariate t) hour-to-hour variation, with the demo's between-stay
    covariance, within-stay correlation, lag structure, per-vital observed-hour shares, all-vital
    charting gaps, rows per charted hour and stay lengths (with a long-stay tail up to 10,000 h). No
    episode is injected: deterioration events are the build's threshold crossings of these values
    (``cohort.constants.EVENT_THRESHOLDS``), and SpO₂ is coupled to HR/RR only through the demo's
    weak correlations and the shared size of large hourly moves.

    Charting: °F (223761) and °C (223762) temperature, arterial and non-invasive BP in the same hour,
    charting gaps, implausible values (HR 0, SpO₂ 29, ...), a Celsius-charted value that is plainly
    °F, ``valuenum`` null with text in ``value``, duplicated charttimes, rows before intime and after
    outtime, stays under 48 h, stays that never record a vital — and, as in the real file, mostly
    rows of other itemids (ventilator settings, GCS, alarms, rhythm, lab values): about 46 per ICU
    hour, so the nine vital itemids are ≈ 11 % of chartevents, as in MIMIC-IV.

    Scale: stays are generated in chunks of ``chunk_stays`` by array operations
    (:mod:`cohort.synthetic.chunk`) in ``workers`` processes (default: every core); the writer
    appends the chunks in order (:mod:`cohort.synthetic.files`). Chunk ``c`` draws from
    ``SeedSequence(seed, spawn_key=(c,))``, so the output is a deterministic function of (seed,
    stays or rows, chunk_stays, vitals-only, parameters). Memory is bounded by a few chunks per
    worker. ``synthetic_manifest.json`` labels the output ``"source_kind": "synthetic"``.
    """
    if fmt not in ("csv.gz", "parquet"):
        raise BadParameterError(f"fmt must be 'csv.gz' or 'parquet', got {fmt!r}")
    if (stays is None) == (target_rows is None):
        raise BadParameterError("give exactly one of stays, target_rows")
    if stays is not None and int(stays) < 1:
        raise BadParameterError(f"stays must be >= 1, got {stays}")
    if target_rows is not None and int(target_rows) < 1:
        raise BadParameterError(f"target_rows must be >= 1, got {target_rows}")
    if short_stay_share is not None and not 0.0 <= short_stay_share < 1.0:
        raise BadParameterError(f"short_stay_share must be in [0, 1), got {short_stay_share}")
    if int(chunk_stays) < 1:
        raise BadParameterError(f"chunk_stays must be >= 1, got {chunk_stays}")
    if workers is not None and int(workers) < 1:
        raise BadParameterError(f"workers must be >= 1, got {workers}")
    prm = load_params(params)
    model = Model(prm)
    t0, c0 = time.perf_counter(), _cpu_s()
    out = Path(out_dir)
    n_chunks = None if stays is None else -(-int(stays) // int(chunk_stays))
    n_work = int(workers or os.cpu_count() or 1)
    if n_chunks is not None:
        n_work = max(1, min(n_work, n_chunks))
    for old in list(out.glob("icu/*")) + list(out.glob("hosp/*")):
        if old.is_file() and old.name.lstrip(".").split(".")[0] in _OUTPUT_TABLES:
            old.unlink()

    def chunk_range(c: int) -> tuple[int, int]:
        k0 = c * int(chunk_stays)
        return k0, int(chunk_stays) if stays is None else min(int(chunk_stays), int(stays) - k0)

    def more(c: int, rows: int) -> bool:
        return c < n_chunks if n_chunks is not None else rows < int(target_rows or 0)

    writer = ChartWriter(out / "icu" / "chartevents", CHARTEVENTS_SCHEMA, fmt)
    bar = _Progress(progress, None if stays is None else int(stays), target_rows)
    acc: list[dict] = []
    n_rows = n_vital = n_done = 0
    res_cpu: dict[int, float] = {}
    res_rss: list[float] = []
    spool_dir = None
    small: list[Path] = []
    try:
        if n_work == 1:
            c = 0
            while more(c, n_rows):
                t, st = chunk_table(seed, c, *chunk_range(c), model, short_stay_share, non_vital)
                writer.write_table(t)
                n_rows, n_vital, n_done = n_rows + t.num_rows, n_vital + _n_vital(t), n_done + st["k"].size
                acc.append(st)
                c += 1
                bar.update(n_rows, n_done)
        else:
            spool_dir = tempfile.mkdtemp(prefix=f"{_SPOOL_PREFIX}{os.getpid()}-", dir=_spool_root(out))
            value_table()  # built once here, inherited by forked workers
            ctx = _mp_context()
            with ProcessPoolExecutor(n_work, mp_context=ctx, initializer=_init_worker, initargs=(prm,)) as pool:
                pending: deque = deque()
                nxt = 0
                try:
                    while True:
                        # keep every worker busy plus two chunks ready for the writer (bounded memory)
                        while len(pending) < n_work + 2 and (n_chunks is None or nxt < n_chunks):
                            pending.append(pool.submit(_job, seed, nxt, *chunk_range(nxt), short_stay_share,
                                                       non_vital, fmt, spool_dir))
                            nxt += 1
                        if not pending or not more(len(acc), n_rows):
                            break
                        r = pending.popleft().result()
                        writer.write_spool(Path(r["spool"]))
                        n_rows, n_vital = n_rows + r["rows"], n_vital + r["vital_rows"]
                        n_done += r["stays"]["k"].size
                        acc.append(r["stays"])
                        res_cpu[r["pid"]] = max(res_cpu.get(r["pid"], 0.0), r["cpu"])
                        res_rss.append(r["rss"])
                        bar.update(n_rows, n_done)
                finally:
                    for f in pending:
                        f.cancel()
        # the small tables first, chartevents renamed into place last: a crash leaves no root
        merged = {k: np.concatenate([s[k] for s in acc]) for k in STAY_KEYS}
        for rel, table in small_tables(merged, d_items_rows()).items():
            small.append(write_table(out / rel, table, fmt))
        writer.commit()
    except BaseException:
        writer.abort()
        for f in small:
            f.unlink(missing_ok=True)
        raise
    finally:
        if spool_dir is not None:
            shutil.rmtree(spool_dir, ignore_errors=True)
    n_stays = int(merged["k"].size)
    bar.update(n_rows, n_stays, final=True)
    (out / "synthetic_manifest.json").write_text(json.dumps(
        {"generator": "cohort.synthetic", "source_kind": "synthetic", "seed": seed, "stays": n_stays,
         "chartevents_rows": n_rows, "vital_rows": n_vital, "format": fmt, "chunk_stays": int(chunk_stays),
         "non_vital": bool(non_vital), "model": prm.get("model"), "calibrated_from": prm.get("calibrated_from"),
         "params": "default" if params is None else ("dict" if isinstance(params, dict) else str(params)),
         "short_stay_share": model.short_share if short_stay_share is None else short_stay_share,
         "note": "synthetic data in the MIMIC-IV v3.1 native layout; no real patient"}, indent=1))
    cpu = _cpu_s() - c0 + sum(res_cpu.values())
    rss = {"writer": round(_peak_rss_mb(), 1)}
    if res_rss:
        rss["worker_max"] = round(max(res_rss), 1)
    return GenerateSummary(out, n_stays, n_rows, time.perf_counter() - t0, fmt, n_vital, n_work, cpu, rss)


#: Short-stay share of :func:`make_small_warehouse`: kept at the pre-calibration 28 % so that
#: other packages' small test warehouses keep about 70 % of their generated stays.
SMALL_WAREHOUSE_SHORT_SHARE = 0.28


def make_small_warehouse(tmp_dir: str | Path, stays: int = 40, seed: int = 0) -> Path:
    """Generate ``stays`` synthetic stays under ``tmp_dir/mimic`` and build
    ``tmp_dir/warehouse.duckdb`` from them (quiet). For other packages' tests; no pytest needed."""
    from cohort.build import build_warehouse

    tmp = Path(tmp_dir)
    generate(tmp / "mimic", stays=stays, seed=seed, fmt="parquet", short_stay_share=SMALL_WAREHOUSE_SHORT_SHARE)
    s = build_warehouse("mimic", tmp / "mimic", tmp / "warehouse.duckdb", seed=seed, progress=False, memory_limit="1GB")
    return s.warehouse
