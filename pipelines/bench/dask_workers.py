"""Does ``--dask`` pay? The retention study on the same stays, local vs 1 vs 2 Dask worker processes.

``python -m pipelines.bench.dask_workers --stays 1000 [--repeats 3] [--sensitivity-stays N] [--json OUT]``
runs ``forgetful retention --stays N`` in this process, ``repeats`` times per mode, the modes
interleaved (``local``: the default thread pool; ``dask-1`` / ``dask-2``: a ``LocalCluster`` of 1 or
2 worker processes), each run's timeline and chunks recorded (:func:`run` states the protocol).
From each ``dask-1`` run's measured chunks it computes what 2 workers could reach with that work
(:func:`ideals`). ``--table FILE …`` prints the tables from result files; ``--readme docs/DASK.md``
writes them between its ``bench_dask`` markers.
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

from dashboards.numbers import md_table, spread
from sv_core.jsonfile import write_json, write_marked_block

MODES = ("local", "dask-1", "dask-2")
BEGIN, END = "<!-- bench_dask:begin -->", "<!-- bench_dask:end -->"
#: the result files the README's bench_dask block is rendered from (``--table … --readme README.md``)
README_RESULTS = ("docs/results/bench_dask.json", "docs/results/bench_dask_seed1.json")
PHASES = {"stay batches": "batches", "refit audit": "audit", "sensitivity": "sensitivity"}


def _warehouse(stays: int, folder: Path, seed: int = 0) -> str:
    from cohort.synthetic import make_small_warehouse
    from pipelines.store import warehouse as wh

    n = int(stays * 1.5) + 20  # about 70 % of generated stays are eligible
    w = str(make_small_warehouse(folder / "src", stays=n, seed=seed))
    if len(wh.stays(w)) < stays:
        raise SystemExit(f"the generated warehouse has {len(wh.stays(w))} eligible stays, fewer than {stays}")
    return w


def _spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def _phase_name(desc: str) -> str:
    return next((short for key, short in PHASES.items() if key in desc), "pilot" if desc == "pilot" else desc)


def timeline(log: list[dict], t0: float, t1: float, hours: dict[int, int]) -> dict:
    """One run's :func:`pipelines.runtime.scaleout.chunk_log` as seconds from the run's start: the pilot,
    each chunk phase (wall, chunks, measured work, its LPT makespan on 1 and 2 workers) and the
    flow's own seconds outside the chunk phases (``flow_s``: start-up, planning, the comparison,
    staging the gates, the result; the run less ``pool_s``, the union of the chunk phases' spans,
    which overlap when they share one pool). Per chunk: stays, hours (sum, max), estimated and measured
    seconds, worker, start/end/received; aggregates only (no stay ids)."""
    from pipelines.runtime.scaleout import lpt_makespan, makespan_bound
    from pipelines.runtime.task_cache import covered

    phases = []
    for rec in log:
        chunks = []
        for c in rec["chunks"]:
            h = [hours.get(int(s), 0) for s in c["stay_ids"]]
            rel = {k: (None if c.get(k) is None else round(c[k] - t0, 3))
                   for k in ("submitted", "start", "end", "received")}
            chunks.append({"stays": len(h), "hours_sum": sum(h), "hours_max": max(h, default=0),
                           "predicted_s": c.get("predicted_s"), "seconds": c.get("seconds"), "cpu_s": c.get("cpu_s"),
                           "worker": c.get("worker"), **rel})
        secs = [c["seconds"] for c in chunks if c["seconds"] is not None]
        measured = len(secs) == len(chunks) and bool(chunks)
        phases.append({"phase": _phase_name(rec["desc"]), "executor": rec["executor"],
                       "start": round(rec["start"] - t0, 3), "wall_s": rec["end"] - rec["start"], "chunks": chunks,
                       "work_s": sum(secs) if measured else None,
                       "lpt_1_s": lpt_makespan(secs, 1) if measured else None,
                       "lpt_2_s": lpt_makespan(secs, 2) if measured else None,
                       "bound_2_s": makespan_bound(secs, 2) if measured else None})
    total = t1 - t0
    # the chunk phases may share one pool (pipelines.runtime.scaleout.map_phases): their union is the pool's wall
    pool_s = covered([(p["start"], p["start"] + p["wall_s"]) for p in phases if p["phase"] != "pilot"])
    flow_s = total - pool_s
    out = {"seconds": total, "flow_s": flow_s, "pool_s": pool_s, "phases": phases}
    maps = [p for p in phases if p["phase"] != "pilot"]
    if maps and all(p["lpt_2_s"] is not None for p in maps):
        out["ideal_2_s"] = flow_s + sum(p["lpt_2_s"] for p in maps)
    return out


def _single(p: dict) -> float:
    """The phase's longest single-stay chunk (a stay is never split), 0 without one."""
    return max((c["seconds"] for c in p["chunks"] if c["stays"] == 1), default=0.0)


def ideals(runs: list[dict]) -> dict | None:
    """What 2 worker processes could reach with each ``dask-1`` run's measured work (median and
    range over runs of the time and of the run's seconds over it):

    * ``bound``: the run's flow-side seconds plus, per chunk phase, ``max(longest single stay,
      work / 2)`` (chunks of several stays can be cut finer, a stay cannot); ``batches``: the
      stay-batch phase alone, its wall over that bound;
    * ``lpt``: the flow-side seconds plus the longest-first schedule of the run's own chunks on 2
      workers, per phase (those chunks as they are);
    * ``overlapped``: as ``bound``, with all chunk phases as one pool (the audit and sensitivity
      chunks filling the stay batches' tail: the flow would start them without waiting)."""
    xs = []
    for x in runs:
        maps = [p for p in x["phases"] if p["phase"] != "pilot"]
        if x["mode"] != "dask-1" or not maps or any(p["work_s"] is None for p in maps):
            continue
        b = {p["phase"]: max(_single(p), p["work_s"] / 2) for p in maps}
        bound = x["flow_s"] + sum(b.values())
        lpt = x["flow_s"] + sum(p["lpt_2_s"] for p in maps)
        over = x["flow_s"] + max(max(_single(p) for p in maps), sum(p["work_s"] for p in maps) / 2)
        bw = sum(p["wall_s"] for p in maps if p["phase"] == "batches")
        xs.append({"bound": bound, "lpt": lpt, "overlapped": over, "seconds": x["seconds"],
                   "batches": bw / b["batches"] if b.get("batches") else None})
    if not xs:
        return None
    out = {k: {"seconds": _spread([x[k] for x in xs]), "speedup_vs_dask-1": _spread([x["seconds"] / x[k] for x in xs])}
           for k in ("bound", "lpt", "overlapped")}
    if all(x["batches"] for x in xs):
        out["bound"]["batches_speedup_vs_dask-1"] = _spread([x["batches"] for x in xs])
    return out


def contention(runs: list[dict]) -> dict | None:
    """How the chunks ran on the workers, from the runs' chunk records (median and range over rounds):

    * ``work_ratio`` / ``cpu_ratio``: a ``dask-2`` run's chunk seconds (CPU seconds) summed, over
      the same round's ``dask-1`` run's — the same chunk work, so above 1 when two busy worker
      processes slow each other (shared caches, memory bandwidth, the host's other load);
    * ``gaps_s``: per worker of a Dask run, the seconds between one chunk's end and its next
      chunk's start (the round trip to the scheduler: one chunk in flight per worker)."""
    def work(x: dict, key: str) -> float | None:
        cs = [c.get(key) for p in x["phases"] if p["phase"] != "pilot" for c in p["chunks"]]
        return None if not cs or any(v is None for v in cs) else float(sum(cs))

    one = {x["round"]: x for x in runs if x["mode"] == "dask-1"}
    pairs = [(x, one[x["round"]]) for x in runs if x["mode"] == "dask-2" and x["round"] in one]
    out: dict = {}
    for name, key in (("work_ratio", "seconds"), ("cpu_ratio", "cpu_s")):
        rs = [work(a, key) / work(b, key) for a, b in pairs if work(a, key) and work(b, key)]
        if rs:
            out[name] = _spread(rs)
    gaps = []
    for x in runs:
        if not x["mode"].startswith("dask"):
            continue
        by: dict = {}
        for p in x["phases"]:
            for c in p["chunks"] if p["phase"] != "pilot" else ():
                if c.get("start") is not None and c.get("end") is not None:
                    by.setdefault(c.get("worker"), []).append((c["start"], c["end"]))
        for spans in by.values():
            spans.sort()
            gaps.append(sum(max(0.0, b[0] - a[1]) for a, b in zip(spans, spans[1:])))
    if gaps:
        out["gaps_s"] = _spread(gaps)
    return out or None


def _largest(runs: list[dict]) -> dict | None:
    """The largest stay-batch chunk of the median ``dask-1`` run: its stays, hours and share of the phase's work."""
    ones = sorted((r for r in runs if r["mode"] == "dask-1"), key=lambda r: r["seconds"])
    if not ones:
        return None
    run = ones[len(ones) // 2]
    ph = next((p for p in run["phases"] if p["phase"] == "batches" and p["work_s"]), None)
    if ph is None:
        return None
    big = max(ph["chunks"], key=lambda c: c["seconds"])
    work = sum(p["work_s"] or 0.0 for p in run["phases"] if p["phase"] != "pilot")
    return {"stays": big["stays"], "hours_max": big["hours_max"], "seconds": big["seconds"],
            "share_of_batches_work": big["seconds"] / ph["work_s"], "batches_work_s": ph["work_s"],
            "share_of_chunk_work": big["seconds"] / work if work else None, "chunk_work_s": work,
            "share_of_command": big["seconds"] / run["seconds"]}


def dominance(big: dict | None) -> str:
    """A sentence when one stay is at least half of all chunk work (batches, audit, sensitivity):
    then it alone sets the 2-worker time of the chunk phases, whatever the scheduler does."""
    share = (big or {}).get("share_of_chunk_work")
    if big is None or share is None or big["stays"] != 1 or share < 0.5:
        return ""
    return (f"; **the longest stay dominates this set**: one {big['hours_max']:,}-hour stay is "
            f"{100 * share:.0f} % of all chunk work (median dask-1 run), so the chunk phases on 2 workers can be "
            f"at most {1 / share:.2f}× faster than on 1, not 2×")


def run(stays: int, repeats: int, warehouse: str | None = None, sensitivity_stays: int = 200,
        warehouse_seed: int = 0) -> dict:
    """The benchmark; returns the result dict.

    Modes, interleaved (order rotated each round): ``local`` (the default thread pool, 2 threads);
    ``dask-1`` / ``dask-2`` (a ``LocalCluster`` of 1 or 2 worker processes, 1 thread each, started
    before the run and closed after it, so that no idle cluster shares the cores with the measured
    one; its start-up and an untimed warm-up run on it, 16 stays: the workers' imports, are not
    timed). The retention command runs with its defaults (refit audit, sensitivity table, gates
    persisted). One untimed local warm-up run comes first (16 stays: the API server, this process's
    imports). The task cache is cleared before every run (nothing is served from an earlier run).
    Without ``warehouse`` a synthetic warehouse (``warehouse_seed``, enough stays for ``stays``
    eligible ones) is generated in a temporary folder.

    Each run is recorded with :func:`pipelines.runtime.scaleout.chunk_log`: its timeline (start-up,
    the pilot, every chunk phase — stay batches, refit audit, sensitivity — the flow's own work
    between and after them) and, on Dask, every chunk's stays (count, hours), estimated and measured
    seconds, worker and start/end. :func:`ideals` computes, from each ``dask-1`` run's chunks and
    independent of the machine's load, its flow-side seconds plus, per phase, the work halved (a
    stay never split), the longest-first (LPT) schedule of its own chunks, and the bound with the
    audit and sensitivity chunks overlapping the stay batches. The result holds the runs, the
    median and range per mode, the paired speed-ups (median and range over rounds), those bounds,
    the largest chunk's share of the work and whether every run's retention metrics were identical.
    """
    from distributed import LocalCluster
    from prefect_dask import DaskTaskRunner

    from pipelines.flows.clinical_retention import retention_flow
    from pipelines.runtime import runner, scaleout, task_cache
    from pipelines.settings import RetentionSettings
    from pipelines.store import warehouse as wh

    tmp = Path(tempfile.mkdtemp(prefix="forgetful-bench-dask-"))
    try:
        w = warehouse or _warehouse(stays, tmp, warehouse_seed)
        site = tmp / "runs"
        site.mkdir()
        wcopy = site / "warehouse.duckdb"
        shutil.copy(w, wcopy)
        hours = {int(s[0]): int(s[3]) for s in wh.stays(str(wcopy))}
        runs, metrics, cluster_s = [], {}, []

        def cluster(mode: str):
            # only the measured mode's cluster is alive while it runs: an idle cluster's workers and
            # nannies (heartbeats, memory monitors) would take CPU from the measured workers
            t = time.perf_counter()
            c = LocalCluster(n_workers=int(mode[-1]), threads_per_worker=1, processes=True,
                             dashboard_address=None, silence_logs=logging.ERROR)
            cluster_s.append(time.perf_counter() - t)
            return c

        def study(mode: str, n: int, address: str | None) -> tuple[dict, dict]:
            task_cache.clear(wcopy)
            tr = runner.make_task_runner(None, 2) if address is None else DaskTaskRunner(address=address)
            with runner.results_context(site), scaleout.chunk_log() as log:
                t0, c0 = time.time(), time.process_time()
                res = retention_flow.with_options(task_runner=tr)(
                    warehouse=str(wcopy), runs_dir=str(site), progress=False,
                    settings=RetentionSettings(stays=n, sensitivity_stays=sensitivity_stays))
                lead_cpu = time.process_time() - c0
                return res, {**timeline(log, t0, time.time(), hours), "lead_cpu_s": lead_cpu}

        study("local", min(stays, 16), None)  # warm-up, not timed: the API server, this process's imports
        for r in range(repeats):
            order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
            for mode in order:
                cl = cluster(mode) if mode.startswith("dask") else None
                try:
                    if cl is not None:  # warm-up, not timed: the workers' imports
                        study(mode, min(stays, 16), cl.scheduler_address)
                    load = os.getloadavg()[0]
                    res, tl = study(mode, stays, None if cl is None else cl.scheduler_address)
                finally:
                    if cl is not None:
                        cl.close()
                runs.append({"mode": mode, "round": r, "load_1min": load,
                             "chunks": res["config"]["chunking"]["chunks"], **tl})
                print(f"round {r} {mode:<7} {tl['seconds']:7.2f} s  (load {load:.1f})", file=sys.stderr)
                metrics.setdefault(mode, []).append(json.dumps(res["metrics"]["retention"], sort_keys=True))
        return summarise(runs, metrics, stays=stays, repeats=repeats, sensitivity_stays=sensitivity_stays,
                         warehouse_seed=None if warehouse else warehouse_seed, cluster_s=_spread(cluster_s),
                         sample_hours=_sample_hours(hours, stays))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _sample_hours(hours: dict[int, int], stays: int) -> dict:
    """The study sample's stay lengths (the command's own sample: seed 0) and the cost model's share of
    its largest stay."""
    from evaluation.clinical.sampling import sample_stays
    from pipelines.runtime.scaleout import stay_units

    ids = sample_stays(sorted(hours), stays, 0).tolist()
    h = sorted(hours[s] for s in ids)
    u = stay_units(h)
    return {"stays": len(h), "median": h[len(h) // 2], "p90": h[int(0.9 * (len(h) - 1))], "max": h[-1],
            "largest_share_model": max(u) / sum(u)}


def summarise(runs: list[dict], metrics: dict, **info) -> dict:
    repeats = info["repeats"]
    by = {m: [x["seconds"] for x in runs if x["mode"] == m] for m in MODES}
    per_round = {m: {x["round"]: x for x in runs if x["mode"] == m} for m in MODES}

    def ratio(a: str, b: str, key=lambda x: x["seconds"]) -> dict:  # how many times faster b is than a, by round
        return _spread([key(per_round[a][r]) / key(per_round[b][r]) for r in range(repeats)])

    def phase_s(x: dict, name: str) -> float:
        return sum(p["wall_s"] for p in x["phases"] if p["phase"] == name)

    return {
        "benchmark": "retention --stays N: local thread pool vs LocalCluster of 1 / 2 worker processes",
        **info, "cpu_count": os.cpu_count(), "load_1min": _spread([x["load_1min"] for x in runs]),
        "runs": runs, "seconds": {m: _spread(v) for m, v in by.items()},
        "phases": {m: {k: _spread([f(x) for x in runs if x["mode"] == m]) for k, f in (
            ("flow", lambda x: x["flow_s"]), ("pilot", lambda x: phase_s(x, "pilot")),
            ("batches", lambda x: phase_s(x, "batches")), ("audit", lambda x: phase_s(x, "audit")),
            ("sensitivity", lambda x: phase_s(x, "sensitivity")))} for m in MODES},
        "speedup": {"dask-2 vs dask-1": ratio("dask-1", "dask-2"), "dask-2 vs local": ratio("local", "dask-2"),
                    "dask-1 vs local": ratio("local", "dask-1"),
                    "batches dask-2 vs dask-1": ratio("dask-1", "dask-2", key=lambda x: phase_s(x, "batches"))},
        "ideal_2_workers": ideals(runs), "contention": contention(runs), "largest_chunk": _largest(runs),
        "identical_results": len({v for vs in metrics.values() for v in vs}) == 1,
    }


def table(result: dict) -> str:
    """The README's Markdown tables from a result file."""
    s, sp, ph = result["seconds"], result["speedup"], result["phases"]
    hd = result["sample_hours"]
    lines = [f"**{result['stays']} stays** (synthetic warehouse seed {result.get('warehouse_seed')}; stay hours median "
             f"{hd['median']}, 90th percentile {hd['p90']}, largest {hd['max']:,})"
             + dominance(result.get("largest_chunk")) + ":", ""]
    rows = []
    for m in MODES:
        vs1 = {"dask-2": (sp["dask-2 vs dask-1"], sp["batches dask-2 vs dask-1"])}.get(m)
        vl = sp.get(f"{m} vs local")
        rows.append([m, spread(s[m]), spread(ph[m]["batches"]),
                     *((spread(vs1[0], 2, "×"), spread(vs1[1], 2, "×")) if vs1 else ("—", "—")),
                     spread(vl, 2, "×") if vl else "—"])
    ide = ideals(result["runs"])  # from the runs' measured chunks (the current definition)
    if ide:
        b, o = ide["bound"], ide["overlapped"]
        rows.append(["bound, 2 workers (each dask-1 run's measured work halved per phase, a stay never split)",
                     spread(b["seconds"]), "", spread(b["speedup_vs_dask-1"], 2, "×"),
                     spread(b["batches_speedup_vs_dask-1"], 2, "×") if "batches_speedup_vs_dask-1" in b else "", ""])
        rows.append(["bound, 2 workers, the audit and sensitivity chunks overlapping the stay batches",
                     spread(o["seconds"]), "", spread(o["speedup_vs_dask-1"], 2, "×"), "", ""])
    lines += md_table(["mode", "command s", "stay-batch phase s", "vs dask-1 (command)", "vs dask-1 (stay batches)",
                       "vs local"], rows) + [""]
    lines += md_table(["mode", "flow's own s (start-up, pilot, comparison, gate staging, result)", "of which pilot s",
                       "stay batches s", "refit audit s", "sensitivity s"],
                      [[m] + [spread(ph[m][k]) for k in ("flow", "pilot", "batches", "audit", "sensitivity")]
                       for m in MODES])
    big, ld = result.get("largest_chunk"), result["load_1min"]
    con = contention(result["runs"])
    lines.append("")
    if con and "work_ratio" in con:
        lines.append(f"*Two worker processes slow each other: a dask-2 run's chunk seconds add up to "
                     f"{spread(con['work_ratio'], 2, '×')} the same round's dask-1 run's"
                     + (f" (CPU seconds {spread(con['cpu_ratio'], 2, '×')})" if "cpu_ratio" in con else "")
                     + (f"; each worker waits {spread(con['gaps_s'])} s in all between its chunks"
                        if "gaps_s" in con else "")
                     + ".*")
        lines.append("")
    lines.append(f"*{result['repeats']} interleaved rounds, {result['cpu_count']} CPUs, 1-min load "
                 f"{ld['min']:.1f}–{ld['max']:.1f}; sensitivity table on {result['sensitivity_stays']} stays; "
                 f"results identical across modes: {'yes' if result['identical_results'] else 'NO'}"
                 + (f"; largest chunk (median dask-1 run): {big['stays']} stay(s) up to {big['hours_max']:,} h, "
                    f"{big['seconds']:.1f} s = {100 * big['share_of_batches_work']:.0f} % of the stay-batch work "
                    f"({big['batches_work_s']:.1f} s)" if big else "") + "*")
    return "\n".join(lines)


def write_readme(readme: Path, text: str) -> None:
    """Replace what lies between the ``bench_dask`` markers of ``readme`` with ``text``."""
    write_marked_block(readme, BEGIN, END, text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines.bench.dask_workers",
                                description="Time the retention study locally and on 1 and 2 Dask worker processes "
                                            "(interleaved rounds, median and range), with each run's chunk timeline "
                                            "and the ideal 2-worker time from the measured chunks.")
    p.add_argument("--stays", type=int, default=1000, help="stays in the study sample (default %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (default %(default)s)")
    p.add_argument("--warehouse", default=None, help="an existing warehouse (default: a generated synthetic one)")
    p.add_argument("--warehouse-seed", type=int, default=0, metavar="S",
                   help="seed of the generated synthetic warehouse (default %(default)s)")
    p.add_argument("--sensitivity-stays", type=int, default=200, metavar="N",
                   help="the study's sensitivity-table sample (default %(default)s, as the command; 0: off)")
    p.add_argument("--json", default=None, metavar="OUT", help="write the result file here")
    p.add_argument("--table", nargs="+", default=None, metavar="FILE",
                   help="print the Markdown tables of these result files and exit")
    p.add_argument("--readme", default=None, metavar="FILE",
                   help="with --table: write the tables between the bench_dask markers of this file")
    a = p.parse_args(argv)
    if a.table:
        text = "\n\n".join(table(json.loads(Path(f).read_text())) for f in a.table)
        if a.readme:
            write_readme(Path(a.readme), text)
        print(text)
        return 0
    if a.stays < 1 or a.repeats < 1:
        p.error("--stays and --repeats must be >= 1")
    # Prefect's own API server for this process (as a command's private one: a long start on busy cores)
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    logging.getLogger("distributed").setLevel(logging.ERROR)  # the clusters' own INFO lines
    res = run(a.stays, a.repeats, a.warehouse, a.sensitivity_stays, a.warehouse_seed)
    if a.json:
        write_json(a.json, res, indent=1)
    print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
