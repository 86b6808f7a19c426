"""Scale benchmark: generate N synthetic chartevents rows, build the warehouse, report JSON.

    python -m cohort.bench --rows 10000000 [--format parquet|csv.gz] [--memory-limit 2GB]
        [--repeat N] [--workdir DIR] [--keep] [--reuse-data] [--json-out FILE]

Generation and each build run in a child process that reports its own peak RSS
(``getrusage(RUSAGE_SELF).ru_maxrss``), so the build's figure is not polluted by the generator.
rows/s = chartevents rows / build wall time (the build scans every row of chartevents).
With ``--repeat N`` the build runs N times on the same data; ``rows_per_s`` and
``build_seconds`` are the medians, ``build_peak_rss_mb`` the largest, and every run is listed
with its CPU seconds (user + system, all threads) and the 1-minute load average before it:
on a shared machine wall time swings with the load, CPU seconds much less. ``--reuse-data`` with
``--workdir`` skips generation when that folder already holds data from the same
(rows, seed, format).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _dir_bytes(p: Path) -> int:
    return sum(f.stat().st_size for f in Path(p).rglob("*") if f.is_file())


def _child(argv: list[str]) -> dict:
    res = subprocess.run([sys.executable, "-m", "cohort.bench", *argv], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"bench child failed: {res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_bench(rows: int, workdir: Path, fmt: str = "parquet", memory_limit: str = "2GB", seed: int = 0,
              threads: int | None = None, repeat: int = 1, reuse_data: bool = False) -> dict:
    data, wh = workdir / "mimic", workdir / "warehouse.duckdb"
    stamp = workdir / "bench_data.json"
    want = {"rows": rows, "seed": seed, "format": fmt}
    g = None
    if reuse_data and stamp.is_file():
        old = json.loads(stamp.read_text())
        if {k: old.get(k) for k in want} == want:
            g = old["generated"]
    if g is None:
        stamp.unlink(missing_ok=True)
        g = _child(["--_gen", str(data), "--rows", str(rows), "--format", fmt, "--seed", str(seed)])
        stamp.write_text(json.dumps({**want, "generated": g}))
    runs = []
    for _ in range(max(1, repeat)):
        load = os.getloadavg()[0]
        b = _child(["--_build", str(data), "--warehouse", str(wh), "--memory-limit", memory_limit]
                   + (["--threads", str(threads)] if threads else []))
        runs.append({"build_seconds": round(b["seconds"], 2), "rows_per_s": round(g["rows"] / b["seconds"]),
                     "build_cpu_seconds": round(b["cpu_seconds"], 2),
                     "build_peak_rss_mb": round(b["peak_rss_mb"], 1), "load_avg_1min_before": round(load, 2)})
    secs = statistics.median(r["build_seconds"] for r in runs)
    return {
        "chartevents_rows": g["rows"], "stays_generated": g["stays"], "format": fmt,
        "generate_seconds": round(g["seconds"], 2), "generate_peak_rss_mb": round(g["peak_rss_mb"], 1),
        "build_seconds": secs, "build_cpu_seconds": statistics.median(r["build_cpu_seconds"] for r in runs),
        "rows_per_s": round(statistics.median(r["rows_per_s"] for r in runs)),
        "build_peak_rss_mb": max(r["build_peak_rss_mb"] for r in runs), "memory_limit": memory_limit,
        "cohort_stays": b["n_stays"], "hourly_rows": b["n_rows"],
        "input_bytes": _dir_bytes(data), "warehouse_bytes": wh.stat().st_size,
        "cpu_count": os.cpu_count(), "seed": seed, "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cohort.bench", description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--format", choices=["parquet", "csv.gz"], default="parquet")
    p.add_argument("--memory-limit", default="2GB")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=None)
    p.add_argument("--keep", action="store_true", help="keep the work folder (data and warehouse)")
    p.add_argument("--repeat", type=int, default=1, help="build N times on the same data; report medians")
    p.add_argument("--reuse-data", action="store_true",
                   help="with --workdir: reuse data generated there for the same rows/seed/format")
    p.add_argument("--json-out", default=None)
    p.add_argument("--_gen", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_build", default=None, help=argparse.SUPPRESS)
    p.add_argument("--warehouse", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a._gen:
        from .synthetic import generate

        s = generate(a._gen, target_rows=a.rows, seed=a.seed, fmt=a.format, progress=False)
        print(json.dumps({"rows": s.n_chartevents, "stays": s.n_stays, "seconds": s.seconds,
                          "peak_rss_mb": _peak_rss_mb()}))
        return 0
    if a._build:
        from .build import build_warehouse

        t, c = time.perf_counter(), _cpu_seconds()
        b = build_warehouse("mimic", a._build, a.warehouse, memory_limit=a.memory_limit, progress=False,
                            threads=a.threads)
        print(json.dumps({"seconds": time.perf_counter() - t, "cpu_seconds": _cpu_seconds() - c, "n_stays": b.n_stays,
                          "n_rows": b.n_rows, "peak_rss_mb": _peak_rss_mb()}))
        return 0
    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="cohort-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        out = run_bench(a.rows, work, a.format, a.memory_limit, a.seed, a.threads, a.repeat, a.reuse_data)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(out, indent=1)
    print(text)
    if a.json_out:
        Path(a.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json_out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
