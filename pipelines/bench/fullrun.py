"""Full-size ``run-all`` of the scale benchmark (a command, never a timed test)::

    python -m pipelines.bench.fullrun --root DIR --workdir DIR [--det-seeds 1] [--det-max-epochs 2]
        [--into docs/SCALE.json] [--doc docs/SCALE.md] [--out FILE.json]
    python -m pipelines.bench.fullrun --record RUNS_DIR --steps STEPS.json --uptime-start LINE
        --uptime-end LINE --command CMD [--commit REV] [--root DIR] [--rc 0] [--into ...] [--doc ...]
    python -m pipelines.bench.fullrun --add RECORD.json [--again] [--into ...] [--doc ...]

The first form runs the whole pipeline once, as a user would (``python -m pipelines.cli run-all
--source mimic --root DIR --runs <workdir>/runs … --json <workdir>/steps.json``, deterioration capped
by ``--det-seeds`` / ``--det-max-epochs``), in its own process with ``uptime`` before and after; the
second records a run made that way earlier from the files it wrote; the third attaches a record an
earlier ``--out`` wrote. Either writes the record
(:mod:`pipelines.bench.fullrun_report`: per step wall, CPU, peak RSS, the RSS earlier steps left,
the data's aggregate counts) to ``--out``, attaches it to the scale benchmark's result
(``--into docs/SCALE.json``, key ``full_run``; :func:`pipelines.bench.scale_report.merge_results`
keeps it) and re-renders ``--doc`` from that result, so ``docs/SCALE.md`` states the figures of
the result file (its run time is in the record). With ``--again`` the earlier full-size runs stay
beside it (key ``full_runs``, oldest first): the document then shows every run's per-step peak RSS.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from pipelines.bench.fullrun_report import FullRunError, Provenance, make_record, read_record
from pipelines.bench.scale import machine_info, uptime_line, write_doc
from sv_core.jsonfile import write_json

PROJECT = Path(__file__).resolve().parents[2]


def _commit() -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(PROJECT), "rev-parse", "HEAD"], capture_output=True, text=True,
                           timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() or None if r.returncode == 0 else None


def attach(record: dict, into: Path, doc: Path | None, again: bool = False) -> None:
    """Put ``record`` into the scale result ``into`` (key ``full_run``; ``full_runs`` lists it after
    the earlier runs with ``again``, alone without) and re-render ``doc``."""
    try:
        result = json.loads(into.read_text())
    except FileNotFoundError:
        raise FullRunError(f"scale result not found: {into} (run python -m pipelines.bench.scale first)") from None
    except (OSError, ValueError) as e:
        raise FullRunError(f"scale result is not readable JSON: {into} ({type(e).__name__})") from None
    earlier = (result.get("full_runs") or ([result["full_run"]] if result.get("full_run") else [])) if again else []
    result["full_run"], result["full_runs"] = record, [*earlier, record]
    write_json(into, result, indent=1)
    if doc is not None:
        write_doc(result, doc, os.path.relpath(into.resolve(), doc.resolve().parent))


#: path options of this command, shown as placeholders in the recorded command lines (the result
#: is committed: it should name no folder of the machine that made it)
PATH_OPTIONS = {"--root": "ROOT", "--workdir": "WORKDIR", "--record": "RUNS_DIR", "--steps": "STEPS.json",
                "--data-root": "ROOT", "--out": "OUT.json", "--into": "SCALE.json", "--doc": "SCALE.md"}


def redact(argv: list[str]) -> list[str]:
    """``argv`` with the value of every path option replaced by its placeholder."""
    out = list(argv)
    for k, tok in enumerate(out[:-1]):
        if tok in PATH_OPTIONS:
            out[k + 1] = PATH_OPTIONS[tok]
    return out


def run_all_argv(root: Path, runs: Path, steps: Path, det_seeds: int, det_max_epochs: int) -> list[str]:
    return [sys.executable, "-m", "pipelines.cli", "run-all", "--source", "mimic", "--root", str(root),
            "--runs", str(runs), "--det-seeds", str(det_seeds), "--det-max-epochs", str(det_max_epochs),
            "--no-progress", "--json", str(steps)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m pipelines.bench.fullrun",
        description="Run (or record) one full-size run-all on a MIMIC-layout root and put its per-step wall "
                    "time, CPU and peak RSS into the scale benchmark's result and docs/SCALE.md.")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--root", help="MIMIC-layout root to run run-all on (--source mimic)")
    g.add_argument("--record", metavar="RUNS_DIR", help="record an earlier run-all from its runs folder")
    g.add_argument("--add", metavar="RECORD_JSON", help="attach a record an earlier --out wrote")
    ap.add_argument("--workdir", help="run: the runs folder, logs and steps file go here")
    ap.add_argument("--det-seeds", type=int, default=1, help="deterioration training seeds (default 1)")
    ap.add_argument("--det-max-epochs", type=int, default=2, help="deterioration epochs cap (default 2)")
    ap.add_argument("--steps", help="--record: the run's --json file")
    ap.add_argument("--uptime-start", help="--record: uptime's line at the run's start")
    ap.add_argument("--uptime-end", help="--record: uptime's line at the run's end")
    ap.add_argument("--command", help="--record: the run-all command line that made the run")
    ap.add_argument("--commit", help="--record: the commit the run used")
    ap.add_argument("--data-root", help="--record: the root the run read (for the chartevents row count)")
    ap.add_argument("--rc", type=int, default=0, help="--record: the run's exit code")
    ap.add_argument("--out", help="also write the record to this JSON file")
    ap.add_argument("--into", default=str(PROJECT / "docs" / "SCALE.json"),
                    help="scale benchmark result to attach the record to (default docs/SCALE.json)")
    ap.add_argument("--doc", default=str(PROJECT / "docs" / "SCALE.md"), help="document re-rendered from --into")
    ap.add_argument("--no-doc", action="store_true", help="do not re-render the document")
    ap.add_argument("--again", action="store_true",
                    help="keep the earlier full-size runs beside this one (a repeat) instead of replacing them")
    a = ap.parse_args(argv)
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    bench_cmd = "python -m pipelines.bench.fullrun " + " ".join(
        shlex.quote(x) for x in redact(list(argv if argv is not None else sys.argv[1:])))
    try:
        if a.root:
            if not a.workdir:
                ap.error("--root needs --workdir")
            work = Path(a.workdir).resolve()
            runs, steps = work / "runs", work / "steps.json"
            work.mkdir(parents=True, exist_ok=True)
            env = dict(os.environ)
            env.setdefault("FORGETFUL_CONFIG_DIR", str(work / "config"))
            env.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
            cmd = run_all_argv(Path(a.root).resolve(), runs, steps, a.det_seeds, a.det_max_epochs)
            up0, commit = uptime_line(), _commit()  # the code the run starts with (HEAD may move while it runs)
            print(f"[bench_fullrun] {up0}\n[bench_fullrun] running: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
            with open(work / "run_all.out", "wb") as out, open(work / "run_all.err", "wb") as err:
                rc = subprocess.call(cmd, env=env, cwd=str(PROJECT), stdout=out, stderr=err)
            shown = [{str(runs): "WORKDIR/runs", str(steps): "WORKDIR/steps.json"}.get(x, x)
                     for x in redact(cmd[1:])]
            record = make_record(steps, runs, root=Path(a.root), made=Provenance(
                " ".join(["python", *shown]), bench_cmd, commit, machine_info(), up0, uptime_line(), rc, now))
        elif a.add:
            record = read_record(Path(a.add))
        else:
            missing = [f"--{k.replace('_', '-')}" for k in ("steps", "uptime_start", "uptime_end", "command")
                       if not getattr(a, k)]
            if missing:
                ap.error("--record needs " + ", ".join(missing))
            record = make_record(Path(a.steps), Path(a.record), root=Path(a.data_root) if a.data_root else None,
                                 made=Provenance(a.command, a.command, a.commit, machine_info(), a.uptime_start,
                                                 a.uptime_end, a.rc, now))
        if a.out:
            write_json(a.out, record, indent=1)
        attach(record, Path(a.into), None if a.no_doc else Path(a.doc), again=a.again)
    except FullRunError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({k: record[k] for k in ("rc", "peak_rss_mb_max", "total_seconds")}))
    return 0 if record["rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
