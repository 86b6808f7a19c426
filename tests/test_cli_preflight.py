"""Bad input is reported before anything heavy starts (:mod:`pipelines.preflight`).

Every case runs the real ``forgetful`` entry point in process mode (``pipelines.cli.main()`` with
``sys.argv``) in a fresh interpreter and asserts: the exact exit code (2 usage, 3 data), exactly
one line on stderr naming the problem, no traceback, neither Prefect nor torch imported and no
Prefect API server started (the server sets ``PREFECT_API_URL`` in the command's environment when
it starts). The wall time of each case is printed (``-s``) and bounded generously (hang detection
only; measured well under 2 s on 2 loaded cores). The source roots are decoys in a temporary
folder: header lines only, no records.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelines import preflight
from pipelines.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
BOUND_S = 10.0  # hang detection on a noisy CI machine; the real figures are printed

HEADERS = {
    "icu/icustays": "subject_id,hadm_id,stay_id,first_careunit,last_careunit,intime,outtime,los\n",
    "icu/chartevents": "subject_id,hadm_id,stay_id,caregiver_id,charttime,storetime,itemid,value,valuenum,valueuom,"
                       "warning\n",
    "icu/d_items": "itemid,label,abbreviation,linksto,category,unitname,param_type,lownormalvalue,highnormalvalue\n",
    "hosp/patients": "subject_id,gender,anchor_age,anchor_year,anchor_year_group,dod\n",
    "hosp/admissions": "subject_id,hadm_id,admittime,dischtime\n",
}


def _gz(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write(text)


def _mimic_root(d: Path, *, drop_column: str | None = None, corrupt: str | None = None,
                only: tuple[str, ...] | None = None) -> Path:
    for rel, header in HEADERS.items():
        if only is not None and rel not in only:
            continue
        p = d / f"{rel}.csv.gz"
        if rel == corrupt:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(b"not a gzip stream\x00\x01")
        else:
            _gz(p, header.replace(f",{drop_column}", "") if drop_column and rel == "icu/icustays" else header)
    return d


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    t = tmp_path_factory.mktemp("preflight")
    clif = t / "clif_garbage"
    clif.mkdir()
    for name in ("clif_adt", "clif_vitals", "clif_hospitalization", "clif_patient"):
        (clif / f"{name}.parquet").write_bytes(b"PAR1 not parquet")
    (t / "existing.duckdb").write_bytes(b"")  # only its existence is looked at
    (t / "frozen.json").write_text("{}")
    _mimic_root(t / "mimic_no_stays", only=("icu/chartevents",))  # a part file, but no icu/icustays
    text_time = _mimic_root(t / "mimic_text_time")  # chartevents as parquet whose charttime is text
    (text_time / "icu" / "chartevents.csv.gz").unlink()
    import duckdb

    duckdb.sql("SELECT 1::BIGINT AS subject_id, 1::BIGINT AS hadm_id, 1::BIGINT AS stay_id, 1::BIGINT AS caregiver_id, "
               "'2180-01-01 10:00' AS charttime, 220045::BIGINT AS itemid, 80.0 AS valuenum LIMIT 0").write_parquet(
        str(text_time / "icu" / "chartevents.parquet"))
    (t / "bad_event.yaml").write_text("predicates:\n  x: {code: NOPE, value_min: 1}\n")
    return {
        "text_time": text_time,
        "bad_event": t / "bad_event.yaml",
        "ok": _mimic_root(t / "mimic_ok"),
        "columns": _mimic_root(t / "mimic_columns", drop_column="outtime"),
        "corrupt": _mimic_root(t / "mimic_corrupt", corrupt="icu/chartevents"),
        "missing": _mimic_root(t / "mimic_missing", only=("icu/icustays",)),
        "clif": clif,
        "tmp": t,
    }


def _cases(r: dict[str, Path]) -> list[tuple[str, list[str], int, str]]:
    """(name, argv, exit code, what the one stderr line must contain)"""
    t = r["tmp"]
    nowh = str(t / "no-such.duckdb")
    return [
        ("run-all without --root", ["run-all", "--source", "mimic"], 2, "--source mimic needs --root"),
        ("build-cohort clif without --root", ["-q", "build-cohort", "--source", "clif"], 2,
         "--source clif needs --root"),
        ("serve bad cron", ["serve", "--cron", "not a cron", "--dry-run"], 2, "not a valid cron string"),
        ("serve hashed cron", ["serve", "--cron", "H 3 * * *", "--dry-run"], 2, "--cron"),
        ("serve mimic without --root", ["serve", "--source", "mimic", "--dry-run"], 2, "needs --root"),
        ("missing column", ["build-cohort", "--source", "mimic", "--root", str(r["columns"]), "--warehouse", nowh],
         3, "MissingColumnsError: "),
        ("corrupt gzip", ["run-all", "--source", "mimic", "--root", str(r["corrupt"]), "--runs", str(t / "runs")],
         3, "UnreadableInputError: "),
        ("missing table", ["build-cohort", "--source", "mimic", "--root", str(r["missing"])], 3, "InputMissingError: "),
        ("root not a folder", ["build-cohort", "--source", "mimic", "--root", str(t / "nowhere")], 3,
         "InputMissingError: "),
        ("garbage parquet", ["build-cohort", "--source", "clif", "--root", str(r["clif"])], 3,
         "UnreadableInputError: "),
        ("demo not cached", ["build-cohort", "--root", str(t / "empty-cache")], 3, "DemoDataMissing: "),
        ("study without warehouse", ["retention", "--warehouse", nowh], 3, "WarehouseMissingError: "),
        ("run-all --skip build-cohort without warehouse",
         ["run-all", "--source", "synthetic", "--skip", "build-cohort", "--runs", str(t / "runs")], 3,
         "WarehouseMissingError: "),
        ("ingest without --init", ["ingest", "--source", "mimic", "--root", str(r["ok"]), "--warehouse", nowh], 3,
         "forgetful ingest --init"),
        ("ingest --init on an existing warehouse",
         ["ingest", "--init", "--source", "mimic", "--root", str(r["ok"]), "--warehouse", str(t / "existing.duckdb")],
         3, "IngestError: "),
        ("ingest --frozen without --init",
         ["ingest", "--source", "mimic", "--root", str(r["ok"]), "--frozen", str(t / "frozen.json")], 2, "--frozen"),
        ("ingest root without stays table", ["ingest", "--source", "mimic", "--root", str(t / "mimic_no_stays")], 3,
         "missing input table 'icu/icustays'"),
        ("zero seeds", ["deterioration", "--seeds", "0", "--warehouse", nowh], 2,
         "argument --seeds: must be at least 1, got 0"),
        ("ingest with zero jobs", ["ingest", "--source", "mimic", "--root", str(r["ok"]), "--jobs", "0"], 2,
         "argument --jobs: must be at least 1"),
        # issue 31 item 8: every number finite and in range, ids within int64, typed source columns
        *[(f"build-cohort --min-hours {v}", ["build-cohort", "--source", "mimic", "--root", str(r["ok"]),
                                             "--min-hours", v], 2, f"argument --min-hours: {why}")
          for v, why in (("nan", "must be a finite number, got nan"), ("inf", "must be a finite number, got inf"),
                         ("1e308", "must be at most"), ("-1", "must be at least 0"))],
        *[(f"gate-demo --sigma {v}", ["gate-demo", "--sigma", v], 2, f"argument --sigma: {why}")
          for v, why in (("nan", "must be a finite number"), ("-1", "must be more than 0"), ("inf", "must be a finite"),
                         ("0", "must be more than 0"))],
        ("gate-demo --nu 1.5", ["gate-demo", "--nu", "1.5"], 2, "argument --nu: must be at most 1"),
        ("retention --wait -5", ["retention", "--warehouse", nowh, "--wait", "-5"], 2,
         "argument --wait: must be at least 0, got -5"),
        ("retention --nu nan", ["retention", "--warehouse", nowh, "--nu", "nan"], 2, "argument --nu: must be a finite"),
        ("run-all --n-boot 0", ["run-all", "--n-boot", "0"], 2, "argument --n-boot: must be at least 1"),
        ("subject id beyond int64", ["forget", "--subject-id", str(2 ** 63)], 2,
         "argument --subject-id: must fit in 64 bits"),
        ("stay id beyond int64", ["forget", "--stay-id", str(-2 ** 63 - 1)], 2, "argument --stay-id: must fit in 64"),
        ("subject id not an integer", ["forget", "--subject-id", "1e3"], 2, "argument --subject-id: not an integer"),
        ("ingest --as-of not a time", ["ingest", "--source", "mimic", "--root", str(r["ok"]), "--as-of", "soon"], 2,
         "argument --as-of: not an ISO time"),
        ("events file missing", ["heldout-spo2", "--warehouse", nowh, "--events", str(t / "none.yaml")], 2,
         "argument --events: --events"),
        ("events file not an event", ["retention", "--warehouse", nowh, "--events", str(r["bad_event"])], 2,
         "predicate 'x': code 'NOPE' names none of the six vitals"),
        ("charttime as text in a parquet", ["build-cohort", "--source", "mimic", "--root", str(r["text_time"])], 3,
         "ColumnTypeError: "),
        ("workers not a number", ["audit", "--workers", "two"], 2, "argument --workers: not an integer"),
        ("--root without its folder", ["build-cohort", "--source", "mimic", "--root"], 2, "expected one argument"),
    ]


CHILD = r'''
import contextlib, io, json, os, sys, time, traceback
from pipelines import cli
out = []
for argv in json.loads(sys.argv[1]):
    sys.argv = ["forgetful", *argv]
    err = io.StringIO()
    t = time.perf_counter()
    try:
        with contextlib.redirect_stderr(err):
            rc = cli.main()
    except BaseException:
        rc, err = "raised", io.StringIO(traceback.format_exc())
    out.append({"rc": rc, "wall": time.perf_counter() - t, "stderr": err.getvalue(),
                "server": "PREFECT_API_URL" in os.environ})
mods = sorted(m for m in ("prefect", "torch", "sv_core", "polars") if m in sys.modules)
print(json.dumps({"cases": out, "modules": mods}))
'''


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "FORGETFUL_API_SERVER")}
    env.update(PYTHONPATH=str(ROOT), PREFECT_SERVER_ANALYTICS_ENABLED="false", FORGETFUL_DATA=str(ROOT / "nowhere"))
    return env


def test_bad_input_is_one_line_and_the_right_exit_code_before_prefect_starts(roots, tmp_path):
    cases = _cases(roots)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CHILD, json.dumps([c[1] for c in cases])], cwd=tmp_path, env=_env(),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    print(f"\n{len(cases)} bad inputs in one process: {time.perf_counter() - t0:.2f} s wall (interpreter included)")
    for (name, argv, code, needle), r in zip(cases, got["cases"]):
        lines = [ln for ln in r["stderr"].splitlines() if ln.strip()]
        print(f"  {r['wall']:.3f} s  exit {r['rc']}  {name}: {lines[-1][:110] if lines else ''}")
        assert r["rc"] == code, (name, r)
        assert len(lines) == 1 and "Traceback" not in r["stderr"], (name, r["stderr"])
        assert needle in lines[0], (name, lines[0])
        if name == "charttime as text in a parquet":  # names the file and the column
            assert "chartevents.parquet: column charttime is VARCHAR, expected a timestamp" in lines[0]
        prefix = f"forgetful {argv[1] if argv[0] == '-q' else argv[0]}: error: " if code == 2 else "error: "
        assert lines[0].startswith(prefix), (name, lines[0])
        assert not r["server"], f"{name}: the Prefect API server was started"
        assert r["wall"] < BOUND_S, (name, r["wall"])
    assert got["modules"] == [], f"imported before the check failed: {got['modules']}"
    ingest = next(r for (name, *_), r in zip(cases, got["cases"]) if name == "ingest without --init")
    assert "build-cohort" not in ingest["stderr"]  # a streaming warehouse is made by `ingest --init`


@pytest.mark.parametrize("argv,code", [(["run-all", "--source", "mimic"], 2),
                                        (["serve", "--cron", "not a cron", "--dry-run"], 2)])
def test_a_real_process_leaves_within_the_bound_and_starts_no_child(argv, code, tmp_path):
    psutil = pytest.importorskip("psutil")
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.cli", *argv], cwd=tmp_path, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    me = psutil.Process(proc.pid)
    servers = set()  # Python children: the API server is one (`python -c <uvicorn app>`)
    while proc.poll() is None:
        try:
            for c in me.children(recursive=True):
                try:
                    cmd = " ".join(c.cmdline())
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue  # gone already: a short-lived helper (croniter runs `file` via platform)
                if cmd == " ".join(me.cmdline()):
                    continue  # a fork of the command itself before its exec (platform runs `file`)
                if "uvicorn" in cmd or "python" in Path(cmd.split(" ")[0]).name:
                    servers.add(cmd[:200])
        except psutil.NoSuchProcess:
            break
        time.sleep(0.01)
    out, err = proc.communicate(timeout=60)
    wall = time.perf_counter() - t
    print(f"\n{' '.join(argv)}: exit {proc.returncode} in {wall:.2f} s")
    assert proc.returncode == code and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not servers, f"a Python child (the Prefect API server) was started: {servers}"
    assert wall < BOUND_S


def test_good_inputs_pass(roots, tmp_path):
    demo = tmp_path / "demo"
    demo.mkdir()
    for name in ("clif_adt", "clif_vitals", "clif_hospitalization", "clif_patient"):
        (demo / f"{name}.parquet").write_bytes(b"")  # ensure_demo looks at presence only
    wh = tmp_path / "w.duckdb"
    wh.write_bytes(b"")
    ok = str(roots["ok"])
    for cmd, args in [("build-cohort", ["--source", "mimic", "--root", ok]),
                      ("build-cohort", ["--root", str(demo)]),
                      ("build-cohort", ["--source", "synthetic", "--stays", "40"]),
                      ("run-all", ["--source", "clif", "--root", "x", "--skip", "build-cohort",
                                   "--warehouse", str(wh)]),
                      ("run-all", ["--fetch", "--root", str(tmp_path / "to-be-fetched")]),
                      ("retention", ["--warehouse", str(wh), "--n-boot", "10"]),
                      ("ingest", ["--source", "mimic", "--root", ok, "--warehouse", str(wh)]),
                      ("ingest", ["--init", "--source", "mimic", "--root", ok,
                                  "--warehouse", str(tmp_path / "new.duckdb"),
                                  "--frozen", str(roots["tmp"] / "frozen.json")]),
                      ("serve", ["--cron", "*/15 * * * *", "--source", "mimic", "--root", ok, "--dry-run"]),
                      ("retention", ["--help"]),  # help never checks
                      ("forget", ["--subject-id", "1"])]:  # no checks: the command reports itself
        preflight.check(cmd, args)


def test_the_light_parsers_declare_options_as_the_commands_do():
    """Each option a check reads is declared in the light parser exactly as in the command's own
    parser (flags, dest, default, type, choices, nargs, required, flag or value)."""
    for cmd in preflight.SPECS:
        full = build_parser([cmd])
        sub = next(a for a in full._actions if isinstance(a, argparse._SubParsersAction)).choices[cmd]
        light = preflight.light_parser(cmd)
        by_flag = {s: a for a in sub._actions for s in a.option_strings}
        for flags, kw in preflight.SPECS[cmd]:
            a = by_flag.get(flags[0])
            assert a is not None, f"{cmd} {flags[0]}: not an option of the command"
            assert tuple(a.option_strings) == flags, (cmd, flags, a.option_strings)
            la = next(x for x in light._actions if flags[0] in x.option_strings)
            assert la.dest == a.dest and type(la) is type(a), (cmd, flags)
            assert sub.get_default(a.dest) == light.get_default(a.dest), (cmd, flags, sub.get_default(a.dest))
            for attr in ("type", "nargs"):
                assert getattr(la, attr) == getattr(a, attr), (cmd, flags, attr)
            if "choices" in kw:
                assert list(kw["choices"]) == list(a.choices), (cmd, flags)
            assert kw.get("required", False) == a.required, (cmd, flags)


def test_cron_check_agrees_with_prefects_schedule():
    from prefect.client.schemas.schedules import CronSchedule

    for cron in ("0 3 * * *", "*/5 * * * *", "@daily", "0 3 * * mon-fri", "0 0 * * * 0", "not a cron",
                 "H 3 * * *", "R 3 * * *", "61 * * * *", "0 3 * *", "", "0 3 * * * * * *"):
        try:
            CronSchedule(cron=cron)
            prefect_ok = True
        except ValueError:
            prefect_ok = False
        try:
            preflight.check_cron(cron)
            ours = True
        except preflight.UsageError:
            ours = False
        assert ours == prefect_ok, cron


def test_serve_reports_a_schedule_prefect_refuses_in_one_line(capsys, tmp_path):
    """The serve command's own guard, for a call that did not go through the preflight."""
    from pipelines.flows import serve_cli

    p = build_parser(["serve"])
    args = p.parse_args(["serve", "--cron", "61 * * * *", "--dry-run", "--runs", str(tmp_path)])
    assert serve_cli._main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("forgetful serve: error: ") and "61 * * * *" in err[0], err


def test_serve_schedules_run_all_on_the_given_root(roots, capsys, tmp_path):
    from pipelines.flows import serve_cli

    deps = serve_cli.build_deployments(runs_dir=str(tmp_path), source="mimic", root=str(roots["ok"]))
    assert deps[0].parameters["root"] == str(roots["ok"].resolve()) and deps[0].parameters["source"] == "mimic"
    assert "root" not in serve_cli.build_deployments(runs_dir=str(tmp_path))[0].parameters
