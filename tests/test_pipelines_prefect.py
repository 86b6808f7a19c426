"""Prefect hygiene of the ``forgetful`` CLI: which commands start an API server, reuse of a running
one, one line for a typed error inside a task, the task cache key (inputs + task source), retries
only on I/O tasks that may repeat, ``log_prints`` on every flow, concurrency limit 1 on every
deployment, and printed progress reaching both the console and the run log."""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "FORGETFUL_API_SERVER")}
    env.update(PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180",
               PYTHONPATH=str(ROOT), **extra)
    return env


# -- which commands start a server ------------------------------------------------------------

COUNT_STARTS = '''
import json, sys
import pipelines.cli as cli, pipelines.runtime.signals as s
starts = []
orig = s.ApiServer.start
def start(self):
    starts.append(1)
    return orig(self)
s.ApiServer.start = start
if sys.argv[1] == "--no-dispatch":  # only the process plumbing, not the command itself
    sys.argv.pop(1)
    cli._dispatch = lambda cmd, argv: 0
try:
    rc = cli.main()
except SystemExit as e:
    rc = e.code
print("RESULT " + json.dumps({"rc": rc, "starts": len(starts), "prefect_server_imported":
                              "prefect.server.api.server" in sys.modules}))
'''


def _count_starts(argv: list[str], **env) -> dict:
    out = subprocess.run([sys.executable, "-c", COUNT_STARTS, *argv], cwd=ROOT, env=_env(**env),
                         capture_output=True, text=True, timeout=300)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, (out.stdout[-800:], out.stderr[-1500:])
    return json.loads(line[-1][len("RESULT "):])


def test_commands_that_are_not_flows_start_no_server(tmp_path):
    from pipelines.runtime.signals import needs_server

    missing = str(tmp_path / "none.duckdb")
    for argv in (["forget", "--subject-id", "1", "--warehouse", missing],
                 ["receipts", "verify", "--warehouse", missing],
                 ["build-cohort", "--help"]):
        r = _count_starts(argv)
        assert r["starts"] == 0 and not r["prefect_server_imported"], (argv, r)
    assert not needs_server("gate-demo", ["gate-demo"]) and not needs_server("serve", ["serve", "--dry-run"])
    assert needs_server("build-cohort", ["build-cohort"]) and needs_server("run-all", ["-q", "run-all"])


def test_serverless_commands_are_exactly_the_modules_without_a_flow():
    """A command whose module neither defines nor runs a Prefect flow never starts a server; every
    flow command does (``serve`` serves flows; a command module may run the flow of its study's
    module, e.g. retention_cli -> clinical_retention). Read from the modules' source, so a new
    command is classified."""
    import re as _re

    from pipelines.cli import COMMANDS
    from pipelines.runtime.signals import SERVERLESS_COMMANDS

    def has_flow(mod: str) -> bool:
        src = (ROOT / "pipelines" / "flows" / f"{mod}.py").read_text()
        return bool(_re.search(r"^\s*@flow\b", src, _re.M)) or any(
            has_flow(m) for m in _re.findall(r"^from pipelines\.flows\.(\w+) import .*\w_flow\b", src, _re.M))

    no_flow = {c for c, (mod, _) in COMMANDS.items() if not has_flow(mod)}
    assert no_flow - {"serve"} == set(SERVERLESS_COMMANDS)


def test_a_flow_command_reuses_a_running_server_when_PREFECT_API_URL_is_set():
    # the process plumbing only (the command is not run): with the URL, nothing is started
    assert _count_starts(["--no-dispatch", "planted-secret"], PREFECT_API_URL="http://127.0.0.1:9/api")["starts"] == 0
    assert _count_starts(["--no-dispatch", "planted-secret"])["starts"] == 1


def test_api_configured_reads_the_environment_and_the_active_profile(monkeypatch, tmp_path):
    from pipelines.runtime.signals import _configured_url, api_configured

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    assert api_configured()
    monkeypatch.delenv("PREFECT_API_URL")
    monkeypatch.chdir(tmp_path)
    prof = tmp_path / "profiles.toml"
    monkeypatch.setenv("PREFECT_PROFILES_PATH", str(prof))
    monkeypatch.delenv("PREFECT_PROFILE", raising=False)
    assert _configured_url() is None
    prof.write_text('active = "team"\n[profiles.team]\nPREFECT_API_URL = "http://10.0.0.5:4200/api"\n'
                    '[profiles.ephemeral]\nPREFECT_SERVER_ALLOW_EPHEMERAL_MODE = "true"\n')
    assert _configured_url() == "http://10.0.0.5:4200/api"
    monkeypatch.setenv("PREFECT_PROFILE", "ephemeral")
    assert _configured_url() is None


@pytest.mark.slow
def test_a_flow_runs_on_the_server_named_by_PREFECT_API_URL(tmp_path):
    """A real flow command against a server started beforehand: it starts none and its flow run
    is recorded on that server."""
    import urllib.request

    from pipelines.runtime.signals import ApiServer

    server = ApiServer().start()
    os.environ.pop("PREFECT_API_URL", None)
    try:
        server.wait_ready()
        out = subprocess.run([sys.executable, "-c", COUNT_STARTS, "-q", "planted-secret", "--trials", "1", "--out",
                              str(tmp_path / "r.json"), "--no-progress"], cwd=tmp_path,
                             env=_env(PREFECT_API_URL=server.api_url), capture_output=True, text=True, timeout=300)
        r = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")][-1][7:])
        assert r == {"rc": 0, "starts": 0, "prefect_server_imported": False}, out.stderr[-1500:]
        # the user's Prefect database holds earlier runs too: the newest finished one is this command's
        req = urllib.request.Request(f"{server.api_url}/flow_runs/filter", method="POST",
                                     data=json.dumps({"sort": "END_TIME_DESC", "limit": 1}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            runs = json.loads(resp.read())
        done = [fr for fr in runs if fr["state_type"] == "COMPLETED"]
        assert done, runs[:3]
        # the run's log reaches the API (the UI) even though the console shows none of it
        body = json.dumps({"logs": {"flow_run_id": {"any_": [done[0]["id"]]}}}).encode()
        req = urllib.request.Request(f"{server.api_url}/logs/filter", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            logs = json.loads(resp.read())
        assert any("Finished in state Completed" in lg["message"] for lg in logs), [lg["message"] for lg in logs][:5]
    finally:
        server.stop()


# -- a typed error inside a task: one line -----------------------------------------------------

def test_a_typed_error_inside_a_task_prints_one_line_and_leaves_no_process(tmp_path):
    """The root passes the command's preflight (a decoy MIMIC-IV layout: header lines only); the
    build task then refuses the memory limit with a typed error, inside the running flow."""
    import gzip

    from cohort.sources import REQUIRED_COLUMNS

    psutil = pytest.importorskip("psutil")
    root = tmp_path / "decoy"
    for rel, cols in REQUIRED_COLUMNS["mimic"].items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(root / f"{rel}.csv.gz", "wt") as f:
            f.write(",".join(cols) + "\n")
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from pipelines.cli import main; sys.exit(main())",
                             "build-cohort", "--source", "mimic", "--root", str(root), "--memory-limit", "lots",
                             "--warehouse", str(tmp_path / "w.duckdb"), "--runs", str(tmp_path / "runs"),
                             "--no-progress"], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    seen: dict[int, object] = {}
    try:
        t0 = time.monotonic()
        while proc.poll() is None and time.monotonic() - t0 < 300:
            try:
                for c in psutil.Process(proc.pid).children(recursive=True):
                    seen.setdefault(c.pid, c)
            except psutil.NoSuchProcess:
                break
            time.sleep(0.2)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == 3, err[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: BadParameterError: memory limit"), err[-3000:]
    assert "Traceback" not in err and out.strip() == ""
    assert seen, "the flow command should have run its own API server"
    left = [p.pid for p in seen.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"left behind: {left}"


# -- cache key: inputs + task source -----------------------------------------------------------

TASK_SRC = '''
from pipelines.runtime import task_cache

CALLS = []


@task_cache.cached
def compute(x: int, warehouse: str) -> dict:
    CALLS.append(x)
    return {"value": x * {factor}}
'''


def _load(path: Path, factor: int, name: str):
    path.write_text(TASK_SRC.replace("{factor}", str(factor)))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_editing_the_task_source_invalidates_the_cache(tmp_path):
    wh = str(tmp_path / "w.duckdb")
    src = tmp_path / "cached_task.py"
    a = _load(src, 2, "cached_task_a")
    assert a.compute(3, warehouse=wh) == {"value": 6} and a.CALLS == [3]
    assert a.compute(3, warehouse=wh) == {"value": 6} and a.CALLS == [3]  # same inputs + source: a hit
    assert a.compute(4, warehouse=wh) == {"value": 8} and a.CALLS == [3, 4]  # other input: a miss
    b = _load(src, 10, "cached_task_b")  # the same function, edited
    assert b.compute(3, warehouse=wh) == {"value": 30} and b.CALLS == [3]
    # a different path to the same warehouse is the same cache: paths are not part of the key
    c = _load(src, 10, "cached_task_c")
    assert c.compute(3, warehouse=str(tmp_path / "." / "w.duckdb")) == {"value": 30} and c.CALLS == []


def test_no_hand_bumped_version_constant_in_the_cache_key():
    pattern = re.compile(r"^\s*[A-Z_]*VERSION[A-Z_]*\s*=", re.M)
    hits = [str(p.relative_to(ROOT)) for p in (ROOT / "pipelines").rglob("*.py") if pattern.search(p.read_text())]
    assert hits == []


# -- retries, log_prints, concurrency ------------------------------------------------------------

def _tasks_and_flows():
    from prefect import Flow, Task

    mods = ["audit_flow", "bench_delete_flow", "clinical_cohort", "clinical_deletion", "clinical_deterioration",
            "clinical_retention", "retention_chunks", "ingest_flow", "run_all", "study_learned_keys",
            "study_synthetic",
            "throughput_flow"]
    tasks, flows = {}, {}
    for m in mods:
        mod = importlib.import_module(f"pipelines.flows.{m}")
        for v in vars(mod).values():
            if isinstance(v, Task):
                tasks[v.name] = v
            elif isinstance(v, Flow):
                flows[v.name] = v
        for v in getattr(mod, "FLOWS", {}).values():
            flows[v.name] = v
    return tasks, flows


def test_retries_only_on_io_tasks_that_may_repeat():
    from pipelines.runtime import runner

    tasks, flows = _tasks_and_flows()
    io = {"generate-synthetic", "build-warehouse", "retention-batch", "deterioration-train", "audit-regime",
          "patient-deletion-context"}
    for name in io:
        t = tasks[name]
        assert t.retries == 2 and t.retry_condition_fn is runner.retry_transient_io, name
    assert tasks["ingest-increments"].retries == 0  # commits: a retry could apply an increment twice
    assert all(t.retries == 0 for n, t in tasks.items() if n not in io), {n: t.retries for n, t in tasks.items()}
    assert flows and all(f.log_prints for f in flows.values()), [n for n, f in flows.items() if not f.log_prints]


class _State:
    def __init__(self, exc):
        self.exc = exc

    def result(self, raise_on_failure=True):
        return self.exc


def test_the_retry_condition_retries_transient_io_only():
    import duckdb

    from cohort.errors import CohortError
    from pipelines.errors import WarehouseMissingError
    from pipelines.runtime.runner import retry_transient_io as retry

    assert retry(None, None, _State(OSError(5, "Input/output error")))
    assert retry(None, None, _State(duckdb.IOException("Could not set lock on file")))
    for exc in (FileNotFoundError("x"), PermissionError("x"), WarehouseMissingError("x"), CohortError("x"),
                ValueError("x"), ZeroDivisionError()):
        assert not retry(None, None, _State(exc)), exc


def test_every_deployment_has_concurrency_limit_one():
    from pipelines.flows.serve_cli import IngestSchedule, build_deployments, describe

    d = describe(build_deployments(ingest=IngestSchedule("/tmp/forgetful-none")))
    assert {x["name"] for x in d} >= {"forgetful-run-all", "forgetful-ingest"}
    assert all(x["concurrency_limit"] == 1 for x in d), d


def test_printed_progress_reaches_console_and_run_log(capsys):
    import prefect  # noqa: F401 - the run loggers are Prefect's

    from pipelines.runtime.runner import configure_run_logging

    class Keep(logging.Handler):
        def __init__(self):
            super().__init__()
            self.msgs = []

        def emit(self, record):
            self.msgs.append(record.getMessage())

    lg = logging.getLogger("prefect.flow_runs")
    keep = Keep()
    lg.addHandler(keep)  # stands in for Prefect's API handler
    try:
        configure_run_logging(verbose=False)
        with warnings.catch_warnings():  # no flow run here: the API handler warns, and sends nothing
            warnings.simplefilter("ignore")
            lg.info("step 3/10")  # what log_prints makes of a print() inside a flow
        logging.getLogger("prefect.flow_runs").debug("not shown")
        assert keep.msgs == ["step 3/10"]
        assert capsys.readouterr().out == "step 3/10\n"
    finally:
        lg.removeHandler(keep)
        configure_run_logging(verbose=True)  # drop the echo handler and console filter again
        lg.setLevel(logging.NOTSET)
        logging.getLogger("prefect.task_runs").setLevel(logging.NOTSET)
