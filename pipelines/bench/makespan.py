"""Scale-out of the retention study on Dask workers, modelled from its measured chunks (issue 36).

``python -m pipelines.bench.makespan [--results FILE …] [--workers 1 2 4 8 32 128] [--json OUT]
[--into docs/SCALE.json --doc docs/SCALE.md]`` (``--render RESULT`` only re-renders).

A run on ``p`` worker processes takes ``T(p) = F(N) + pool(p)``: ``F(N) = a + b N`` the flow's own
seconds for ``N`` stays, ``pool(p)`` the list schedule of
:func:`pipelines.runtime.scaleout.map_phases` simulated (:func:`simulate`) with the real chunk
planner. :func:`calibrate` fits the constants on the measured runs, :func:`validate` predicts
every measured run, :func:`predict` gives the full cohort on 1 … 128 workers, the bound and what
limits it; the stays' hours come from the synthetic generator's own draws (:func:`stay_hours`).
"""
from __future__ import annotations

import argparse
import heapq
import json
import statistics
import sys
from pathlib import Path

import numpy as np

from pipelines.runtime.scaleout import PILOT_STAYS, plan_chunks, stay_units
from sv_core.jsonfile import write_json

PHASES = ("batches", "audit", "sensitivity")
DEFAULT_RESULTS = ("docs/results/bench_dask.json", "docs/results/bench_dask_seed1.json",
                   "docs/results/bench_dask_4000.json")
DEFAULT_WORKERS = (1, 2, 4, 8, 16, 32, 64, 128)
#: the full-size root of the run-all record (docs/SCALE.md): stays generated, generator seed
FULL_STAYS, FULL_SEED = 94_458, 0
#: the retention command's defaults (refit audit and sensitivity sample sizes)
AUDIT_STAYS, SENSITIVITY_STAYS = 50, 200
#: doubling the workers is "useful" while it cuts the predicted time by at least this factor
USEFUL_GAIN = 1.10
#: a result file whose median 1-minute load is above this (cores x 2 on the measuring machine)
#: calibrates nothing and is not compared in wall time: only its flow tail / head ratio is shown
#: beside the model's (the load slows both alike)
MAX_LOAD = 4.0


def _quiet(res: dict) -> bool:
    return float(res["load_1min"]["median"]) <= MAX_LOAD


def _factors() -> dict[str, float]:
    from pipelines.flows.retention_plan import AUDIT_COST_FACTOR, SENSITIVITY_COST_FACTOR

    return {"batches": 1.0, "audit": AUDIT_COST_FACTOR, "sensitivity": SENSITIVITY_COST_FACTOR}


def _spread(xs) -> dict:
    xs = [float(x) for x in xs]
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def _units(hours) -> float:
    return float(sum(stay_units(list(hours))))


# ------------------------------------------------------------------------------ calibration
def _dask_runs(results: list[dict]):
    for res in results:
        for run in res["runs"]:
            if run["mode"].startswith("dask"):
                yield res, run


def pilot_scale(run: dict) -> float | None:
    """The run's seconds per cost unit as its planner used them (the pilot's), read off its
    one-stay chunks: their estimate over their phase factor times the stay's units."""
    f = _factors()
    ks = [c["predicted_s"] / (f[p["phase"]] * _units([c["hours_max"]]))
          for p in run["phases"] if p["phase"] in f for c in p["chunks"] if c["stays"] == 1 and c["predicted_s"]]
    return statistics.median(ks) if ks else None


def calibrate(results: list[dict]) -> dict:
    """Fit the model's constants on the measured runs.

    ``s_phase`` and ``o`` on the ``dask-1`` runs' chunks (one worker: no sibling process), ``g`` and
    ``c`` on all Dask runs and ``κ`` (two busy processes on the 2-core machine slow each other) from
    paired rounds. Each stay's hours come from the synthetic generator's own stay draws
    (:func:`stay_hours`, no rows made): the benchmark's stay sets, and the full-size root (all
    eligible stays of the generated full-size cohort, seed 0, the run-all record's data).
    :func:`predict` works a core per worker (``κ = 1``; the ``κ`` column as on 2 shared cores).
    """
    f = _factors()
    rows, ys = [], []
    for res, run in _dask_runs(results):
        k = pilot_scale(run)
        if run["mode"] != "dask-1" or k is None or not _quiet(res):
            continue
        for p in run["phases"]:
            if p["phase"] in f:
                for c in p["chunks"]:
                    u = c["predicted_s"] / (k * f[p["phase"]])  # the chunk's cost units
                    rows.append([u if p["phase"] == q else 0.0 for q in PHASES] + [1.0])
                    ys.append(c["seconds"])
    if len(rows) < len(PHASES) + 1:
        raise SystemExit("too few measured dask-1 chunks to calibrate (run python -m pipelines.bench.dask_workers)")
    from scipy.optimize import nnls

    coef, _ = nnls(np.asarray(rows), np.asarray(ys))  # seconds per unit and per chunk, none negative
    fit = np.asarray(rows) @ coef
    gaps, lead, lead_y, kappa, head, tail, checks = [], [], [], [], [], [], []
    for res, run in _dask_runs(results):
        if not _quiet(res):
            continue
        by: dict = {}
        n = 0
        for p in run["phases"]:
            if p["phase"] in f:
                for c in p["chunks"]:
                    by.setdefault(c["worker"], []).append((c["start"], c["end"]))
                    n += 1
        for spans in by.values():
            spans.sort()
            gaps += [b[0] - a[1] for a, b in zip(spans, spans[1:])]
        if run.get("lead_cpu_s") is not None and n:
            # the flow process's CPU outside its own part: a share of the pool's time (its
            # background threads) plus a cost per completion handled
            lead.append([run["pool_s"], n])
            lead_y.append(max(0.0, run["lead_cpu_s"] - run["flow_s"]))
        if run["mode"] == "dask-2":
            one = next((r for r in res["runs"] if r["mode"] == "dask-1" and r["round"] == run["round"]), None)
            if one is not None:
                kappa.append(_work(run) / _work(one))
    for res in results:  # the flow's own part: its head (before the pool) and its tail (after it)
        for run in res["runs"]:
            h = min(p["start"] for p in run["phases"] if p["phase"] in PHASES)
            (head if _quiet(res) else []).append(h)
            (tail if _quiet(res) else []).append((run["flow_s"] - h) / res["stays"])
            if not _quiet(res):
                checks.append({"stays": res["stays"], "mode": run["mode"], "load_1min": run["load_1min"],
                               "tail_over_head": (run["flow_s"] - h) / h})
    gap = statistics.median(gaps) if gaps else 0.0
    # a completion is handled before the worker's next chunk is submitted: at most the gap
    c_med = min(float(nnls(np.asarray(lead), np.asarray(lead_y))[0][1]), gap) if lead else 0.0
    h_med, t_med = statistics.median(head), statistics.median(tail)
    for ch in checks:
        ch["model_tail_over_head"] = t_med * ch["stays"] / h_med
    return {"s_per_unit": {q: float(coef[i]) for i, q in enumerate(PHASES)}, "chunk_s": float(coef[-1]),
            "chunk_fit_rel_err": _spread(np.abs(fit - ys) / np.maximum(ys, 1e-3)), "chunks_fitted": len(ys),
            "gap_s": gap - c_med, "gap_measured": _spread(gaps) if gaps else None,
            "client_s": c_med, "kappa": _spread(kappa) if kappa else None,
            "flow": {"a_s": h_med, "b_s_per_stay": t_med, "stays": sorted({float(r["stays"]) for r in results}),
                     "checks": checks}, "max_load": MAX_LOAD}


def _work(run: dict) -> float:
    return sum(c["seconds"] for p in run["phases"] if p["phase"] in PHASES for c in p["chunks"])


# ------------------------------------------------------------------------------ workloads
def stay_hours(stays: int, seed: int, short_share: float | None) -> dict[int, int]:
    """Stay id -> hours of the eligible stays (at least 48 h, with vitals) that
    :func:`cohort.synthetic.generate` draws for ``stays`` stays: its own LOS draws, chunk by chunk,
    without generating a row (the build's hourly grid has ``ceil(LOS)`` hours)."""
    from cohort.synthetic.chunk import chunk_rngs, stay_chunk
    from cohort.synthetic.gen import CHUNK_STAYS
    from cohort.synthetic.model import Model, load_params

    model = Model(load_params(None))
    out: dict[int, int] = {}
    for c in range(-(-stays // CHUNK_STAYS)):
        k0 = c * CHUNK_STAYS
        st = stay_chunk(chunk_rngs(seed, c)[0], k0, min(CHUNK_STAYS, stays - k0), model, short_share)
        keep = (st["los_h"] >= 48.0) & ~st["never"]
        out.update(zip(st["stay_id"][keep].tolist(), np.ceil(st["los_h"][keep] - 1e-9).astype(int).tolist()))
    return out


def bench_workload(result: dict) -> dict:
    """The stay set of a ``pipelines.bench.dask_workers`` result (its generated warehouse, the
    command's seed-0 sample): ``{"ids", "hours", "audit", "sensitivity"}``."""
    from cohort.synthetic.gen import SMALL_WAREHOUSE_SHORT_SHARE
    from evaluation.clinical.sampling import sample_stays

    n = int(result["stays"])
    hours = stay_hours(int(n * 1.5) + 20, int(result["warehouse_seed"]), SMALL_WAREHOUSE_SHORT_SHARE)
    ids = sample_stays(sorted(hours), n, 0).tolist()
    return _with_side(ids, hours, int(result.get("sensitivity_stays", SENSITIVITY_STAYS)))


def full_workload() -> dict:
    """Every eligible stay of the full-size root (:data:`FULL_STAYS`, seed :data:`FULL_SEED`)."""
    hours = stay_hours(FULL_STAYS, FULL_SEED, None)
    return _with_side(sorted(hours), hours, SENSITIVITY_STAYS)


def _with_side(ids: list[int], hours: dict[int, int], sens: int) -> dict:
    """The audit and sensitivity stays as the command picks them, the first in its seeded order
    (the audit's up to its length cap); whether a stay has an event hour is not drawn here, so
    every stay counts as having one."""
    from evaluation.clinical.retention_audit import AUDIT_MAX_HOURS
    from evaluation.clinical.sampling import seeded_order

    order = seeded_order(ids, 0).tolist()
    audit = [s for s in order[:AUDIT_STAYS] if hours[s] <= AUDIT_MAX_HOURS]
    return {"ids": ids, "hours": hours, "audit": sorted(audit), "sensitivity": sorted(order[:sens])}


def chunks_for(work: dict, slots: int, cal: dict) -> list[tuple[float, float, str]]:
    """``(estimated s, modelled s, phase)`` of every chunk a run on ``slots`` workers submits
    (the pilot runs in the flow: it is part of ``F``)."""
    f, s, o = _factors(), cal["s_per_unit"], cal["chunk_s"]
    h = work["hours"]
    per = s["batches"]  # the planner's seconds per unit (its pilot's measure)
    rest = work["ids"][PILOT_STAYS:]
    out = []
    for phase, ids in (("batches", rest), ("audit", work["audit"]), ("sensitivity", work["sensitivity"])):
        for c in plan_chunks(ids, [h[x] for x in ids], per * f[phase], slots=slots) if ids else []:
            u = _units(h[x] for x in c)
            out.append((per * f[phase] * u, s[phase] * u + o, phase))
    return out


# ------------------------------------------------------------------------------ the schedule
def simulate(durations_by_estimate: list[tuple[float, float]], workers: int, gap: float, client: float) -> float:
    """Seconds from the pool's start until the flow holds the last result: chunks (``(estimate,
    duration)``) taken most expensive first, one per worker at a time, the next one started
    ``gap`` after the flow (one client, ``client`` seconds per completion, in turn) handled the
    worker's previous one.

    ``F(N) = a + b N``: the flow's head ``a`` before the pool (start-up, pilot, planning) and its
    serial tail after it (the comparison, gate staging, the result) taken as proportional to ``N``
    (an upper estimate: part of it is fixed). ``pool(p)``: the stay batches, refit audit and
    sensitivity chunks cut by the real :func:`~pipelines.runtime.scaleout.plan_chunks` for ``p``
    slots, submitted most expensive first, one in flight per worker. A chunk of ``U`` cost units
    (:func:`~pipelines.runtime.scaleout.stay_units`) takes ``s_phase U + o`` seconds; between two
    chunks a worker waits the round trip ``g``, and the flow process handles each completion in turn
    for ``c`` seconds (the per-task overhead that a large cluster queues behind one client).
    """
    todo = [d for _, d in sorted(durations_by_estimate, key=lambda x: -x[0])]
    busy = [(d + gap, w) for w, d in enumerate(todo[:workers])]  # (finish, worker)
    heapq.heapify(busy)
    nxt, free, last = min(workers, len(todo)), 0.0, 0.0
    while busy:
        t, w = heapq.heappop(busy)
        free = max(free, t) + client
        last = free
        if nxt < len(todo):
            heapq.heappush(busy, (free + gap + todo[nxt], w))
            nxt += 1
    return last


def model_time(work: dict, workers: int, cal: dict, kappa: float = 1.0) -> dict:
    """Predicted seconds of one run: flow part, pool makespan, work, longest chunk."""
    ch = chunks_for(work, workers, cal)
    pairs = [(e, d * kappa) for e, d, _ in ch]
    flow = cal["flow"]["a_s"] + cal["flow"]["b_s_per_stay"] * len(work["ids"])
    pool = simulate(pairs, workers, cal["gap_s"], cal["client_s"])
    work_s = sum(d for _, d in pairs)
    longest = max((d for _, d in pairs), default=0.0)
    return {"workers": workers, "seconds": flow + pool, "flow_s": flow, "pool_s": pool, "work_s": work_s,
            "chunks": len(pairs), "longest_chunk_s": longest,
            "bound_s": flow + max(longest, work_s / workers) + cal["gap_s"] + cal["client_s"]}


def validate(results: list[dict], cal: dict) -> list[dict]:
    """Predicted vs measured seconds of every result file's ``dask-1`` and ``dask-2`` runs."""
    kappa = cal["kappa"]["median"] if cal.get("kappa") else 1.0
    out = []
    for res in results:
        if not _quiet(res):  # its wall times say how loaded the machine was, not what the model predicts
            continue
        work = bench_workload(res)
        for mode, p in (("dask-1", 1), ("dask-2", 2)):
            meas = [r["seconds"] for r in res["runs"] if r["mode"] == mode]
            if not meas:
                continue
            m = model_time(work, p, cal)
            row = {"stays": res["stays"], "warehouse_seed": res.get("warehouse_seed"), "mode": mode,
                   "measured_s": _spread(meas), "predicted_s": m["seconds"],
                   "ratio": m["seconds"] / statistics.median(meas),
                   "load_1min": res["load_1min"]["median"],
                   "longest_stay_h": max(work["hours"][s] for s in work["ids"])}
            if p > 1:
                mk = model_time(work, p, cal, kappa)
                row.update(predicted_kappa_s=mk["seconds"], ratio_kappa=mk["seconds"] / statistics.median(meas))
            out.append(row)
    return out


def predict(cal: dict, workers=DEFAULT_WORKERS) -> dict:
    """The full cohort on each worker count, the speed-up over one worker, what limits it."""
    work = full_workload()
    kappa = cal["kappa"]["median"] if cal.get("kappa") else 1.0
    rows = [model_time(work, p, cal) for p in workers]
    base = model_time(work, 1, cal)["seconds"]
    for r in rows:
        r["speedup"] = base / r["seconds"]
        r["seconds_kappa"] = model_time(work, r["workers"], cal, kappa)["seconds"] if r["workers"] > 1 else r["seconds"]
        parts = {"the flow's serial part": r["flow_s"], "the longest chunk": r["longest_chunk_s"],
                 "the work per worker": r["work_s"] / r["workers"],
                 "the flow's handling of each chunk": r["chunks"] * cal["client_s"]}
        r["limit"] = max(parts, key=lambda k: parts[k])
    h = [work["hours"][s] for s in work["ids"]]
    useful = _useful(work, cal)
    return {"stays": len(h), "hours_total": int(sum(h)), "longest_stay_h": max(h),
            "longest_stay_share": max(stay_units(h)) / _units(h), "rows": rows, "useful": useful,
            "asymptote_s": rows[-1]["flow_s"] + rows[-1]["longest_chunk_s"]}


def _useful(work: dict, cal: dict) -> dict:
    """The largest worker count (doubling from 1) whose doubling still gains :data:`USEFUL_GAIN`."""
    p, t = 1, model_time(work, 1, cal)["seconds"]
    while p < 4096:
        t2 = model_time(work, 2 * p, cal)["seconds"]
        if t / t2 < USEFUL_GAIN:
            break
        p, t = 2 * p, t2
    return {"workers": p, "seconds": t, "gain": USEFUL_GAIN}


# ------------------------------------------------------------------------------ command
#: the full-size run-all record whose retention step the 1-worker prediction is shown beside
FULL_RUN = "docs/results/run_all_full.json"


def build(paths: list[str], workers) -> dict:
    results = [json.loads(Path(p).read_text()) for p in paths]
    cal = calibrate(results)
    full = predict(cal, workers)
    if Path(FULL_RUN).is_file():  # the measured full-size retention step (local thread pool)
        step = json.loads(Path(FULL_RUN).read_text())["steps"].get("retention")
        if step:
            full["measured_run_all"] = {"wall_s": step["wall_s"], "cpu_s": step["cpu_s"], "record": FULL_RUN}
    return {"kind": "makespan_model", "results": [str(p) for p in paths], "calibration": cal,
            "validation": validate(results, cal), "full_cohort": full,
            "command": "python -m pipelines.bench.makespan --results " + " ".join(str(p) for p in paths)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipelines.bench.makespan", description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", nargs="+", default=None, help="bench_dask result files (default: the committed ones)")
    ap.add_argument("--workers", type=int, nargs="+", default=list(DEFAULT_WORKERS))
    ap.add_argument("--json", default=None, metavar="OUT", help="write the model's result file here")
    ap.add_argument("--render", default=None, metavar="RESULT", help="only render --doc from this model result")
    ap.add_argument("--into", default=None, metavar="SCALE.json",
                    help="attach the model (key 'scaleout') to this result")
    ap.add_argument("--doc", default=None, metavar="SCALE.md", help="with --into: re-render this document")
    a = ap.parse_args(argv)
    from pipelines.bench.makespan_report import render_section

    if a.render:
        model = json.loads(Path(a.render).read_text())
    else:
        paths = a.results or [p for p in DEFAULT_RESULTS if Path(p).is_file()]
        model = build(paths, a.workers)
        if a.json:
            write_json(a.json, model, indent=1)
    if a.into:
        from pipelines.bench.scale import write_doc

        into = Path(a.into)
        scale = json.loads(into.read_text())
        scale["scaleout"] = model
        write_json(into, scale, indent=1)
        if a.doc:
            write_doc(scale, Path(a.doc), into.name)
    print("\n".join(render_section(model)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
