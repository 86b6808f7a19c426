"""Does ``--dask`` pay? The retention study on the same stays, local vs 1 vs 2 Dask worker processes.

``python -m pipelines.bench_dask --stays 1000 [--repeats 3] [--sensitivity-stays N] [--json OUT]``
runs ``forgetful retention --stays N`` (its defaults: refit audit, sensitivity table, gates
persisted) in this process, ``repeats`` times per mode, the modes interleaved (order rotated each
round):

* ``local``: the default thread pool (2 threads);
* ``dask-1`` / ``dask-2``: a long-lived ``LocalCluster`` of 1 or 2 worker processes (1 thread
  each), started once before the rounds and stopped at the end.

One untimed warm-up run per mode comes first (16 stays). The task cache is cleared before every
run (nothing is served from an earlier run). Without ``--warehouse`` a synthetic warehouse (seed
0, enough stays for ``N`` eligible ones) is generated in a temporary folder. The result file
holds each run's seconds and the 1-minute load average beside it, the median and range per mode,
the paired speed-ups (median and range over rounds) and whether every run's retention metrics
were identical. ``--table FILE`` prints the README's Markdown table from a result file.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

MODES = ("local", "dask-1", "dask-2")


def _warehouse(stays: int, folder: Path) -> str:
    from cohort.synthetic import make_small_warehouse

    from . import warehouse as wh

    n = int(stays * 1.5) + 20  # about 70 % of generated stays are eligible
    w = str(make_small_warehouse(folder / "src", stays=n, seed=0))
    if len(wh.stays(w)) < stays:
        raise SystemExit(f"the generated warehouse has {len(wh.stays(w))} eligible stays, fewer than {stays}")
    return w


def _spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def run(stays: int, repeats: int, warehouse: str | None = None, sensitivity_stays: int = 200) -> dict:
    from distributed import LocalCluster
    from prefect_dask import DaskTaskRunner

    from . import runner, task_cache
    from .flows.clinical_retention import retention_flow

    tmp = Path(tempfile.mkdtemp(prefix="forgetful-bench-dask-"))
    try:
        w = warehouse or _warehouse(stays, tmp)
        site = tmp / "runs"
        site.mkdir()
        wcopy = site / "warehouse.duckdb"
        shutil.copy(w, wcopy)
        clusters = {m: LocalCluster(n_workers=int(m[-1]), threads_per_worker=1, processes=True,
                                    dashboard_address=None, silence_logs=logging.ERROR)
                    for m in MODES if m.startswith("dask")}
        runs, metrics = [], {}

        def study(mode: str, n: int) -> dict:
            task_cache.clear(wcopy)
            tr = (runner.make_task_runner(None, 2) if mode == "local"
                  else DaskTaskRunner(address=clusters[mode].scheduler_address))
            with runner.results_context(site):
                return retention_flow.with_options(task_runner=tr)(
                    warehouse=str(wcopy), runs_dir=str(site), stays=n, progress=False,
                    sensitivity_stays=sensitivity_stays)

        try:
            for mode in MODES:  # warm-up, not timed: the API server, the workers' imports
                study(mode, min(stays, 16))
            for r in range(repeats):
                order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
                for mode in order:
                    load = os.getloadavg()[0]
                    t0 = time.perf_counter()
                    res = study(mode, stays)
                    secs = time.perf_counter() - t0
                    runs.append({"mode": mode, "round": r, "seconds": secs, "load_1min": load,
                                 "chunks": res["config"]["chunking"]["chunks"]})
                    print(f"round {r} {mode:<7} {secs:7.2f} s  (load {load:.1f})", file=sys.stderr)
                    metrics.setdefault(mode, []).append(json.dumps(res["metrics"]["retention"], sort_keys=True))
        finally:
            for c in clusters.values():
                c.close()
        by = {m: [x["seconds"] for x in runs if x["mode"] == m] for m in MODES}
        per_round = {m: {x["round"]: x["seconds"] for x in runs if x["mode"] == m} for m in MODES}

        def ratio(a: str, b: str) -> dict:  # how many times faster b is than a, paired by round
            return _spread([per_round[a][r] / per_round[b][r] for r in range(repeats)])

        return {
            "benchmark": "retention --stays N: local thread pool vs LocalCluster of 1 / 2 worker processes",
            "stays": stays, "repeats": repeats, "sensitivity_stays": sensitivity_stays, "cpu_count": os.cpu_count(),
            "load_1min": _spread([x["load_1min"] for x in runs]),
            "runs": runs, "seconds": {m: _spread(v) for m, v in by.items()},
            "speedup": {"dask-2 vs dask-1": ratio("dask-1", "dask-2"), "dask-2 vs local": ratio("local", "dask-2"),
                        "dask-1 vs local": ratio("local", "dask-1")},
            "identical_results": len({v for vs in metrics.values() for v in vs}) == 1,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def table(result: dict) -> str:
    """The README's Markdown table from a result file."""
    s, sp = result["seconds"], result["speedup"]
    lines = ["| mode | seconds (median, range) | speed-up (median, range) |", "|---|---|---|"]
    ref = {"local": None, "dask-1": "dask-1 vs local", "dask-2": "dask-2 vs local"}
    for m in MODES:
        x = s[m]
        up = sp.get(ref[m]) if ref[m] else None
        lines.append(f"| {m} | {x['median']:.1f} ({x['min']:.1f}–{x['max']:.1f}) | "
                     + (f"{up['median']:.2f}× vs local ({up['min']:.2f}–{up['max']:.2f})" if up else "—") + " |")
    d = sp["dask-2 vs dask-1"]
    lines.append(f"| dask-2 vs dask-1 | | {d['median']:.2f}× ({d['min']:.2f}–{d['max']:.2f}) |")
    ld = result["load_1min"]
    lines.append("")
    lines.append(f"*{result['stays']} stays (sensitivity table on {result.get('sensitivity_stays', 200)}), "
                 f"{result['repeats']} interleaved rounds, {result['cpu_count']} CPUs, "
                 f"1-min load {ld['min']:.1f}–{ld['max']:.1f}; results identical across modes: "
                 f"{ {True: 'yes', False: 'NO'}.get(result.get('identical_results'), 'not recorded')}"
                 + (f"; {result['note']}" if result.get("note") else "") + "*")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines.bench_dask",
                                description="Time the retention study locally and on 1 and 2 Dask worker processes "
                                            "(interleaved rounds, median and range).")
    p.add_argument("--stays", type=int, default=1000, help="stays in the study sample (default %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (default %(default)s)")
    p.add_argument("--warehouse", default=None, help="an existing warehouse (default: a generated synthetic one)")
    p.add_argument("--sensitivity-stays", type=int, default=200, metavar="N",
                   help="the study's sensitivity-table sample (default %(default)s, as the command; 0: off)")
    p.add_argument("--json", default=None, metavar="OUT", help="write the result file here")
    p.add_argument("--table", default=None, metavar="FILE", help="print the Markdown table of a result file and exit")
    a = p.parse_args(argv)
    if a.table:
        print(table(json.loads(Path(a.table).read_text())))
        return 0
    if a.stays < 1 or a.repeats < 1:
        p.error("--stays and --repeats must be >= 1")
    # Prefect's own API server for this process (as a command's private one: a long start on busy cores)
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    logging.getLogger("distributed").setLevel(logging.ERROR)  # the clusters' own INFO lines
    res = run(a.stays, a.repeats, a.warehouse, a.sensitivity_stays)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(res, indent=1))
    print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
