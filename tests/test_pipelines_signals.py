"""A real ``forgetful`` process stops cleanly on SIGINT/SIGTERM and leaves no Prefect server behind.

The command under test is the CLI entry point (``pipelines.cli.main()`` in process mode) running
a flow whose two worker tasks never finish (they sleep in a loop and never look at a
cancellation flag), so only the command's own signal handling can end it. Each test:

1. starts the command in its own process group and waits until both tasks run (a marker file
   written from inside a task) and the warehouse lock is held;
2. records every descendant (the command's Prefect API server among them);
3. sends the signal to the process group (what a terminal's Ctrl-C does);
4. asserts the exit code (130 / 143), one line on stderr, the lock released, and no descendant
   alive; the measured time to exit is printed (``-s`` shows it) and bounded generously
   (hang detection only — :data:`GRACE` seconds are enough on an idle machine).

``kill -9`` of the command cannot run any handler: its server dies with it (``PR_SET_PDEATHSIG``).
"""
from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

psutil = pytest.importorskip("psutil")

ROOT = Path(__file__).resolve().parents[1]
HANG_S = 30.0  # hang detection on a loaded CI machine; the real time is printed

FLOW_MODULE = '''
import time
from pathlib import Path

from prefect import flow, task

from pipelines.runtime import runner


@task(name="spin")
def spin(i: int, marker: str) -> int:
    Path(f"{marker}.{i}").write_text("running")
    while True:  # a worker that never finishes and never checks for cancellation
        time.sleep(0.05)


@flow(name="sigtest")
def sig_flow(warehouse: str, marker: str) -> None:
    runner.gather([spin.submit(i, marker) for i in range(2)], "spin", progress=False)


@runner.cli_errors
def _main(args):
    runner.run_cli_flow(sig_flow, args, must_exist=False, warehouse=args.warehouse, marker=args.marker)
    return 0


def add_cli(sub):
    p = sub.add_parser("sigtest")
    p.add_argument("--marker", required=True)
    runner.add_common_args(p)
    p.set_defaults(func=_main)
'''

CHILD = '''
import sys
import pipelines.cli as cli
import pipelines.flows
pipelines.flows.__path__.append(sys.argv.pop(1))
cli.COMMANDS["sigtest"] = ("_sigtest", "a flow whose tasks never finish (signal test)")
sys.exit(cli.main())
'''


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "FORGETFUL_API_SERVER")}
    env.update(PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180",
               PYTHONPATH=str(ROOT))
    return env


def lock_is_free(lock: Path) -> bool:
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def alive(procs: list) -> list:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _kill_all(proc: subprocess.Popen, procs: list) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for p in alive(procs):
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait(timeout=30)


def _start(tmp_path: Path, **env):
    mod_dir = tmp_path / "mod"
    mod_dir.mkdir()
    (mod_dir / "_sigtest.py").write_text(FLOW_MODULE)
    wh = tmp_path / "w.duckdb"
    marker = tmp_path / "running"
    argv = [sys.executable, "-c", CHILD, str(mod_dir), "-q", "sigtest", "--warehouse", str(wh), "--runs",
            str(tmp_path / "runs"), "--marker", str(marker), "--workers", "2", "--no-progress"]
    proc = subprocess.Popen(argv, cwd=tmp_path, env={**_env(), **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    return proc, wh, marker


def _wait_running(proc: subprocess.Popen, wh: Path, marker: Path, timeout: float = 240) -> list:
    """Wait until both tasks run inside the flow; returns the command's descendants then."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"command ended before the flow ran (rc {proc.returncode}): {err[-1500:]}")
        if all(Path(f"{marker}.{i}").is_file() for i in range(2)):
            break
        time.sleep(0.2)
    else:
        pytest.fail("the flow's tasks never started")
    assert not lock_is_free(wh.parent / (wh.name + ".lock")), "the command should hold the warehouse lock"
    return psutil.Process(proc.pid).children(recursive=True)


def _is_server(p) -> bool:
    try:
        return "uvicorn" in " ".join(p.cmdline())
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("sig", [pytest.param(signal.SIGINT, id="SIGINT"),
                                 pytest.param(signal.SIGTERM, id="SIGTERM", marks=pytest.mark.slow)])
def test_signal_stops_the_command_and_its_server(tmp_path, sig):
    proc, wh, marker = _start(tmp_path)
    procs: list = []
    try:
        procs = _wait_running(proc, wh, marker)
        assert any(_is_server(p) for p in procs), "the flow command should run its own API server"
        t0 = time.monotonic()
        os.killpg(proc.pid, sig)  # the whole process group, as a terminal's Ctrl-C
        try:
            out, err = proc.communicate(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the command did not stop within {HANG_S:.0f} s of {sig.name}")
        took = time.monotonic() - t0
        print(f"\n{sig.name}: exited {proc.returncode} after {took:.2f} s")
        assert proc.returncode == 128 + sig, (proc.returncode, err[-1500:])
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert lines == [f"forgetful: stopped by {sig.name} (exit {128 + sig})"], err[-3000:]
        deadline = time.monotonic() + 5
        while alive(procs) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(procs), f"left behind: {[p.pid for p in alive(procs)]}"
        assert lock_is_free(wh.parent / (wh.name + ".lock"))
    finally:
        _kill_all(proc, procs)


def test_a_stopped_command_leaves_no_run_open_on_the_server(tmp_path, prefect_harness):
    """Stopped while its worker tasks run, the command closes its runs on the (reused) API before
    it exits: the flow run CRASHED, its task runs CANCELLED, nothing RUNNING in the Prefect UI."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, TaskRunFilter, TaskRunFilterFlowRunId
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    with get_client(sync_client=True) as c:
        before = {r.id for r in c.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["sigtest"])))}
    proc, wh, marker = _start(tmp_path, PREFECT_API_URL=url)
    procs: list = []
    try:
        procs = _wait_running(proc, wh, marker)
        os.killpg(proc.pid, signal.SIGINT)
        proc.communicate(timeout=HANG_S)
        assert proc.returncode == 130
    finally:
        _kill_all(proc, procs)
    with get_client(sync_client=True) as c:
        runs = [r for r in c.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["sigtest"])))
                if r.id not in before]
        ids = [r.id for r in runs]
        tasks = c.read_task_runs(task_run_filter=TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=ids)))
    assert [r.state_type.value for r in runs] == ["CRASHED"], [r.state for r in runs]
    assert sorted(t.state_type.value for t in tasks) == ["CANCELLED", "CANCELLED"], [t.state for t in tasks]
    from pipelines.runtime.crash_hooks import MESSAGE

    assert {t.state.message for t in tasks} == {MESSAGE}


@pytest.mark.slow
def test_kill_9_leaves_no_server(tmp_path):
    proc, wh, marker = _start(tmp_path)
    procs: list = []
    try:
        procs = _wait_running(proc, wh, marker)
        servers = [p for p in procs if _is_server(p)]
        assert servers
        proc.kill()  # SIGKILL: no handler runs
        proc.wait(timeout=30)
        t0 = time.monotonic()
        while alive(servers) and time.monotonic() - t0 < 10:
            time.sleep(0.1)
        print(f"\nkill -9: server gone after {time.monotonic() - t0:.2f} s")
        assert not alive(procs), f"left behind: {[p.pid for p in alive(procs)]}"
        assert lock_is_free(wh.parent / (wh.name + ".lock"))
    finally:
        _kill_all(proc, procs)


def test_half_written_cache_entries_of_a_dead_writer_are_removed(tmp_path):
    """A signal or kill -9 can leave a task-cache temporary behind; the next writer removes it."""
    from pipelines.store.locking import clean_stale

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    wh = tmp_path / "w.duckdb"
    cache = tmp_path / ".w.duckdb.cache"
    cache.mkdir()
    stale = cache / f".retention-abc.json.tmp{dead}-1"
    mine = cache / f".retention-def.json.tmp{os.getpid()}-1"
    entry = cache / "retention-abc.json"
    for p in (stale, mine, entry):
        p.write_text("x")
    assert clean_stale(wh) == 1
    assert not stale.exists() and mine.exists() and entry.exists()
