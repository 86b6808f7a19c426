"""The figure documents are renderings of the committed result files (docs/results/), a fresh run of
the cheap seeded studies reproduces them at the precision they print, every seed claim has a
headline row, and residuals print as the bound they lie below so another machine's BLAS digits do
not change a document."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dashboards import reproduce
from dashboards.headline import headline_rows
from dashboards.numbers import doc_fmt
from dashboards.seed_figures import SEED_CLAIMS


def test_committed_documents_are_a_rendering_of_the_committed_results():
    docs = reproduce.documents(reproduce.COMMITTED, reproduce.FIGURES, reproduce.README, reproduce.REPRODUCE_MD)
    for path, text in docs.items():
        assert path.read_text() == text, f"{path.name} is stale: run python -m dashboards.reproduce --write"
    assert reproduce.main(["--check", "--runs", str(reproduce.DEMO_RESULTS)]) == 0


def test_committed_results_are_aggregates_only():
    from dashboards.report import load_results

    results, skipped = load_results(reproduce.RESULTS)  # validate_result refuses record-level data
    assert {r.payload["study"] for r in results} >= {c["study"] for c in SEED_CLAIMS if c["study"] != "language_model"}
    # besides the result files only a study's raw details (per-step curves of the language model)
    assert not [s for s in skipped if s.startswith(("demo/", "studies/")) and not s.endswith("/details.json")]
    for f in reproduce.RESULTS.rglob("*.json"):
        text = f.read_text()
        assert "subject_id" not in text and "stay_id" not in text, f


def test_a_fresh_run_of_the_cheap_studies_reproduces_the_committed_figures(tmp_path):
    from dashboards.schema import write_result
    from pipelines.flows.study_synthetic import STUDIES, _study_fn

    runs = tmp_path / "runs"
    for _cmd, study, target, trials, _ in STUDIES:
        if study in reproduce.CHEAP:
            write_result(_study_fn(target)(trials=trials, seed=0, progress=False), runs / study / "result.json")
    assert reproduce.check_run([runs]) == []


def test_the_check_finds_a_changed_figure(tmp_path):
    """A fresh run whose figure moved by more than its printed precision fails the check."""
    runs = tmp_path / "runs"
    src = reproduce.DEMO_RESULTS / "streaming_eviction" / "result.json"
    p = json.loads(src.read_text())
    p["metrics"]["vs_sv"]["diffs"]["h2o"]["low"] += 0.01
    (runs / "streaming_eviction").mkdir(parents=True)
    (runs / "streaming_eviction" / "result.json").write_text(json.dumps(p))
    problems = reproduce.check_run([runs])
    assert problems and all("streaming_eviction" in x for x in problems)
    assert reproduce.main(["--check", "--runs", str(runs)]) == 1


def test_every_seed_claim_has_a_headline_row():
    found = reproduce.collect(reproduce.COMMITTED)
    rows = dict(headline_rows(found))
    assert [c["study"] for c in SEED_CLAIMS] == list(rows)
    assert len(rows) == 10
    text = reproduce.README.read_text()
    for study, row in rows.items():
        assert row in text, study
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert len(cells) == 6 and cells[3], (study, cells)  # claim, data, this run, paper, peer, status
        assert cells[5].startswith(("holds", "does not hold", "not run", "LSTM ahead")), (study, cells[5])
    # a study without a result still has its row, saying it was not run
    rows_missing = dict(headline_rows({}))
    assert len(rows_missing) == 10 and all("not run" in r for r in rows_missing.values())


def test_residuals_print_as_the_bound_they_lie_below():
    assert doc_fmt(2.49e-14) == doc_fmt(2.78e-14) == "< 1e-12"
    assert doc_fmt(8.41e-12) == doc_fmt(8.01e-12) == "< 1e-11"
    assert doc_fmt(9.12e-9) == "< 1e-8"
    assert doc_fmt(0.0) == "0" and doc_fmt(0.00417) == "0.00417" and doc_fmt(1.5e-6) == "1.50e-06"
    assert doc_fmt([3e-15, 0.5]) == "[< 1e-12, 0.5]"


def test_one_formatter_prints_significant_digits_fixed_decimals_and_spreads():
    from dashboards.numbers import fixed, fmt, md_table, spread
    from dashboards.templating import fmt as cell

    assert fmt(0.012345) == "0.0123" and fmt(0.012345, digits=4) == "0.01235" and fmt(1234567) == "1,234,567"
    assert fmt(123456.7) == "1.23e+05" and fmt(0.00012) == "1.20e-04" and fmt(None) == "–"
    assert fixed(1234.56) == "1,234.6" and fixed(2000.0) == "2,000" and fixed(0.126, 2) == "0.13"
    assert fixed(None) == "–" and fixed(12.7, 0) == "13" and fixed(7) == "7"
    assert spread({"median": 1.634, "min": 1.5, "max": 1.66}, 2, "×") == "1.63× (1.50–1.66)"
    # the report's cells: the same numbers at 4 digits, its own words for missing and yes/no
    assert cell(0.012345) == fmt(0.012345, digits=4) and cell(None) == "—" and cell(True) == "yes"
    assert md_table(["a", "b"], [[1, ""], ["x|y", 2.5]], align="lr") == [
        "| a | b |", "|---|---:|", "| 1 | |", "| x\\|y | 2.5 |"]
    with pytest.raises(ValueError, match="align"):
        md_table(["a", "b"], [], align="l")


def test_figures_compare_at_printed_precision_not_rounding_noise():
    agree = reproduce.figure_differences
    assert not agree("| exact | < 1e-12 |", "| exact | < 1e-12 |")
    assert not agree("p95 < 1e-11", "p95 < 1e-12")  # the next decade: BLAS noise at a boundary
    assert agree("p95 < 1e-11", "p95 < 1e-8")
    assert agree("p95 < 1e-11", "p95 8.0e-12")  # a bound against a number: the text differs
    assert not agree("| sv | 0.899 | 1,024 |", "| sv | 0.9 | 1,025 |")
    assert agree("| sv | 0.9 |", "| sv | 0.85 |")
    assert agree("| sv | 1.07e+04 |", "| sv | 1.09e+04 |")
    assert agree("- claim: 0.899 — holds", "- claim: 0.899 — **does not hold**")
    assert agree("x\ny", "x")
    # a trained model's figure moves within the tolerance its result states, and no further
    tol = {"abs": 0.02}
    assert not agree("| LSTM | 0.728 |", "| LSTM | 0.741 |", tol=tol)
    assert agree("| LSTM | 0.728 |", "| LSTM | 0.8 |", tol=tol)
    assert agree("worst < 1e-11", "worst < 1e-8", tol={"decades": 1.5})  # 3 decades apart: differs
    assert not agree("worst < 1e-11", "worst < 1e-9", tol={"decades": 2})
    assert not agree("| 1.2 s |", "| 9.9 s |", timed=True)
    # the loosest tolerance a result states, at the top or per table column
    assert reproduce.study_tolerance({"tolerances": {"m.x": {"abs": 0.02, "why": "w"}},
                                      "tables": [{"tolerances": {"c": {"rel": 0.1, "why": "w"}}}]}) == \
        {"abs": 0.02, "rel": 0.1}
    assert reproduce.study_tolerance({}) == {}
    assert agree("| LSTM | 0.728 |", "| LSTM | 0.741 |")  # a deterministic study: no tolerance


def test_store_then_write_renders_from_the_stored_files(tmp_path, monkeypatch):
    """--store copies a run's result files into docs/results and the documents follow them."""
    results = tmp_path / "results"
    monkeypatch.setattr(reproduce, "RESULTS", results)
    monkeypatch.setattr(reproduce, "DEMO_RESULTS", results / "demo")
    monkeypatch.setattr(reproduce, "STUDY_RESULTS", results / "studies")
    monkeypatch.setattr(reproduce, "COMMITTED", (results / "demo", results / "studies"))
    runs = tmp_path / "runs"
    shutil.copytree(reproduce.ROOT / "docs" / "results" / "demo" / "planted_secret", runs / "planted_secret")
    figs, readme, rep = tmp_path / "FIGURES.md", tmp_path / "README.md", tmp_path / "REPRODUCE.md"
    readme.write_text(f"x\n{reproduce.BEGIN}\nold\n{reproduce.END}\n")
    rep.write_text(f"y\n{reproduce.LM_BEGIN}\nold\n{reproduce.LM_END}\n")
    args = ["--figures", str(figs), "--readme", str(readme), "--reproduce-md", str(rep)]
    assert reproduce.main([*args, "--store", "--runs", str(runs)]) == 0
    assert (results / "demo" / "planted_secret" / "result.json").is_file()
    assert "Planted secret" in figs.read_text() and "runtime" not in figs.read_text()
    assert "| exact deletion equals" in readme.read_text() and "not run" in readme.read_text()
    assert "No language-model result" in rep.read_text()
    assert reproduce.main([*args, "--check", "--runs", str(runs)]) == 0
    figs.write_text(figs.read_text().replace("Planted secret", "Planted secrets"))
    assert reproduce.main([*args, "--check", "--runs", str(runs)]) == 1


def test_store_refuses_record_level_data_and_writes_nothing(tmp_path, monkeypatch):
    results = tmp_path / "results"
    monkeypatch.setattr(reproduce, "DEMO_RESULTS", results / "demo")
    runs = tmp_path / "runs" / "icu_retention"
    runs.mkdir(parents=True)
    p = json.loads((reproduce.ROOT / "docs/results/demo/icu_retention/result.json").read_text())
    p["tables"].append({"title": "per stay", "columns": ["stay_id", "retention"], "rows": [[30000001, 0.5]]})
    (runs / "result.json").write_text(json.dumps(p))
    with pytest.raises(Exception):
        reproduce.store(tmp_path / "runs")
    assert not results.exists()


def test_no_runs_folder_is_one_line(tmp_path, capsys):
    assert reproduce.main(["--check", "--runs", str(tmp_path / "no_runs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no_runs" in err[0]
    assert Path(tmp_path / "no_runs").exists() is False


@pytest.mark.slow
def test_a_fresh_demo_run_reproduces_every_documented_figure(tmp_path):
    """`make demo` then `python -m dashboards.reproduce --check`: the main job on the real demo, in a
    temporary folder, reproduces every committed figure at the precision it is printed."""
    import os
    import subprocess
    import sys

    from cohort.demo_data import ensure_demo

    try:
        ensure_demo()
    except Exception as exc:  # never downloads here
        pytest.skip(f"the real MIMIC-IV demo is not fetched (make data): {exc}")
    env = {**os.environ, "FORGETFUL_CONFIG_DIR": str(tmp_path / "config"), "PYTHONPATH": str(reproduce.ROOT)}
    r = subprocess.run([sys.executable, "-m", "pipelines.cli", "run-all", "--runs", str(tmp_path / "runs"),
                        "--no-progress"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert reproduce.check_run([tmp_path / "runs"]) == []
