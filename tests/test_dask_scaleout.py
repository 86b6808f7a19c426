"""Scale-out on Dask (pipelines.runtime.scaleout): chunks sized from the measured cost, the same chunk
function locally and on a LocalCluster of worker processes, bit-identical per-stay results, and
clean worker logs over consecutive commands against one long-lived cluster."""
from __future__ import annotations

import json
import shutil

import duckdb
import numpy as np
import pytest

from cohort.synthetic import make_small_warehouse
from pipelines.runtime import dask_hygiene, runner, scaleout
from pipelines.store import stay_results


# ------------------------------------------------------------------------------ planning (pure)
def test_cost_model_has_a_fixed_part_and_grows_faster_than_hours_squared():
    u = scaleout.stay_units([1, 150, 1000, 8000])
    assert u[0] == pytest.approx(scaleout.COST_FIXED_UNITS + 1 + 1 / scaleout.COST_CUBIC_HOURS)
    assert u[1] == pytest.approx(2 * scaleout.COST_FIXED_UNITS, rel=1e-2)  # ~150 h: as much fixed as n² work
    assert u[3] / u[2] > 64  # n³ term: more than (8000/1000)²
    assert scaleout.stay_cost([1000], 2e-7) == [pytest.approx(2e-7 * u[2])]
    assert scaleout.seconds_per_unit(2.0, [10, 20]) == pytest.approx(2.0 / sum(scaleout.stay_units([10, 20])))


def test_lpt_makespan_and_bound():
    assert scaleout.lpt_makespan([5, 4, 3, 3, 3], 2) == 10  # LPT; the optimum is 9 (5+4 | 3+3+3)
    assert scaleout.makespan_bound([5, 4, 3, 3, 3], 2) == 9
    assert scaleout.lpt_makespan([20, 1, 1, 1], 2) == scaleout.makespan_bound([20, 1, 1, 1], 2) == 20
    assert scaleout.lpt_makespan([1.5, 2.5], 1) == 4.0 and scaleout.lpt_makespan([], 2) == 0.0


def _hours(m, seed=0, huge=None):
    rng = np.random.default_rng(seed)
    h = np.clip(np.exp(rng.normal(4.6, 0.8, size=m)), 48, 3000).astype(int).tolist()
    if huge is not None:
        h[m // 3] = huge
    return h


def test_plan_chunks_covers_every_stay_once_in_order_with_chunks_shrinking_to_the_end():
    ids = list(range(100, 1100))
    hours = _hours(len(ids), huge=8400)
    per_unit = 2.5e-7
    cost = dict(zip(ids, scaleout.stay_cost(hours, per_unit)))
    for slots in (1, 2, 8):
        chunks = scaleout.plan_chunks(ids, hours, per_unit, slots=slots, target_s=3.0, min_s=0.25)
        assert [s for c in chunks for s in c] == ids  # every stay once, order kept (contiguous chunks)
        est = [sum(cost[s] for s in c) for c in chunks]
        divisible = sum(c for c in cost.values() if c <= 3.0)
        left = [sum(cost[s] for c in chunks[i:] for s in c if cost[s] <= 3.0) for i in range(len(chunks))]
        for e, c, rest in zip(est, chunks, left):  # each chunk within the guided cap, or a single stay
            assert len(c) == 1 or e <= max(0.25, min(3.0, rest / (scaleout.GUIDED_WAVES * slots))) + 1e-12
        assert all(a + cost[b[0]] > 0.25 for a, b in zip(est[:-1], chunks[1:]))  # never needlessly small
        assert len(chunks) >= scaleout.MIN_WAVES * slots or divisible / (scaleout.MIN_WAVES * slots) < 0.25
        huge = ids[len(ids) // 3]
        assert [huge] in chunks and cost[huge] > 3.0  # a long stay is a chunk of its own
        # with a perfect model, the list schedule of the chunks (longest first) is within the last
        # (smallest) chunk of the bound of the stays themselves
        assert scaleout.lpt_makespan(est, slots) <= scaleout.makespan_bound(list(cost.values()), slots) + 0.25
    # a cost too small to measure: equal chunks, MIN_WAVES per slot
    assert [len(c) for c in scaleout.plan_chunks(ids[:12], hours[:12], 0.0, slots=2)] == [2] * 6
    assert scaleout.plan_chunks([], [], 1.0, slots=2) == []
    with pytest.raises(ValueError):
        scaleout.plan_chunks([1, 2], [3], 1.0, slots=1)


def test_map_chunks_runs_longest_first_and_returns_in_order_and_logs_each_chunk():
    calls = []

    def fn(w, h, stay_ids):
        calls.append(tuple(stay_ids))
        return sum(stay_ids)

    args = [("w", "h", [1, 2]), ("w", "h", [3]), ("w", "h", [4, 5, 6])]
    with scaleout.chunk_log() as log:
        out = scaleout.map_chunks(fn, args, costs=[0.5, 2.0, 1.0], progress=False)
        with scaleout.timed([7]) as clock:
            assert fn("w", "h", [7]) == 7
        assert clock.seconds > 0
    assert out == [3, 3, 15] and calls == [(3,), (4, 5, 6), (1, 2), (7,)]
    assert [r["desc"] for r in log] == ["chunks", "pilot"]
    ch = log[0]["chunks"]
    assert [c["stay_ids"] for c in ch] == [[3], [4, 5, 6], [1, 2]] and [c["predicted_s"] for c in ch] == [2.0, 1.0, 0.5]
    assert all(c["seconds"] >= 0 and c["start"] <= c["end"] for c in ch)
    with scaleout.chunk_log() as inner:
        pass
    assert inner == [] and scaleout.map_chunks(fn, args, progress=False) == [3, 3, 15]  # no log: nothing kept


# ------------------------------------------------------------------------------ the benchmark's record
def test_bench_timeline_ideal_from_measured_chunks_and_no_stay_ids():
    from pipelines.bench.dask_workers import ideals, timeline

    def chunk(ids, secs, w, start):
        return {"stay_ids": ids, "predicted_s": secs, "seconds": secs, "worker": w, "start": start,
                "end": start + secs, "received": start + secs, "submitted": start}

    t0 = 1000.0
    log = [{"desc": "pilot", "executor": "flow", "start": t0 + 1, "end": t0 + 1.5,
            "chunks": [chunk([11, 12], 0.5, "flow", t0 + 1)]},
           {"desc": "icu_retention (stay batches)", "executor": "dask", "start": t0 + 2, "end": t0 + 12,
            "chunks": [chunk([13], 6.0, "0", t0 + 2), chunk([14, 15], 2.0, "0", t0 + 8),
                       chunk([16], 2.0, "0", t0 + 10)]},
           {"desc": "icu_retention (refit audit)", "executor": "dask", "start": t0 + 13, "end": t0 + 15,
            "chunks": [chunk([13], 1.0, "0", t0 + 13), chunk([14], 1.0, "0", t0 + 14)]}]
    hours = {11: 50, 12: 60, 13: 8000, 14: 100, 15: 200, 16: 300}
    tl = timeline(log, t0, t0 + 20, hours)
    assert tl["seconds"] == 20 and tl["flow_s"] == pytest.approx(20 - 10 - 2)  # the pilot counts as the flow's
    b = tl["phases"][1]
    assert b["phase"] == "batches" and b["work_s"] == 10 and b["lpt_1_s"] == 10 and b["lpt_2_s"] == 6
    assert [c["hours_max"] for c in b["chunks"]] == [8000, 200, 300] and b["chunks"][1]["hours_sum"] == 300
    assert tl["ideal_2_s"] == pytest.approx(8 + 6 + 1)
    assert "stay_ids" not in json.dumps(tl) and "8000" in json.dumps(tl)  # aggregates only
    ide = ideals([{"mode": "dask-1", **tl}, {"mode": "dask-2", **tl, "seconds": 1.0}])  # dask-1 runs only
    assert ide["bound"]["seconds"]["median"] == pytest.approx(8 + max(6, 10 / 2) + max(0, 2 / 2))
    assert ide["lpt"]["seconds"]["median"] == pytest.approx(8 + 6 + 1)
    assert ide["overlapped"]["seconds"]["median"] == pytest.approx(8 + max(6, 12 / 2))
    assert ide["bound"]["speedup_vs_dask-1"]["median"] == pytest.approx(20 / 15)
    assert ide["bound"]["batches_speedup_vs_dask-1"]["median"] == pytest.approx(10 / 6)


def test_bench_contention_pairs_rounds_and_sums_worker_gaps():
    from pipelines.bench.dask_workers import contention

    def run(mode, rnd, chunks):  # chunks: (worker, start, seconds, cpu)
        return {"mode": mode, "round": rnd, "phases": [
            {"phase": "pilot", "chunks": [{"worker": "flow", "start": 0.0, "end": 9.0, "seconds": 9.0, "cpu_s": 9.0}]},
            {"phase": "batches", "chunks": [{"worker": w, "start": s, "end": s + sec, "seconds": sec, "cpu_s": cpu}
                                            for w, s, sec, cpu in chunks]}]}

    runs = [run("local", 0, []),
            run("dask-1", 0, [("a", 1.0, 4.0, 4.0), ("a", 5.5, 6.0, 5.0)]),    # work 10, cpu 9, gap 0.5
            run("dask-2", 0, [("a", 1.0, 6.0, 5.4), ("b", 1.0, 6.0, 5.4)]),    # work 12, cpu 10.8
            run("dask-2", 1, [("a", 1.0, 5.0, 5.0), ("b", 1.2, 5.0, 5.0)]),    # round 1: no dask-1 run, unpaired
            run("dask-1", 2, [("a", 1.0, 5.0, 5.0), ("a", 6.25, 5.0, 5.0)]),   # work 10, gap 0.25
            run("dask-2", 2, [("b", 1.0, 3.0, 3.0), ("a", 1.0, 8.0, 7.0), ("b", 4.0, 3.0, 3.0)])]  # work 14, cpu 13
    con = contention(runs)
    assert con["work_ratio"]["n"] == 2 and con["work_ratio"]["min"] == pytest.approx(1.2)
    assert con["work_ratio"]["max"] == pytest.approx(1.4)
    assert con["cpu_ratio"]["min"] == pytest.approx(10.8 / 9) and con["cpu_ratio"]["max"] == pytest.approx(13 / 10)
    # one entry per worker of each Dask run (pilot left out): 0.5 | 0, 0 | 0, 0 | 0.25 | 0 (b: 1-4, 4-7), 0
    assert con["gaps_s"]["n"] == 8 and con["gaps_s"]["max"] == pytest.approx(0.5) and con["gaps_s"]["median"] == 0
    assert contention([run("local", 0, [])]) is None


def test_readme_bench_dask_block_is_the_rendering_of_the_committed_results():
    from pathlib import Path

    from pipelines.bench import dask_workers as bench_dask

    root = Path(__file__).resolve().parents[1]
    text = "\n\n".join(bench_dask.table(json.loads((root / f).read_text())) for f in bench_dask.README_RESULTS)
    doc = (root / "docs" / "DASK.md").read_text()
    block = doc.split(bench_dask.BEGIN)[1].split(bench_dask.END)[0]
    assert block == f"\n{text}\n", "docs/DASK.md bench_dask block is stale: rerun " \
        "python -m pipelines.bench.dask_workers --table " + " ".join(bench_dask.README_RESULTS) \
        + " --readme docs/DASK.md"


# ------------------------------------------------------------------------------ local vs LocalCluster
@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_small_warehouse(tmp_path_factory.mktemp("dask") / "src", stays=40, seed=0)


def _site(base, root):
    runs = root / "runs"
    runs.mkdir(parents=True)
    w = runs / "warehouse.duckdb"
    shutil.copy(base, w)
    return str(w), str(runs)


def _stored(w):
    con = duckdb.connect(w, read_only=True)
    try:
        vals = stay_results.read(con, "icu_retention")
        gates = con.execute("SELECT C, sigma, n_tokens, state_npz FROM gate_states "
                            "WHERE study = 'icu_retention' ORDER BY context_id").fetchall()
        return vals, gates
    finally:
        con.close()


def test_localcluster_of_processes_matches_local_bit_for_bit(prefect_harness, base, tmp_path, monkeypatch):
    pytest.importorskip("distributed", reason="the [dask] extra is not installed")
    pytest.importorskip("prefect_dask", reason="the [dask] extra is not installed")
    from distributed import LocalCluster
    from prefect_dask import DaskTaskRunner

    from pipelines.flows.clinical_retention import retention_flow
    from pipelines.settings import RetentionSettings

    # the pilot's time scale fixed (about 0.1 s per stay), so the plan has several chunks on any
    # machine: a fast pilot on a quiet one used to leave a single batch (CI failed on `chunks >= 3`);
    # the chunks still run and are timed for real, and the figures never depend on the cut
    monkeypatch.setattr(scaleout, "seconds_per_unit", lambda seconds, hours: 4e-6)

    kw = dict(settings=RetentionSettings(n_boot=200, audit_stays=3, sensitivity_stays=6),  # chunks sized from the pilot
              progress=False)
    w1, r1 = _site(base, tmp_path / "local")
    w2, r2 = _site(base, tmp_path / "dask")
    with runner.results_context(r1):
        ref = retention_flow.with_options(task_runner=runner.make_task_runner(None, 2))(
            warehouse=w1, runs_dir=r1, **kw)
    cl = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    try:
        with runner.results_context(r2), scaleout.chunk_log() as log:
            got = retention_flow.with_options(task_runner=DaskTaskRunner(address=cl.scheduler_address))(
                warehouse=w2, runs_dir=r2, **kw)
        prefixes = set(cl.scheduler.task_prefixes)  # what the scheduler ran
    finally:
        cl.close()
    assert cl.status.name == "closed"
    ch = got["config"]["chunking"]
    assert ch["executor"] == "dask" and ch["slots"] == 2 and ch["chunks"] >= 3
    assert ref["config"]["chunking"]["executor"] == "threads"
    assert "run_chunk" in prefixes  # the chunks ran on the cluster's workers
    assert got["metrics"] == ref["metrics"]
    batches = next(r for r in log if "stay batches" in r["desc"])["chunks"]
    assert len(batches) == ch["chunks"] - 1  # the pilot ran in the flow's process
    pred = [c["predicted_s"] for c in batches]
    assert pred == sorted(pred, reverse=True)  # longest first
    assert all(c["seconds"] > 0 for c in batches)
    # one pool for the stay batches, the audit and the sensitivity chunks (map_phases), at most one
    # chunk in flight per worker: the pool's chunk k waits for k - 1 completions
    assert [r["desc"].split("(")[1] for r in log[1:]] == ["stay batches)", "refit audit)", "sensitivity)"]
    pool = sorted((c for r in log[1:] for c in r["chunks"]), key=lambda c: c["submitted"])
    # both workers ran chunks of the pool (which phase lands where depends on timing: a long
    # sensitivity chunk may hold one worker while the other runs every stay batch)
    assert {c["worker"] for c in pool} == {"0", "1"} and all(c["cpu_s"] >= 0 for c in pool)
    got_back = sorted(c["received"] for c in pool)
    assert all(c["submitted"] >= got_back[k - 2] for k, c in enumerate(pool) if k >= 2)
    assert log[1]["start"] == log[2]["start"] == log[3]["start"]  # one pool, not three in a row
    (v1, g1), (v2, g2) = _stored(w1), _stored(w2)
    assert sorted(v1) == sorted(v2) and v1["stay_id"].size == got["metrics"]["n_stays"] > 20
    for c in v1:  # bit for bit, NaN where excluded included
        assert v1[c].dtype == v2[c].dtype and v1[c].tobytes() == v2[c].tobytes(), c
    assert g1 == g2 and len(g1) == got["metrics"]["gates_persisted"] > 0


# ------------------------------------------------------------------------------ the cluster recipe
@pytest.mark.slow
def test_three_commands_against_one_long_lived_cluster_leave_clean_worker_logs(base, tmp_path):
    """The README recipe on one machine: ``dask scheduler`` + ``dask worker --nworkers 2`` as
    their own processes, then three ``forgetful`` commands (each with its private Prefect API)
    against them — two run Prefect tasks on the workers (``audit``), one runs study chunks
    (``heldout-spo2``). The worker log must hold no Prefect event/log-shipping failure (without
    the drain at command end, the second ``audit``'s task events go to the first command's dead
    API: ``EventsWorker failed``) and no error at all."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("distributed", reason="the [dask] extra is not installed")
    from distributed import Client

    w, runs = _site(base, tmp_path / "site")
    repo = str(Path(__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}  # private API per command
    env["PYTHONPATH"] = os.pathsep.join([repo, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    sf = tmp_path / "scheduler.json"
    slog, wlog = tmp_path / "scheduler.log", tmp_path / "worker.log"
    procs = []
    try:
        with open(slog, "w") as so:
            procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--scheduler-file",
                                           str(sf), "--port", "0", "--no-dashboard"], stdout=so, stderr=so, env=env,
                                          cwd=tmp_path))
        import time

        t0 = time.time()
        while not sf.is_file() and time.time() - t0 < 120:
            time.sleep(0.5)
        with open(wlog, "w") as wo:
            procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file",
                                           str(sf), "--nworkers", "2", "--nthreads", "1", "--no-dashboard"],
                                          stdout=wo, stderr=wo, env=env, cwd=tmp_path))
        with Client(scheduler_file=str(sf), timeout=120) as c:
            c.wait_for_workers(2, timeout=180)
            address = c.scheduler.address
        commands = [["audit", "--trials", "3", "--regimes", "gaussian"],
                    ["heldout-spo2", "--n-boot", "200", "--audit-stays", "2", "--sensitivity-stays", "4"],
                    ["audit", "--trials", "3", "--regimes", "gaussian"]]
        for cmd in commands:
            r = subprocess.run([sys.executable, "-m", "pipelines.cli", *cmd, "--warehouse", w, "--runs", runs,
                                "--dask", address, "--no-progress"], env=env, cwd=tmp_path, capture_output=True,
                               text=True, timeout=900)
            assert r.returncode == 0, (cmd, r.stderr[-2000:])
            with Client(address, timeout=60) as c:
                # Prefect ran on the workers (audit) but no events/log service outlives the command that
                # made it: the next command's task events cannot go to this command's (exited) API
                live = c.run(dask_hygiene.prefect_services)
            assert len(live) == 2 and all(not v or (v["events"] == [] and v["logs"] == 0) for v in live.values()), live
        time.sleep(3)  # anything the workers still had to say
        log = wlog.read_text()  # the workers' log over the three commands (not their shutdown)
    finally:
        for p in reversed(procs):  # only the processes this test started: workers first, then the scheduler
            p.terminate()
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    assert "Start worker" in log or "Starting worker" in log or "Registered to" in log, log[-2000:]
    bad = [ln for ln in log.splitlines()
           if re.search(r"EventsWorker|APILogWorker|Traceback|\bERROR\b|\berror\b|\bfailed\b", ln)]
    assert not bad, "\n".join(bad[:20])
