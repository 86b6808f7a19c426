"""``forgetful serve --ingest-root`` actually serving the ingest deployment (slow: ~1-2 min).

The test starts ``forgetful serve`` (the real CLI path, in a subprocess) against the session's
Prefect test harness with a 3-second ingest interval, lets scheduled runs ingest a growing source
root (a part file is added between runs), checks that the warehouse advanced and that no two runs
overlapped (``concurrency_limit=1``), stops the serve loop with SIGINT and checks that it and
every process it started are gone.

Scheduling: the harness's ephemeral API runs no scheduler service, so the test does what that
service does each loop: ``POST /deployments/{id}/schedule`` creates the deployment's next runs
on its own interval schedule (3 s apart). The served runner picks them up when due.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

REPO = Path(__file__).resolve().parents[1]
INTERVAL_S = 3
DEPLOYMENT = "ingest/forgetful-ingest"
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
MARK = "FORGETFUL_SERVED_TEST"  # inherited by every process serve starts (flow-run subprocesses included)


def _marked(tag: str) -> list:
    import psutil

    out = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get(MARK) == tag and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.Error, OSError):
            continue
    return out


def _wait(pred, timeout: float, what: str, proc=None, log: Path | None = None):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        v = pred()
        if v:
            return v
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-3000:] if log and log.is_file() else ""
            raise AssertionError(f"serve exited early ({proc.returncode}) while waiting for {what}:\n{tail}")
        time.sleep(0.5)
    tail = log.read_text()[-3000:] if log and log.is_file() else ""
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{tail}")


def _runs(client, dep_id):
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    return client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep_id])))


def _schedule(client, dep_id, n: int) -> None:
    """What the scheduler service does: create the next ``n`` runs of the interval schedule."""
    r = client._client.post(f"/deployments/{dep_id}/schedule",
                            json={"min_time": float(INTERVAL_S * n), "max_runs": n, "min_runs": n})
    r.raise_for_status()


def _done(client, dep_id, n: int):
    rs = [r for r in _runs(client, dep_id) if r.state_type is not None]
    ended = [r for r in rs if r.state_type.value in TERMINAL]
    return ended if len(ended) >= n and len(ended) == len(rs) else None


@pytest.mark.slow
def test_served_ingest_runs_on_schedule_without_overlap(prefect_harness, tmp_path):
    import psutil
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL
    from test_ingest import assert_equals_causal_batch

    from cohort.incremental.replay import make_replay
    from cohort.synthetic import generate
    from pipelines.ingest import ingest
    from pipelines.ingest import state as st

    generate(tmp_path / "mimic", stays=6, seed=7, fmt="parquet")
    root = tmp_path / "root"
    parts = make_replay("mimic", tmp_path / "mimic", root, tmp_path / "parts", 3, align=True)
    wh, runs_dir = tmp_path / "stream.duckdb", tmp_path / "runs"
    shutil.copy(parts[0], root / "icu" / parts[0].name)
    ingest(wh, "mimic", root, init=True)
    shutil.copy(parts[1], root / "icu" / parts[1].name)  # waiting for the first scheduled run

    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_RUNNER_POLL_FREQUENCY": "1", "PREFECT_LOGGING_LEVEL": "WARNING", "FORGETFUL_API_SERVER": "0",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), MARK: str(tmp_path)}
    log = tmp_path / "serve.log"
    cmd = [sys.executable, "-c", "import sys; from pipelines.cli import main; sys.exit(main(sys.argv[1:]))",
           "serve", "--runs", str(runs_dir), "--warehouse", str(tmp_path / "unused.duckdb"),
           "--ingest-root", str(root), "--ingest-warehouse", str(wh), "--ingest-interval", str(INTERVAL_S)]
    t_start = time.monotonic()
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT)
    children: list = []
    try:
        with get_client(sync_client=True) as client:
            dep = _wait(lambda: _try_read(client), 180, "the served ingest deployment", proc, log)
            assert dep.concurrency_limit == 1 or getattr(dep, "global_concurrency_limit", None) is not None
            assert proc.pid in {p.pid for p in _marked(str(tmp_path))}  # the leftover check can see them
            _schedule(client, dep.id, 2)
            first = _wait(lambda: _done(client, dep.id, 2), 240, "two scheduled runs", proc, log)
            children = psutil.Process(proc.pid).children(recursive=True)
            shutil.copy(parts[2], root / "icu" / parts[2].name)  # a new part between runs
            _schedule(client, dep.id, 2)
            ended = _wait(lambda: _done(client, dep.id, 4), 240, "two more scheduled runs", proc, log)
            assert len(first) >= 2
            states = sorted(r.state_type.value for r in ended)
            assert states.count("COMPLETED") >= 3, states
            done = sorted((r for r in ended if r.state_type.value == "COMPLETED"), key=lambda r: r.start_time)
            for a, b in zip(done, done[1:]):  # concurrency limit 1: runs never overlap
                assert b.start_time >= a.end_time, (a.start_time, a.end_time, b.start_time)
    finally:
        children += psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
                pytest.fail("serve did not stop within 60 s of SIGINT (killed)")
        gone, alive = psutil.wait_procs(children, timeout=30)
        for p in alive:
            p.kill()
        assert not alive, f"processes left behind by serve: {[p.pid for p in alive]}"
        left = _marked(str(tmp_path))  # anything serve started, even if re-parented
        for p in left:
            p.kill()
        assert not left, f"processes left behind by serve: {[p.pid for p in left]}"
    assert not psutil.pid_exists(proc.pid) or psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE

    # the warehouse advanced over the served runs: both parts ingested in order, watermark moved
    con = duckdb.connect(str(wh), read_only=True)
    try:
        files = con.execute(f"SELECT name, step, watermark_us FROM {st.FILES} ORDER BY step").fetchall()
        series = st.get_state(con, "step_series")
    finally:
        con.close()
    assert [f[0] for f in files] == [f"icu/{p.name}" for p in parts]
    assert files[0][2] < files[1][2] < files[2][2]
    assert [s["step"] for s in series] == [1, 2, 3]
    assert series[0]["hours_admitted"] < series[1]["hours_admitted"] < series[2]["hours_admitted"]
    assert (runs_dir / "ingest" / "result.json").is_file()
    print(f"served: {len(done)} completed runs, {len(ended)} ended, {time.monotonic() - t_start:.1f} s of serving; "
          f"series {[(s['step'], s['hours_admitted'], s['n_hot'], s['n_cold']) for s in series]}")
    # closing the source and comparing with the causal batch build: the served increments are exact
    ingest(wh, "mimic", root, final=True)
    assert_equals_causal_batch("mimic", wh, root, tmp_path)


def _try_read(client):
    try:
        return client.read_deployment_by_name(DEPLOYMENT)
    except Exception:  # noqa: BLE001 - not registered yet
        return None
