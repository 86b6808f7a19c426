"""Scale benchmarks of the warehouse build and of the synthetic generator, as JSON reports.

The build benchmark (:func:`run_bench`) generates N synthetic chartevents rows and builds the
warehouse from them; ``--generator`` (:func:`run_generator_bench`) times the generator itself;
``--peer duckdb|polars --root DIR`` (:func:`run_peer`) runs one peer of the build's essential scan
(what :mod:`pipelines.bench.scale` interleaves with the build).

    python -m cohort.bench --rows 10000000 [--format parquet|csv.gz] [--memory-limit 2GB]
        [--repeat N] [--workdir DIR] [--keep] [--reuse-data] [--json-out FILE]
    python -m cohort.bench --generator [--sizes 5000000 20000000 50000000] [--workers-list 1 2]
        [--repeat 3] [--format parquet|csv.gz] [--workdir DIR] [--json-out FILE]
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


def _peer_filters() -> tuple[str, str, str]:
    """(itemid VALUES rows, converted-value SQL, plausible-range SQL) of the peers, from the seed's
    tables. The itemids are joined as a VALUES list, as the build's scan does (there an ``IN`` list
    ran as a MARK join over every row; in this query DuckDB plans both alike)."""
    from cohort.constants import CELSIUS_ITEMID, FAHRENHEIT_ITEMID, ITEMIDS, PLAINLY_FAHRENHEIT_ABOVE, PLAUSIBLE

    ids = ", ".join(f"({i})" for i in ITEMIDS)
    value = (f"CASE WHEN itemid = {FAHRENHEIT_ITEMID} OR (itemid = {CELSIUS_ITEMID} AND valuenum > "
             f"{PLAINLY_FAHRENHEIT_ABOVE}) THEN (valuenum - 32.0) * 5.0 / 9.0 ELSE valuenum END")
    ok = " ".join(f"WHEN {i} THEN value BETWEEN {PLAUSIBLE[v][0]} AND {PLAUSIBLE[v][1]}"
                  for i, (v, _, _) in ITEMIDS.items())
    return ids, value, f"CASE itemid {ok} ELSE false END"


def _root_table(root: Path, rel: str) -> Path:
    for ext in (".parquet", ".csv.gz", ".csv"):
        p = Path(root) / f"{rel}{ext}"
        if p.is_file():
            return p
    raise FileNotFoundError(f"no {rel} table under {root}")


def peer_duckdb_sql(root: Path, min_hours: float = 48) -> str:
    """The DuckDB peer: one SQL statement returning (groups, Σ hourly means)."""
    csv_types = {"icu/icustays": "{'stay_id': 'BIGINT', 'intime': 'TIMESTAMP', 'outtime': 'TIMESTAMP'}",
                 "icu/chartevents": "{'stay_id': 'BIGINT', 'itemid': 'BIGINT', 'charttime': 'TIMESTAMP', "
                                    "'value': 'VARCHAR', 'valuenum': 'DOUBLE'}"}

    def reader(rel):
        p = _root_table(root, rel)
        if p.name.endswith(".parquet"):
            return f"read_parquet('{p}')"
        return f"read_csv('{p}', header=true, types={csv_types[rel]})"

    ids, value, ok = _peer_filters()
    return f"""
        WITH s AS (SELECT stay_id, epoch_us(intime) AS in_us, epoch_us(outtime) AS out_us
                   FROM {reader("icu/icustays")}
                   WHERE epoch_us(outtime) - epoch_us(intime) >= {int(round(min_hours * 3_600_000_000))}),
        m AS (SELECT ce.stay_id, ce.itemid, (epoch_us(ce.charttime) - s.in_us) // 3600000000 AS hour,
                     {value.replace("itemid", "ce.itemid").replace("valuenum", "ce.valuenum")} AS value
              FROM {reader("icu/chartevents")} AS ce JOIN s ON ce.stay_id = s.stay_id
              JOIN (VALUES {ids}) AS vi(itemid) ON ce.itemid = vi.itemid
              WHERE ce.valuenum IS NOT NULL AND epoch_us(ce.charttime) BETWEEN s.in_us AND s.out_us),
        g AS (SELECT stay_id, hour, itemid, avg(value) AS mean FROM m WHERE {ok} GROUP BY ALL)
        SELECT count(*), sum(mean) FROM g"""


def peer_polars(root: Path, min_hours: float = 48) -> tuple[int, float]:
    """The Polars lazy peer (parquet roots): (groups, Σ hourly means), streaming engine."""
    import polars as pl

    from cohort.constants import CELSIUS_ITEMID, FAHRENHEIT_ITEMID, ITEMIDS, PLAINLY_FAHRENHEIT_ABOVE, PLAUSIBLE

    ce_path, st_path = _root_table(root, "icu/chartevents"), _root_table(root, "icu/icustays")
    if not (ce_path.name.endswith(".parquet") and st_path.name.endswith(".parquet")):
        raise ValueError("the Polars peer reads parquet roots only")
    us = pl.col("outtime").dt.epoch("us") - pl.col("intime").dt.epoch("us")
    stays = (pl.scan_parquet(st_path).select("stay_id", "intime", "outtime")
             .filter(us >= int(round(min_hours * 3_600_000_000))))
    item, num = pl.col("itemid"), pl.col("valuenum")
    value = (pl.when((item == FAHRENHEIT_ITEMID) | ((item == CELSIUS_ITEMID) & (num > PLAINLY_FAHRENHEIT_ABOVE)))
             .then((num - 32.0) * 5.0 / 9.0).otherwise(num))
    ok = pl.lit(False)
    for i, (v, _, _) in ITEMIDS.items():
        lo, hi = PLAUSIBLE[v]
        ok = pl.when(item == i).then(pl.col("value").is_between(lo, hi)).otherwise(ok)
    q = (pl.scan_parquet(ce_path).select("stay_id", "charttime", "itemid", "valuenum")
         .filter(item.is_in(list(ITEMIDS)) & num.is_not_null())
         .join(stays, on="stay_id")
         .filter(pl.col("charttime").is_between(pl.col("intime"), pl.col("outtime")))
         .with_columns(hour=(pl.col("charttime").dt.epoch("us") - pl.col("intime").dt.epoch("us")) // 3_600_000_000,
                       value=value)
         .filter(ok)
         .group_by("stay_id", "hour", "itemid").agg(mean=pl.col("value").mean()))
    out = q.collect(engine="streaming")
    return out.height, float(out["mean"].sum())


def run_peer(kind: str, root: Path, threads: int | None = None) -> dict:
    """Run one peer in this process: groups, checksum, seconds, CPU seconds and peak RSS.

    Every chartevents row of the nine vital itemids with a number, joined to the stays of LOS ≥ 48 h,
    kept within [intime, outtime] and in the plausible range after the °F conversion, averaged per
    (stay, hour, itemid) — a plain DuckDB SQL ``GROUP BY`` or a Polars lazy query (``scan_parquet`` …
    ``group_by`` … ``collect(engine="streaming")``). Both materialise every group's mean; the count
    and checksum (Σ of the means) show they did the same work.
    """
    t, c = time.perf_counter(), _cpu_seconds()
    if kind == "duckdb":
        import duckdb

        con = duckdb.connect(":memory:")
        if threads:
            con.execute(f"SET threads = {int(threads)}")
        row = con.execute(peer_duckdb_sql(Path(root))).fetchone()
        con.close()
        assert row is not None  # an aggregate without GROUP BY always returns one row
        groups, total = row
    elif kind == "polars":
        if threads:
            os.environ["POLARS_MAX_THREADS"] = str(int(threads))  # read at Polars' import
        groups, total = peer_polars(Path(root))
    else:
        raise ValueError(f"unknown peer {kind!r}; expected duckdb or polars")
    return {"peer": kind, "groups": int(groups), "checksum": round(float(total or 0.0), 3),
            "seconds": time.perf_counter() - t, "cpu_seconds": _cpu_seconds() - c, "peak_rss_mb": _peak_rss_mb()}


def run_bench(rows: int, workdir: Path, fmt: str = "parquet", memory_limit: str = "2GB", seed: int = 0,
              threads: int | None = None, repeat: int = 1, reuse_data: bool = False) -> dict:
    """Generation and each build run in a child process that reports its own peak RSS
    (``getrusage(RUSAGE_SELF).ru_maxrss``), so the build's figure is not polluted by the generator.
    rows/s = chartevents rows / build wall time (the build scans every row of chartevents). With
    ``repeat`` N the build runs N times on the same data; ``rows_per_s`` and ``build_seconds`` are the
    medians, ``build_peak_rss_mb`` the largest, and every run is listed with its CPU seconds (user +
    system, all threads) and the 1-minute load average before it: on a shared machine wall time
    swings with the load, CPU seconds much less. ``reuse_data`` skips generation when ``workdir``
    already holds data from the same (rows, seed, format).
    """
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
        "generate_seconds": round(g["seconds"], 2), "generate_peak_rss_mb": g["peak_rss_mb"],
        "build_seconds": secs, "build_cpu_seconds": statistics.median(r["build_cpu_seconds"] for r in runs),
        "rows_per_s": round(statistics.median(r["rows_per_s"] for r in runs)),
        "build_peak_rss_mb": max(r["build_peak_rss_mb"] for r in runs), "memory_limit": memory_limit,
        "cohort_stays": b["n_stays"], "hourly_rows": b["n_rows"],
        "input_bytes": _dir_bytes(data), "warehouse_bytes": wh.stat().st_size,
        "cpu_count": os.cpu_count(), "seed": seed, "runs": runs,
    }


def run_generator_bench(sizes: list[int], workers_list: list[int], workdir: Path, repeat: int = 3,
                        fmt: str = "parquet", seed: int = 0) -> dict:
    """Generator throughput per (rows, workers): :func:`cohort.synthetic.generate` end to end
    (generation and writing), ``repeat`` times, the order reversed on every other round so that
    both sides of a comparison see the same load; per cell the median rows/s with its min and max,
    CPU seconds per million rows, and the peak RSS of the writer and of the largest worker."""
    cells = [(int(n), int(w)) for n in sizes for w in workers_list]
    runs = []
    for r in range(max(1, repeat)):
        for n, w in (cells if r % 2 == 0 else cells[::-1]):
            out = workdir / f"gen-{n}-{w}"
            load = os.getloadavg()
            try:
                g = _child(["--_gen", str(out), "--rows", str(n), "--format", fmt, "--seed", str(seed),
                            "--workers", str(w)])
            finally:
                shutil.rmtree(out, ignore_errors=True)
            runs.append({"round": r, "target_rows": n, "workers": w, "rows": g["rows"], "stays": g["stays"],
                         "seconds": round(g["seconds"], 2), "rows_per_s": round(g["rows"] / g["seconds"]),
                         "cpu_seconds": round(g["cpu_seconds"], 2),
                         "cpu_s_per_mrow": round(g["cpu_seconds"] / g["rows"] * 1e6, 3),
                         "peak_rss_mb": g["peak_rss_mb"], "load_avg_before": [round(x, 2) for x in load],
                         "load_avg_after": [round(x, 2) for x in os.getloadavg()]})
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    table = []
    for n, w in cells:
        rs = [x for x in runs if x["target_rows"] == n and x["workers"] == w]
        rate = [x["rows_per_s"] for x in rs]
        table.append({"target_rows": n, "workers": w, "rows": rs[0]["rows"], "runs": len(rs),
                      "rows_per_s_median": round(statistics.median(rate)), "rows_per_s_min": min(rate),
                      "rows_per_s_max": max(rate),
                      "cpu_s_per_mrow_median": round(statistics.median(x["cpu_s_per_mrow"] for x in rs), 3),
                      "peak_rss_writer_mb": max(x["peak_rss_mb"].get("writer", 0.0) for x in rs),
                      "peak_rss_worker_mb": max(x["peak_rss_mb"].get("worker_max", 0.0) for x in rs),
                      "load_avg_1min_median": round(statistics.median(x["load_avg_before"][0] for x in rs), 2)})
    return {"kind": "generator_bench", "format": fmt, "seed": seed, "cpu_count": os.cpu_count(),
            "repeat": repeat, "table": table, "runs": runs}


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
    p.add_argument("--generator", action="store_true", help="benchmark the generator instead of the build")
    p.add_argument("--sizes", type=float, nargs="+", default=[5e6, 20e6, 50e6], help="--generator: rows")
    p.add_argument("--workers-list", type=int, nargs="+", default=[1, 2], help="--generator: worker counts")
    p.add_argument("--workers", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--peer", choices=["duckdb", "polars"], default=None,
                   help="run one peer of the build's scan on --root and print its JSON line")
    p.add_argument("--root", default=None, help="--peer: the MIMIC-layout root")
    p.add_argument("--_gen", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_build", default=None, help=argparse.SUPPRESS)
    p.add_argument("--warehouse", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a._gen:
        from cohort.synthetic import generate

        s = generate(a._gen, target_rows=a.rows, seed=a.seed, fmt=a.format, progress=False, workers=a.workers)
        print(json.dumps({"rows": s.n_chartevents, "stays": s.n_stays, "seconds": s.seconds,
                          "cpu_seconds": s.cpu_seconds, "peak_rss_mb": s.peak_rss_mb}))
        return 0
    if a.peer:
        if not a.root:
            p.error("--peer needs --root")
        print(json.dumps(run_peer(a.peer, Path(a.root), a.threads)))
        return 0
    if a._build:
        from cohort.build import build_warehouse

        t, c = time.perf_counter(), _cpu_seconds()
        b = build_warehouse("mimic", a._build, a.warehouse, memory_limit=a.memory_limit, progress=False,
                            threads=a.threads)
        print(json.dumps({"seconds": time.perf_counter() - t, "cpu_seconds": _cpu_seconds() - c, "n_stays": b.n_stays,
                          "n_rows": b.n_rows, "peak_rss_mb": _peak_rss_mb()}))
        return 0
    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="cohort-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        if a.generator:
            out = run_generator_bench([int(x) for x in a.sizes], a.workers_list, work, a.repeat, a.format, a.seed)
        else:
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
