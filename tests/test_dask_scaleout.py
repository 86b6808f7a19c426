"""Scale-out on Dask (pipelines.scaleout): chunks sized from the measured cost, the same chunk
function locally and on a LocalCluster of worker processes, bit-identical per-stay results, and
clean worker logs over consecutive commands against one long-lived cluster."""
from __future__ import annotations

import shutil

import duckdb
import numpy as np
import pytest

from cohort.synthetic import make_small_warehouse
from pipelines import runner, scaleout, stay_results


# ------------------------------------------------------------------------------ planning (pure)
def test_plan_chunks_covers_every_stay_once_in_order_at_the_target():
    rng = np.random.default_rng(0)
    ids = list(range(100, 400))
    hours = rng.integers(5, 200, size=len(ids)).tolist()
    per_unit = 1e-5  # hours ** 2 units: 0.0003-0.4 s a stay
    chunks = scaleout.plan_chunks(ids, hours, per_unit, slots=2, target_s=3.0)
    assert [s for c in chunks for s in c] == ids  # every stay once, order kept
    cost = dict(zip(ids, scaleout.stay_cost(hours, per_unit)))
    assert cost[ids[0]] == pytest.approx(hours[0] ** 2 * per_unit)
    assert scaleout.seconds_per_unit(2.0, [10, 20]) == pytest.approx(2.0 / 500)
    est = [sum(cost[s] for s in c) for c in chunks]
    # every chunk stays under the target unless it is a single stay, and chunks are not needlessly small
    assert all(e <= 3.0 or len(c) == 1 for e, c in zip(est, chunks))
    assert all(a + cost[b[0]] > 3.0 for a, b in zip(est[:-1], chunks[1:]))
    # little work: the cap drops so that each of 4 slots gets >= 3 chunks
    small = scaleout.plan_chunks(ids[:40], hours[:40], 1e-4, slots=4, target_s=3.0)
    assert len(small) >= 12 and [s for c in small for s in c] == ids[:40]
    # a cost too small to measure: equal chunks, 3 per slot
    assert [len(c) for c in scaleout.plan_chunks(ids[:12], hours[:12], 0.0, slots=2)] == [2] * 6
    assert scaleout.plan_chunks([], [], 1.0, slots=2) == []
    with pytest.raises(ValueError):
        scaleout.plan_chunks([1, 2], [3], 1.0, slots=1)


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


def test_localcluster_of_processes_matches_local_bit_for_bit(prefect_harness, base, tmp_path):
    pytest.importorskip("distributed", reason="the [dask] extra is not installed")
    pytest.importorskip("prefect_dask", reason="the [dask] extra is not installed")
    from distributed import LocalCluster
    from prefect_dask import DaskTaskRunner

    from pipelines.flows.clinical_retention import retention_flow

    kw = dict(n_boot=200, progress=False, audit_stays=3, sensitivity_stays=6)  # chunks sized from measured cost
    w1, r1 = _site(base, tmp_path / "local")
    w2, r2 = _site(base, tmp_path / "dask")
    with runner.results_context(r1):
        ref = retention_flow.with_options(task_runner=runner.make_task_runner(None, 2))(
            warehouse=w1, runs_dir=r1, **kw)
    cl = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    try:
        with runner.results_context(r2):
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
                live = c.run(scaleout.prefect_services)
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
