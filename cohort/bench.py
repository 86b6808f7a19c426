"""Scale benchmark: generate N synthetic chartevents rows, build the warehouse, report JSON.

    python -m cohort.bench --rows 10000000 [--format parquet|csv.gz] [--memory-limit 2GB]
        [--workdir DIR] [--keep] [--json-out FILE]

Generation and build each run in a child process that reports its own peak RSS
(``getrusage(RUSAGE_SELF).ru_maxrss``), so the build's figure is not polluted by the generator.
rows/s = chartevents rows / build wall time (the build scans every row of chartevents).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
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


def run_bench(rows: int, workdir: Path, fmt: str = "parquet", memory_limit: str = "2GB", seed: int = 0,
              threads: int | None = None) -> dict:
    data, wh = workdir / "mimic", workdir / "warehouse.duckdb"
    g = _child(["--_gen", str(data), "--rows", str(rows), "--format", fmt, "--seed", str(seed)])
    b = _child(["--_build", str(data), "--warehouse", str(wh), "--memory-limit", memory_limit]
               + (["--threads", str(threads)] if threads else []))
    return {
        "chartevents_rows": g["rows"], "stays_generated": g["stays"], "format": fmt,
        "generate_seconds": round(g["seconds"], 2), "generate_peak_rss_mb": round(g["peak_rss_mb"], 1),
        "build_seconds": round(b["seconds"], 2), "rows_per_s": round(g["rows"] / b["seconds"]),
        "build_peak_rss_mb": round(b["peak_rss_mb"], 1), "memory_limit": memory_limit,
        "cohort_stays": b["n_stays"], "hourly_rows": b["n_rows"],
        "input_bytes": _dir_bytes(data), "warehouse_bytes": wh.stat().st_size,
        "cpu_count": os.cpu_count(), "seed": seed,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cohort.bench", description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--format", choices=["parquet", "csv.gz"], default="parquet")
    p.add_argument("--memory-limit", default="2GB")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=None)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--json-out", default=None)
    p.add_argument("--_gen", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_build", default=None, help=argparse.SUPPRESS)
    p.add_argument("--warehouse", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a._gen:
        from .synthetic import generate

        s = generate(a._gen, target_rows=a.rows, seed=a.seed, fmt=a.format, progress=False)
        print(json.dumps({"rows": s.n_chartevents, "stays": s.n_stays, "seconds": s.seconds, "peak_rss_mb": _peak_rss_mb()}))
        return 0
    if a._build:
        from .build import build_warehouse

        t = time.perf_counter()
        s = build_warehouse("mimic", a._build, a.warehouse, memory_limit=a.memory_limit, progress=False, threads=a.threads)
        print(json.dumps({"seconds": time.perf_counter() - t, "n_stays": s.n_stays, "n_rows": s.n_rows,
                          "peak_rss_mb": _peak_rss_mb()}))
        return 0
    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="cohort-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        out = run_bench(a.rows, work, a.format, a.memory_limit, a.seed, a.threads)
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
