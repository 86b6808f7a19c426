"""The full-size run-all record of the scale benchmark (pipelines.bench.fullrun): the record is made
from the files run-all writes (its --json, the cohort result, the root's manifest), the SCALE.md
section states those figures and the 2 GiB verdict, the scale result keeps the record through merges,
and bad inputs are refused in one line with every file left as it was."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pipelines.bench import fullrun as bf
from pipelines.bench import fullrun_report as rep
from pipelines.bench.scale_report import merge_results, render_markdown

STEPS = {"seconds": {"build-cohort": 20.0, "retention": 600.0, "heldout-spo2": 240.0},
         "cpu_seconds": {"build-cohort": 25.0, "retention": 590.0, "heldout-spo2": 250.0},
         "peak_rss_mb": {"build-cohort": 1100.0, "retention": 1900.0, "heldout-spo2": 1950.5},
         "children_peak_rss_mb": {"build-cohort": 200.0, "retention": 210.0, "heldout-spo2": 215.0},
         "start_rss_mb": {"build-cohort": 150.0, "retention": 260.0, "heldout-spo2": 300.0},
         "peak_rss_mb_max": 1950.5, "rss_method": "VmHWM", "rss_method_note": "per-step VmHWM",
         "total_seconds": 860.0}


def _runs(tmp: Path, steps: dict = STEPS) -> tuple[Path, Path, Path]:
    runs, root = tmp / "runs", tmp / "root"
    (runs / "cohort").mkdir(parents=True)
    (runs / "icu_retention").mkdir()
    root.mkdir()
    (runs / "cohort" / "result.json").write_text(json.dumps({
        "data": "synthetic", "metrics": {"n_stays": 42000, "n_tokens": 6000000},
        "tables": [{"title": "funnel", "rows": [["icu_stays_in_source", 94000, None], ["los_ge_48h", 43000, None]]}]}))
    (runs / "icu_retention" / "result.json").write_text(json.dumps({
        "claims": [{"holds": True}, {"holds": False}, {"holds": True}]}))
    (root / "synthetic_manifest.json").write_text(json.dumps({"chartevents_rows": 395000000}))
    sj = tmp / "steps.json"
    sj.write_text(json.dumps(steps))
    return runs, root, sj


def _record(tmp: Path, steps: dict = STEPS) -> dict:
    runs, root, sj = _runs(tmp, steps)
    return rep.make_record(sj, runs, root=root, made=rep.Provenance(
        command="python -m pipelines.cli run-all …", bench_command="B", commit="abcdef1234",
        machine={"cpu_count": 2}, uptime_start="u0", uptime_end="u1", rc=0, created_utc="T"))


def test_record_from_run_files(tmp_path):
    r = _record(tmp_path)
    assert r["data"] == {"source_kind": "synthetic", "icu_stays": 94000, "eligible_stays": 42000,
                         "hourly_tokens": 6000000, "chartevents_rows": 395000000}
    assert r["steps"]["heldout-spo2"] == {"wall_s": 240.0, "cpu_s": 250.0, "peak_rss_mb": 1950.5,
                                          "children_peak_rss_mb": 215.0, "start_rss_mb": 300.0}
    assert r["peak_rss_mb_max"] == 1950.5 and r["headlines"] == {"retention": "2/3 claims hold"}


def test_section_states_the_figures_and_the_verdict(tmp_path):
    text = "\n".join(rep.render_section(_record(tmp_path)))
    assert "| retention | 10.0 min | 590 | 1,900 | 210 | 260 |" in text
    assert "| build-cohort | 20 s | 25 | 1,100 | 200 | 150 |" in text
    assert "395,000,000 chartevents rows, 94,000 ICU stays, 42,000 eligible" in text
    assert "1,950 MB (heldout-spo2) — within" in text and "865 CPU-s" in text
    above = dict(STEPS, peak_rss_mb=dict(STEPS["peak_rss_mb"], retention=2100.0), peak_rss_mb_max=2100.0)
    text2 = "\n".join(rep.render_section(_record(tmp_path / "b", above)))
    assert "2,100 MB (retention) — above" in text2


def test_scale_result_keeps_the_latest_record_and_renders_it(tmp_path):
    a = {"kind": "bench_scale", "sizes": [], "full_run": {"commit": "old", "steps": {}}}
    b = {"kind": "bench_scale", "sizes": [], "full_run": _record(tmp_path)}
    assert merge_results([a, b])["full_run"]["commit"] == "abcdef1234"
    assert merge_results([b, {"kind": "bench_scale", "sizes": []}])["full_run"]["commit"] == "abcdef1234"
    assert "## Full-size run-all" in render_markdown(merge_results([a, b]))
    assert "## Full-size run-all" not in render_markdown({"kind": "bench_scale", "sizes": []})


def test_record_cli_attaches_and_renders(tmp_path):
    runs, root, sj = _runs(tmp_path)
    into, doc = tmp_path / "SCALE.json", tmp_path / "SCALE.md"
    into.write_text(json.dumps({"kind": "bench_scale", "sizes": []}))
    rc = bf.main(["--record", str(runs), "--steps", str(sj), "--uptime-start", "u0", "--uptime-end", "u1",
                  "--command", "python -m pipelines.cli run-all", "--data-root", str(root), "--into", str(into),
                  "--doc", str(doc), "--out", str(tmp_path / "rec.json")])
    assert rc == 0
    assert json.loads(into.read_text())["full_run"]["steps"]["retention"]["cpu_s"] == 590.0
    assert json.loads((tmp_path / "rec.json").read_text())["data"]["eligible_stays"] == 42000
    assert "| heldout-spo2 | 4.0 min | 250 | 1,950 | 215 | 300 |" in doc.read_text()


def test_repeats_are_kept_with_again_and_shown_side_by_side(tmp_path, capsys):
    """--add attaches a record an earlier --out wrote; --again keeps the earlier runs (full_runs) and the
    document shows every run's per-step peak; without --again the earlier runs are dropped."""
    first = _record(tmp_path / "a")
    heavier = _record(tmp_path / "b", dict(STEPS, peak_rss_mb=dict(STEPS["peak_rss_mb"], retention=2100.0),
                                          peak_rss_mb_max=2100.0))
    (tmp_path / "r1.json").write_text(json.dumps(first))
    (tmp_path / "r2.json").write_text(json.dumps(heavier))
    into, doc = tmp_path / "SCALE.json", tmp_path / "SCALE.md"
    into.write_text(json.dumps({"kind": "bench_scale", "sizes": []}))
    assert bf.main(["--add", str(tmp_path / "r1.json"), "--into", str(into), "--doc", str(doc)]) == 0
    assert "### Every full-size run" not in doc.read_text()
    assert bf.main(["--add", str(tmp_path / "r2.json"), "--again", "--into", str(into), "--doc", str(doc)]) == 0
    result = json.loads(into.read_text())
    assert [r["peak_rss_mb_max"] for r in result["full_runs"]] == [1950.5, 2100.0]
    assert result["full_run"]["peak_rss_mb_max"] == 2100.0
    text = doc.read_text()
    assert "2 full-size runs; 1 of them kept every step within 2,048 MB" in text
    assert "| retention | 1,900 | 2,100 |" in text and "| **largest** | **1,950** | **2,100** |" in text
    assert merge_results([{"kind": "bench_scale", "sizes": []}, result])["full_runs"] == result["full_runs"]
    assert bf.main(["--add", str(tmp_path / "r1.json"), "--into", str(into), "--no-doc"]) == 0
    assert len(json.loads(into.read_text())["full_runs"]) == 1
    capsys.readouterr()
    before = into.read_text()
    (tmp_path / "bad.json").write_text(json.dumps({"kind": "other"}))
    for bad in ("bad.json", "missing.json"):
        assert bf.main(["--add", str(tmp_path / bad), "--again", "--into", str(into), "--no-doc"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err and into.read_text() == before


@pytest.mark.parametrize("breakage", ["no steps file", "not json", "no seconds", "no cohort result"])
def test_bad_inputs_one_line_and_nothing_written(tmp_path, capsys, breakage):
    runs, root, sj = _runs(tmp_path)
    into, doc = tmp_path / "SCALE.json", tmp_path / "SCALE.md"
    into.write_text('{"kind": "bench_scale", "sizes": []}')
    doc.write_text("before")
    if breakage == "no steps file":
        sj.unlink()
    elif breakage == "not json":
        sj.write_text("{oops")
    elif breakage == "no seconds":
        sj.write_text(json.dumps({"peak_rss_mb": {}}))
    else:
        (runs / "cohort" / "result.json").unlink()
    rc = bf.main(["--record", str(runs), "--steps", str(sj), "--uptime-start", "u0", "--uptime-end", "u1",
                  "--command", "c", "--into", str(into), "--doc", str(doc)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: ") and "\n" not in err
    assert into.read_text() == '{"kind": "bench_scale", "sizes": []}' and doc.read_text() == "before"


def test_run_mode_runs_the_command_and_records_it(tmp_path, monkeypatch):
    """--root runs run-all (here a stand-in that writes what run-all writes) and records its figures."""
    runs0, root, sj0 = _runs(tmp_path / "src")
    fake = tmp_path / "fake_run_all.py"
    fake.write_text(
        "import json, shutil, sys\n"
        "a = sys.argv[1:]\n"
        "runs, steps = a[a.index('--runs') + 1], a[a.index('--json') + 1]\n"
        f"shutil.copytree({str(runs0)!r}, runs)\n"
        f"shutil.copy({str(sj0)!r}, steps)\n")
    monkeypatch.setattr(bf, "run_all_argv", lambda root, runs, steps, s, e: [
        sys.executable, str(fake), "--runs", str(runs), "--json", str(steps)])
    into, doc = tmp_path / "SCALE.json", tmp_path / "SCALE.md"
    into.write_text(json.dumps({"kind": "bench_scale", "sizes": []}))
    rc = bf.main(["--root", str(root), "--workdir", str(tmp_path / "work"), "--into", str(into), "--doc", str(doc)])
    assert rc == 0
    rec = json.loads(into.read_text())["full_run"]
    assert rec["rc"] == 0 and rec["steps"]["retention"]["peak_rss_mb"] == 1900.0
    assert rec["data"]["chartevents_rows"] == 395000000 and "load average" in rec["uptime_start"]
    assert "## Full-size run-all" in doc.read_text()


def test_recorded_commands_name_no_local_folder(tmp_path, monkeypatch):
    """The record is committed: its command lines show placeholders, not the machine's folders."""
    runs0, root, sj0 = _runs(tmp_path / "src")
    fake = tmp_path / "fake_run_all.py"
    fake.write_text("import json, shutil, sys\na = sys.argv[1:]\n"
                    f"shutil.copytree({str(runs0)!r}, a[a.index('--runs') + 1])\n"
                    f"shutil.copy({str(sj0)!r}, a[a.index('--json') + 1])\n")
    real = bf.run_all_argv
    monkeypatch.setattr(bf, "run_all_argv", lambda *a: [sys.executable, str(fake), *real(*a)[2:]])
    into = tmp_path / "SCALE.json"
    into.write_text(json.dumps({"kind": "bench_scale", "sizes": []}))
    work = tmp_path / "work"
    assert bf.main(["--root", str(root), "--workdir", str(work), "--into", str(into), "--no-doc"]) == 0
    rec = json.loads(into.read_text())["full_run"]
    for line in (rec["command"], rec["bench_command"]):
        assert str(root) not in line and str(work) not in line and str(into) not in line, line
    assert "--root ROOT" in rec["command"] and "--runs WORKDIR/runs" in rec["command"]
    assert rec["bench_command"].startswith("python -m pipelines.bench.fullrun --root ROOT --workdir WORKDIR")
