"""CLI timing benchmark (a command, never a timed test): ``python -m pipelines.bench.cli``.

Times, as separate ``forgetful`` processes, median of ``--repeats`` runs:

* ``forgetful --help``;
* ``forgetful build-cohort --source synthetic --stays N`` (a small generated cohort; the first,
  generating run is a warm-up and not counted) — compute = the build's own ``seconds``;
* ``forgetful planted-secret --trials T`` — compute = the result's ``runtime_s``.

Fixed overhead = wall time − compute (interpreter, imports, the Prefect API, flow-run
bookkeeping, shutdown). Modes (``--modes``, comma-separated):

* ``own`` — the default CLI: its own API server, started before the heavy imports
  (:mod:`pipelines.runtime.signals`);
* ``prefect`` — ``FORGETFUL_API_SERVER=0``: Prefect's ephemeral server (the behaviour before);
* ``reuse`` — ``PREFECT_API_URL`` pointing at one server started by the benchmark (what
  ``prefect server start`` gives heavy users).

Runs are interleaved across modes so a load change on a shared machine hits every mode alike.
``--json PATH`` also writes the raw timings.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sv_core.jsonfile import write_json

MODES = ("own", "prefect", "reuse")


def _forgetful() -> list[str]:
    return [sys.executable, "-c", "import sys; from pipelines.cli import main; sys.exit(main())"]


def _run(argv: list[str], env: dict, cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    out = subprocess.run([*_forgetful(), *argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"bench_cli: `forgetful {' '.join(argv)}` exited {out.returncode}: "
                         f"{(out.stderr.strip().splitlines() or [''])[-1][:300]}")
    return wall, out


def _env(mode: str, api_url: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "FORGETFUL_API_SERVER")}
    env.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    env.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2]) + os.pathsep + env.get("PYTHONPATH", "")
    if mode == "prefect":
        env["FORGETFUL_API_SERVER"] = "0"
    elif mode == "reuse":
        env["PREFECT_API_URL"] = str(api_url)
    return env


def _build(work: Path, stays: int, env: dict) -> tuple[float, float]:
    work.mkdir(parents=True, exist_ok=True)
    wall, out = _run(["-q", "build-cohort", "--source", "synthetic", "--stays", str(stays), "--warehouse",
                      str(work / "warehouse.duckdb"), "--runs", str(work / "runs"), "--no-progress"], env, work)
    compute = float(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])
    return wall, compute


def _study(work: Path, trials: int, env: dict) -> tuple[float, float]:
    res = work / "planted_secret.json"
    wall, _ = _run(["-q", "planted-secret", "--trials", str(trials), "--out", str(res), "--no-progress"], env, work)
    return wall, float(json.loads(res.read_text())["runtime_s"])


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 2) if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipelines.bench.cli",
                                 description=__doc__.split("\n\n")[0].replace("``", ""))
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per command and mode (default 3)")
    ap.add_argument("--modes", default="own,prefect",
                    help=f"comma-separated, of {', '.join(MODES)} (default own,prefect)")
    ap.add_argument("--stays", type=int, default=40, help="synthetic stays for build-cohort (default 40)")
    ap.add_argument("--trials", type=int, default=2, help="planted-secret trials (default 2)")
    ap.add_argument("--commands", default="help,build-cohort,planted-secret", help="what to time (default: all three)")
    ap.add_argument("--dir", default=None, help="work folder (default: a fresh temporary folder)")
    ap.add_argument("--json", default=None, metavar="PATH", help="also write the raw timings to PATH")
    a = ap.parse_args(argv)
    modes = [m for m in a.modes.split(",") if m]
    if set(modes) - set(MODES):
        ap.error(f"unknown mode(s) {sorted(set(modes) - set(MODES))}")
    commands = [c for c in a.commands.split(",") if c]
    work = Path(a.dir or tempfile.mkdtemp(prefix="forgetful-bench-cli-")).resolve()
    server = None
    if "reuse" in modes:
        from pipelines.runtime.signals import ApiServer

        server = ApiServer().start()
        os.environ.pop("PREFECT_API_URL", None)  # only the "reuse" runs get it
        server.wait_ready()
    raw: dict[str, dict[str, list[dict]]] = {m: {c: [] for c in commands} for m in modes}
    try:
        if "build-cohort" in commands:  # warm-up: generates the synthetic files, migrates the DB
            for m in modes:
                _build(work / m, a.stays, _env(m, server and server.api_url))
        for i in range(a.repeats):
            for m in modes:
                env = _env(m, server and server.api_url)
                (work / m).mkdir(parents=True, exist_ok=True)
                for c in commands:
                    if c == "help":
                        wall, _ = _run(["--help"], env, work)
                        compute = 0.0
                    elif c == "build-cohort":
                        wall, compute = _build(work / m, a.stays, env)
                    elif c == "planted-secret":
                        wall, compute = _study(work / m, a.trials, env)
                    else:
                        raise SystemExit(f"bench_cli: unknown command {c!r}")
                    raw[m][c].append({"wall_s": round(wall, 3), "compute_s": round(compute, 3)})
                    print(f"[{i + 1}/{a.repeats}] {m:8s} {c:15s} wall {wall:6.2f} s  compute {compute:5.2f} s",
                          file=sys.stderr, flush=True)
    finally:
        if server is not None:
            server.stop()
    print(f"\nmedians of {a.repeats} runs (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    print(f"{'mode':8s} {'command':15s} {'wall s':>8s} {'compute s':>10s} {'overhead s':>11s}")
    summary = {}
    for m in modes:
        for c in commands:
            w = [r["wall_s"] for r in raw[m][c]]
            k = [r["compute_s"] for r in raw[m][c]]
            o = [x - y for x, y in zip(w, k)]
            summary[f"{m}/{c}"] = {"wall_s": _median(w), "compute_s": _median(k), "overhead_s": _median(o)}
            print(f"{m:8s} {c:15s} {_median(w):8.2f} {_median(k):10.2f} {_median(o):11.2f}")
    if a.json:
        write_json(a.json, {"summary": summary, "raw": raw, "stays": a.stays, "trials": a.trials}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
