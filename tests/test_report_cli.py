"""``forgetful report``: re-renders the report from stored results, starts no Prefect server, and
leaves the old report in place on bad input (issue 18: the README named a command that did not exist)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pipelines.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _result(runs: Path, title: str = "Planted secret (test layout)") -> None:
    from dashboards.schema import write_result

    write_result({"study": "planted_secret", "title": title, "data": "synthetic", "runtime_s": 1.0,
                  "seed_figure": {}, "metrics": {"m": 1.0}, "figures": [],
                  "tables": [{"title": "t", "columns": ["a", "b"], "rows": [["x", 0.5]]}],
                  "claims": [{"statement": "s", "reference": "r", "path": "p", "value": 0.0, "holds": True}]},
                 runs / "planted_secret" / "result.json")


def test_report_renders_the_stored_results(tmp_path, capsys):
    runs = tmp_path / "runs"
    _result(runs)
    assert main(["report", "--runs", str(runs), "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    html = (runs / "report.html").read_text()  # default: <runs>/report.html
    assert "Planted secret (test layout)" in html and f"wrote {runs / 'report.html'}" in out
    assert json.loads((tmp_path / "r.json").read_text())["studies"] == ["planted_secret"]
    # after a change to the stored results, a re-render shows it
    _result(runs, title="Planted secret, rerun")
    assert main(["report", "--runs", str(runs), "--out", str(tmp_path / "other.html")]) == 0
    assert "Planted secret, rerun" in (tmp_path / "other.html").read_text()


def test_bad_runs_folder_is_one_line_and_leaves_the_old_report(tmp_path, capsys):
    assert main(["report", "--runs", str(tmp_path / "missing")]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: RunsDirectoryError") and not (tmp_path / "missing").exists()
    runs = tmp_path / "runs"
    _result(runs)
    old = tmp_path / "report.html"
    old.write_text("old report")
    (runs / "broken").mkdir()
    (runs / "broken" / "result.json").write_text('{"study": "planted_secret"}')  # fails the schema
    assert main(["report", "--runs", str(runs), "--out", str(old)]) == 3
    assert old.read_text() == "old report"


def test_report_starts_no_server_and_imports_neither_torch_nor_prefect(tmp_path):
    from pipelines.runtime.signals import needs_server

    assert not needs_server("report", ["report"])
    runs = tmp_path / "runs"
    _result(runs)
    code = ("import sys\nfrom pipelines.cli import main\nrc = main(sys.argv[1:])\n"
            "print(rc, 'torch' in sys.modules, 'prefect' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, "report", "--runs", str(runs)], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "0 False False", (out.stdout[-300:], out.stderr[-500:])
