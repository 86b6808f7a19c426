"""Result schema validation, aggregate-only refusal, and the HTML report renderer."""
from __future__ import annotations

import base64
import copy
import io
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from dashboards.errors import AggregateOnlyError, ResultSchemaError, RunsDirectoryError
from dashboards.figures import render_png
from dashboards.report import SECTIONS, load_results, main, render_report
from dashboards.schema import KNOWN_STUDIES, MAX_ARRAY_LEN, validate_result
from dashboards.seed_figures import CONTRACT_CARD, SEED_FIGURES, seed_figure_for


# ---------------------------------------------------------------- fixtures (layout-test numbers, not results)
def fixture_results() -> list[dict]:
    """Small hand-written result payloads covering every figure kind; numbers are arbitrary."""
    grid = [i / 20 for i in range(21)]
    return [
        {
            "study": "cohort", "title": "fixture: cohort funnel", "data": "demo", "runtime_s": 1.5,
            "seed_figure": seed_figure_for("cohort"),
            "metrics": {"stays": {"icu_segments": 178, "eligible": 77}, "hourly_tokens": 9001},
            "tables": [], "figures": [{"kind": "funnel", "title": "fixture funnel", "stages": [
                {"label": "ICU segments", "count": 178}, {"label": "≥ 48 h", "count": 77},
                {"label": "≥ 1 event", "count": 60}]}],
        },
        {
            "study": "icu_retention", "title": "fixture: retention <by policy>", "data": "synthetic",
            "runtime_s": 3.25, "seed_figure": {}, "config": {"nu": 0.3, "sigma": 3.0},
            "metrics": {"sv": {"mean": 0.71, "n_included": 60}, "budget_fraction": 0.31},
            "tables": [{"title": "retention", "columns": ["policy", "mean", "ci low", "ci high"],
                        "rows": [["sv", 0.71, 0.66, 0.76], ["density", 0.12, 0.08, 0.16]]}],
            "figures": [{"kind": "bar", "title": "fixture retention", "ylabel": "retention",
                         "categories": ["sv", "density", "recency", "random"], "values": [0.71, 0.12, 0.35, 0.31],
                         "ci_low": [0.66, 0.08, 0.30, 0.27], "ci_high": [0.76, 0.16, 0.40, 0.35]}],
            "claims": [{"statement": "SV retains more event hours than density", "reference": "same budget k per stay",
                        "path": "exact fp64 refit (batch solve)", "value": 0.59, "holds": True}],
        },
        {
            "study": "deletion_audit", "title": "fixture: deletion audit", "data": "synthetic", "runtime_s": 12.0,
            "seed_figure": seed_figure_for("deletion_audit"),
            "metrics": {"completed": 40, "attempted": 40, "median_max_gap": 2.0e-10},
            "tables": [],
            "figures": [{"kind": "histogram", "title": "fixture log10 gap", "xlabel": "log10 max |Δs|",
                         "bin_edges": [-14, -12, -10, -8, -6], "counts": [3, 20, 15, 2]}],
            "claims": [{"operation": "active deletion", "statement": "max |Δs| decrement vs refit",
                        "reference": "fresh retained-key refit at the same C", "path": "maintained fp64 C&P path",
                        "value": 2.0e-10, "holds": True}],
            "receipts": {"count": 80, "certified": 80, "chain_verified": True, "attempted": 40, "completed": 40},
        },
        {
            "study": "deterioration", "title": "fixture: deterioration ROC", "data": "synthetic", "runtime_s": 30.0,
            "seed_figure": seed_figure_for("deterioration"), "metrics": {"sv": {"auroc": 0.66}}, "tables": [],
            "figures": [{"kind": "line", "title": "fixture ROC", "xlabel": "FPR", "ylabel": "TPR", "diagonal": True,
                         "series": [{"label": "sv", "x": grid, "y": [min(1.0, x ** 0.5) for x in grid]},
                                    {"label": "lstm", "x": grid, "y": [min(1.0, x ** 0.3) for x in grid]}]}],
        },
        {
            "study": "my_new_probe", "title": "fixture: unknown study", "data": "synthetic", "runtime_s": 0.0,
            "seed_figure": {"text": "no seed"}, "metrics": {"x": 1}, "tables": [], "figures": [],
        },
    ]


def write_fixture_runs(root: Path) -> Path:
    """Write the fixtures as runs/<study>/result.json plus one non-result JSON; return runs dir."""
    runs = root / "runs"
    for res in fixture_results():
        d = runs / res["study"]
        d.mkdir(parents=True, exist_ok=True)
        (d / "result.json").write_text(json.dumps(res), encoding="utf-8")
    (runs / "prefect_state.json").write_text(json.dumps({"something": "else"}), encoding="utf-8")
    return runs


# ---------------------------------------------------------------- schema
def test_fixtures_validate_and_validation_does_not_mutate():
    for res in fixture_results():
        before = copy.deepcopy(res)
        assert validate_result(res) is res
        assert res == before


@pytest.mark.parametrize("key", ["subject_id", "stay_id", "hadm_id", "STAY_ID", "deleted_patient_id",
                                 "hospitalization_id"])
def test_identifier_keys_are_refused_anywhere(key):
    res = fixture_results()[1]
    res["metrics"]["per_stay"] = {key: 12345}
    with pytest.raises(AggregateOnlyError, match="identifier"):
        validate_result(res, source="x.json")
    res = fixture_results()[1]
    res["config"] = {"deleted": [{key: 1}]}
    with pytest.raises(AggregateOnlyError):
        validate_result(res)


def test_identifier_table_columns_and_long_arrays_are_refused():
    res = fixture_results()[1]
    res["tables"][0]["columns"][0] = "Stay ID"
    with pytest.raises(AggregateOnlyError, match="column"):
        validate_result(res)
    res = fixture_results()[1]
    res["metrics"]["per_stay_retention"] = [0.5] * (MAX_ARRAY_LEN + 1)
    with pytest.raises(AggregateOnlyError, match="per-record"):
        validate_result(res)
    res = fixture_results()[1]
    res["metrics"]["ok_curve"] = [0.5] * MAX_ARRAY_LEN  # at the limit: allowed
    validate_result(res)
    res = fixture_results()[1]
    res["tables"][0]["rows"] = [["sv", 0.1, 0.0, 0.2]] * 101
    with pytest.raises(AggregateOnlyError, match="rows"):
        validate_result(res)
    # counts named after stays are aggregates, not identifiers
    res = fixture_results()[1]
    res["metrics"]["n_stays"] = 718
    validate_result(res)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda r: r.pop("runtime_s"), "missing required field 'runtime_s'"),
        (lambda r: r.update(data="csv"), "data must be one of"),
        (lambda r: r.update(study="Bad Name"), "study must match"),
        (lambda r: r.update(extra=1), "unknown top-level"),
        (lambda r: r["figures"][0].update(kind="pie"), "kind"),
        (lambda r: r["figures"][0].update(values=[0.1, 0.2]), "expected 4"),
        (lambda r: r["figures"][0].update(ci_low=[0.9, 0.0, 0.0, 0.0]), "ci_low must not exceed"),
        (lambda r: r["claims"][0].pop("path"), "numerical path"),
        (lambda r: r["metrics"].update(bad=float("nan")), "non-finite"),
        (lambda r: r.update(receipts={"count": 1, "certified": 2, "chain_verified": True}), "cannot exceed"),
    ],
)
def test_schema_errors_are_typed_and_readable(mutate, message):
    res = fixture_results()[1]
    mutate(res)
    with pytest.raises(ResultSchemaError, match=re.escape(message)):
        validate_result(res, source="runs/x/result.json")


def test_seed_figures_are_valid_and_cover_every_known_study():
    assert set(SEED_FIGURES) == set(KNOWN_STUDIES)
    assert {s for sec in SECTIONS for s in sec.studies} == set(KNOWN_STUDIES)
    for study, seed in SEED_FIGURES.items():
        validate_result({"study": study, "title": "t", "data": "synthetic", "runtime_s": 0, "seed_figure": seed,
                         "metrics": {}, "tables": [], "figures": []})
    assert SEED_FIGURES["heldout_spo2"]["values"]["sv"] == 0.464
    assert [r["operation"] for r in CONTRACT_CARD] == ["reserve removal", "active deletion", "streaming pruning",
                                                       "batched training"]
    seed_figure_for("cohort")["values"]["sampled stays"] = 0  # a copy: the table is not mutated
    assert SEED_FIGURES["cohort"]["values"]["sampled stays"] == 1500


# ---------------------------------------------------------------- figures
def _decode_png(png: bytes) -> np.ndarray:
    from matplotlib.image import imread

    return imread(io.BytesIO(png), format="png")


def test_bar_figure_png_has_expected_size_and_ink():
    spec = fixture_results()[1]["figures"][0]
    img = _decode_png(render_png(spec))
    assert img.shape[:2] == (320, 500)  # 5.0 x 3.2 in at 100 dpi
    non_white = np.mean(np.any(img[..., :3] < 0.95, axis=-1))
    assert 0.03 < non_white < 0.6
    seed_img = _decode_png(render_png(spec, seed=True))
    # seed palette is grey: bar pixels have r == g == b, run palette is blue-ish
    assert np.mean(np.abs(seed_img[..., 0] - seed_img[..., 2])) < np.mean(np.abs(img[..., 0] - img[..., 2]))


# ---------------------------------------------------------------- report
def test_report_renders_sections_not_run_and_seed_beside_run(tmp_path):
    runs = write_fixture_runs(tmp_path)
    results, skipped = load_results(runs)
    assert [r.payload["study"] for r in results] == ["cohort", "deletion_audit", "deterioration", "icu_retention",
                                                     "my_new_probe"]
    assert skipped == ["prefect_state.json"]
    page = render_report(runs)
    for sec in SECTIONS:
        assert f'id="{sec.key}"' in page and sec.title in page
    assert 'id="contract"' in page and 'id="other"' in page
    # missing studies say "not run"; heldout_spo2 has no result file
    heldout = page[page.index('id="heldout"'):page.index('id="deletion"')]
    assert "not run" in heldout and "0.464" in heldout  # seed text still shown
    retention = page[page.index('id="retention"'):page.index('id="heldout"')]
    assert "not run" not in retention
    # one run image per run figure + seed images where the seed has a figure
    n_run_figs = sum(len(r["figures"]) for r in fixture_results())
    assert page.count('alt="figure:') == n_run_figs
    from dashboards.report import REAL_DATA_STUDIES

    synthetic_real = {r["study"] for r in fixture_results() if r["data"] == "synthetic"} & REAL_DATA_STUDIES
    n_seed_figs = sum(1 for sec in SECTIONS for s in sec.studies
                      if SEED_FIGURES[s].get("figure") and s not in synthetic_real)
    assert page.count('alt="seed figure:') == n_seed_figs
    # receipts summary and the contract-card evidence column
    assert '<span class="ok">verified</span>' in page
    assert "fresh retained-key refit at the same C" in page and "maintained fp64 C&amp;P path" in page
    assert "not certified equal to a never-pruned full-history trajectory" in page
    # text is escaped, demo data is credited
    assert "retention &lt;by policy&gt;" in page and "<by policy>" not in page
    assert "MIMIC-IV Clinical Database Demo" in page


def test_report_is_self_contained(tmp_path):
    page = render_report(write_fixture_runs(tmp_path))
    assert "<script" not in page.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page, re.IGNORECASE)
    assert "@import" not in page and "url(" not in page
    for uri in re.findall(r'src="data:image/png;base64,([^"]+)"', page):
        assert base64.b64decode(uri)[:8] == b"\x89PNG\r\n\x1a\n"


def test_receipt_chain_failure_is_shown(tmp_path):
    runs = write_fixture_runs(tmp_path)
    path = runs / "deletion_audit" / "result.json"
    res = json.loads(path.read_text())
    res["receipts"]["chain_verified"] = False
    path.write_text(json.dumps(res))
    page = render_report(runs)
    assert "NOT verified" in page


def test_cli_writes_report_and_refuses_identifiers_leaving_output_untouched(tmp_path, capsys):
    runs = write_fixture_runs(tmp_path)
    out = tmp_path / "report.html"
    assert main(["--runs", str(runs), "--out", str(out)]) == 0
    first = out.read_text()
    mask = os.umask(0)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~mask  # ordinary permissions, not mkstemp's 0600
    assert first.startswith("<!DOCTYPE html>") and len(first) > 20_000
    bad = fixture_results()[0]
    bad["metrics"]["subject_id"] = 10001217
    (runs / "cohort" / "result.json").write_text(json.dumps(bad))
    assert main(["--runs", str(runs), "--out", str(out)]) == 2
    assert "identifier" in capsys.readouterr().err
    assert out.read_text() == first  # refused: previous report untouched
    fresh = tmp_path / "never.html"
    assert main(["--runs", str(runs), "--out", str(fresh)]) == 2 and not fresh.exists()
    assert not list(tmp_path.glob(".*.tmp"))  # no temp files left


def test_missing_runs_dir_and_broken_json(tmp_path):
    with pytest.raises(RunsDirectoryError):
        load_results(tmp_path / "nope")
    runs = tmp_path / "runs"
    runs.mkdir()
    page = render_report(runs)  # empty runs dir: everything "not run"
    assert page.count("not run —") == len(KNOWN_STUDIES) + 1  # + receipts summary
    (runs / "result.json").write_text("{not json")
    with pytest.raises(ResultSchemaError, match="cannot read JSON"):
        load_results(runs)


# ---------------------------------------------------------------- write_result and SCHEMA.md
def test_write_result_validates_before_writing(tmp_path):
    from dashboards.schema import write_result

    good = fixture_results()[1]
    path = write_result(good, tmp_path / "runs" / "icu_retention" / "result.json")
    assert json.loads(path.read_text()) == good
    bad = fixture_results()[1]
    bad["metrics"]["hadm_id"] = 1
    with pytest.raises(AggregateOnlyError):
        write_result(bad, tmp_path / "bad.json")
    assert not (tmp_path / "bad.json").exists()
    assert not list(tmp_path.glob(".*.tmp"))


def test_schema_doc_example_validates():
    doc = (Path(__file__).resolve().parents[1] / "dashboards" / "SCHEMA.md").read_text(encoding="utf-8")
    example = doc.split("```json", 1)[1].split("```", 1)[0]
    validate_result(json.loads(example))


def test_task_cache_and_registry_are_never_read(tmp_path):
    from dashboards.report import load_results

    (tmp_path / ".warehouse.duckdb.cache").mkdir()
    (tmp_path / ".warehouse.duckdb.cache" / "retention-batch-x.json").write_text("0123abcd\n{\"a\": 1}")
    (tmp_path / "forget-registry").mkdir()
    (tmp_path / "forget-registry" / "x.json").write_text("not json")
    results, skipped = load_results(tmp_path)
    assert results == [] and skipped == []


def test_synthetic_runs_are_not_placed_beside_real_data_seed_figures(tmp_path):
    from dashboards.report import render_report
    from dashboards.schema import write_result

    res = {"study": "icu_retention", "title": "ICU retention (synthetic)", "data": "synthetic", "runtime_s": 1.0,
           "seed_figure": {}, "metrics": {}, "tables": [], "figures": []}
    write_result(res, tmp_path / "icu_retention" / "result.json")
    page = render_report(tmp_path)
    sec = page[page.index('id="retention"'):page.index('id="heldout"')]
    assert "not comparable" in sec and "0.80" not in sec


# ---------------------------------------------------------------- readable names, holds legend, low power
def _cards(page: str) -> list[str]:
    """Each run card (<div class="run">…) of the rendered page."""
    return [c.split('<div class="seed">')[0] for c in page.split('<div class="run">')[1:]]


def _dotted_keys(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _dotted_keys(v, f"{prefix}{k}.")
        elif prefix:
            yield f"{prefix}{k}"


def test_no_raw_dotted_metric_key_in_the_report(tmp_path):
    runs = write_fixture_runs(tmp_path)
    page = render_report(runs)
    keys = {k for r in fixture_results() for sec in ("metrics", "config") for k in _dotted_keys(r.get(sec, {}))}
    assert "stays.icu_segments" in keys and "sv.n_included" in keys  # the fixtures do nest
    for k in keys:
        assert f">{k}<" not in page and k not in page, k
    assert "SV gate · included" in page  # mapped component + prettified unknown one ("n_included")


def test_metric_label_mapping_and_fallback():
    from dashboards.labels import METRIC_NAMES, metric_label, prettify

    assert metric_label("retention.sv") == f"{METRIC_NAMES['retention']} · {METRIC_NAMES['sv']}"
    assert metric_label("decay_leakage_mean.gamma_0.01") == f"{METRIC_NAMES['decay_leakage_mean']} · γ = 0.01"
    assert prettify("diff_sv_minus_density") == "SV gate − density (H2O-style)"
    assert prettify("some_new_auroc_key") == "some new AUROC key"
    assert prettify("n_widgets") == "widgets" and prettify("n512") == "n = 512"
    assert "_" not in metric_label("an_unknown.nested_key") and "." not in metric_label("an_unknown.nested_key")


def test_every_card_that_says_holds_defines_it(tmp_path):
    page = render_report(write_fixture_runs(tmp_path))
    cards = [c for c in _cards(page) if "holds" in c]
    assert cards, "the fixtures carry claims"
    from dashboards.report import HOLDS_LEGEND

    for c in cards:
        assert '<p class="legend">holds: ' in c
    contract = page[page.index('id="contract"'):]
    assert "✓ / ✗: the claim holds" in contract and HOLDS_LEGEND.split(":")[0] in contract


def _one_stay_retention() -> dict:
    return {
        "study": "icu_retention", "title": "fixture: retention on a 4-stay cohort", "data": "mimic", "runtime_s": 1.0,
        "seed_figure": {}, "config": {"nu": 0.3},
        "metrics": {"n_stays": 4, "n_stays_included": 1, "retention": {"sv": 0.5, "density": 0.5},
                    "diff_sv_minus_density": {"mean": 0.0, "low": 0.0, "high": 0.0}},
        "tables": [], "figures": [{"kind": "bar", "title": "retention", "ylabel": "retention",
                                   "categories": ["sv", "density"], "values": [0.5, 0.5],
                                   "ci_low": [0.5, 0.5], "ci_high": [0.5, 0.5]}],
    }


def test_low_power_warning_names_the_count(tmp_path):
    runs = tmp_path / "runs" / "icu_retention"
    runs.mkdir(parents=True)
    (runs / "result.json").write_text(json.dumps(_one_stay_retention()))
    page = render_report(runs.parent)
    (card,) = [c for c in _cards(page) if "4-stay cohort" in c]
    assert '<p class="warn">⚠ Low power' in card
    assert "rests on 1 stays with an event (fewer than 20)" in card
    assert "3 interval(s) have zero width" in card  # the metrics' {low, high} and both bar CIs


def test_no_low_power_warning_for_a_well_powered_result(tmp_path):
    from dashboards.report import MIN_STAYS, low_power_warning

    res = _one_stay_retention()
    res["metrics"].update(n_stays=400, n_stays_included=MIN_STAYS,
                          diff_sv_minus_density={"mean": 0.2, "low": 0.1, "high": 0.3})
    res["figures"][0].update(ci_low=[0.4, 0.3], ci_high=[0.6, 0.7])
    assert low_power_warning(res) == ""
    res["metrics"]["n_stays_included"] = MIN_STAYS - 1
    assert f"rests on {MIN_STAYS - 1} stays" in low_power_warning(res)
    det = {"study": "deterioration", "metrics": {"test_stays": 3, "paired": {"a": {"auroc_diff_low": 0.1,
                                                                                   "auroc_diff_high": 0.1}}}}
    w = low_power_warning(det)
    assert "3 test-split stays" in w and "1 interval(s) have zero width" in w


# ---------------------------------------------------------------- a results section, not a dump (issue 18)
def _article(page: str, study: str) -> str:
    m = re.search(rf'<article class="study[^"]*" id="study-{study}">(.*?)</article>', page, re.S)
    assert m, f"no card for {study}"
    return m.group(1)


def test_every_not_run_card_names_the_command_that_fills_it(tmp_path):
    from dashboards.commands import RESULT_COMMANDS
    from pipelines.cli import COMMANDS

    page = render_report(tmp_path)  # empty runs folder: every study is "not run"
    for study in KNOWN_STUDIES:
        cmd = RESULT_COMMANDS[study]
        assert f"Fill it with <code>{cmd}</code>" in _article(page, study), study
        word = cmd.split()[1]
        assert cmd.startswith("forgetful ") and word in COMMANDS, f"{study}: {cmd} is not a forgetful command"
    summary = page[page.index('id="summary"'):page.index('id="cohort"')]
    assert "<code>forgetful heldout-spo2</code>" in summary


def test_chart_seed_and_claims_up_front_everything_else_collapsed(tmp_path):
    page = render_report(write_fixture_runs(tmp_path))
    card = _article(page, "icu_retention")
    up_front, _, collapsed = card.partition('<details class="full">')
    assert collapsed, "the full tables are collapsed in <details>"
    assert up_front.count('alt="figure:') == 1 and "Claims (each with" in up_front
    assert "<h4>Metrics</h4>" in collapsed and "<h4>Configuration</h4>" in collapsed
    assert "<h4>Metrics</h4>" not in up_front
    assert "<summary>Full results: 1 table(s), 3 metric(s), configuration</summary>" in collapsed
    assert '<div class="seed">' in collapsed.split("</details>", 1)[1]  # the seed block closes the card
    # a result without figures leads with its first table; further figures go into <details>
    res = fixture_results()[1]
    res["figures"] = []
    (tmp_path / "runs" / "icu_retention" / "result.json").write_text(json.dumps(res))
    card = _article(render_report(tmp_path / "runs"), "icu_retention")
    lead = card.split('<div class="lead">', 1)[1].split('<div class="claims-block">', 1)[0]
    assert "<h4>retention</h4>" in lead and "<th>policy</th>" in lead and 'alt="figure:' not in card
    assert "<summary>Full results: 3 metric(s), configuration</summary>" in card  # the lead table is not repeated
    # a long first table: its first LEAD_ROWS rows up front, the whole table under "Full results"
    from dashboards.report import LEAD_ROWS

    res["tables"][0]["rows"] = [[f"p{i}", 0.5, 0.4, 0.6] for i in range(LEAD_ROWS + 5)]
    (tmp_path / "runs" / "icu_retention" / "result.json").write_text(json.dumps(res))
    up_front, _, collapsed = _article(render_report(tmp_path / "runs"), "icu_retention").partition("<details")
    assert up_front.count("<td>p") == LEAD_ROWS and collapsed.count("<td>p") == LEAD_ROWS + 5
    assert f"The first {LEAD_ROWS} of {LEAD_ROWS + 5} rows" in up_front


def test_receipts_of_a_study_without_a_chain_are_not_a_failure(tmp_path):
    runs = write_fixture_runs(tmp_path)
    res = fixture_results()[2]
    res["receipts"]["chain_verified"] = None  # e.g. planted_secret: in-memory receipts, no chain
    validate_result(res)
    (runs / "deletion_audit" / "result.json").write_text(json.dumps(res))
    page = render_report(runs)
    assert "NOT verified" not in page
    summary = page[page.index("Receipts summary (all studies)"):page.index('id="deterioration"')]
    assert '<span class="na">no chain (not applicable)</span>' in summary
    bad = fixture_results()[2]
    bad["receipts"]["chain_verified"] = "no"
    with pytest.raises(ResultSchemaError, match="chain_verified"):
        validate_result(bad)


def test_planted_secret_writes_no_chain_rather_than_a_failed_one():
    from evaluation.studies.planted_secret import run

    res = validate_result(run(trials=2, seed=0, progress=False))
    assert res["receipts"]["chain_verified"] is None and res["receipts"]["count"] == 2


def test_a_resumed_run_is_labelled_not_shown_as_run_time(tmp_path):
    runs = write_fixture_runs(tmp_path)
    res = fixture_results()[1]
    res["runtime_s"] = 1.25
    res["timing"] = {"resumed": True, "cached_tasks": 5, "tasks": 6, "compute_s": 340.0}
    (runs / "icu_retention" / "result.json").write_text(json.dumps(res))
    page = render_report(runs)
    card = _article(page, "icu_retention")
    assert ("resumed from the task cache (5 of 6 tasks cached): 1.25 s this invocation, 340 s of computation in "
            "the run that filled the cache") in card
    assert "run time 1.25 s" not in page
    assert "run time 1.5 s" in _article(page, "cohort")  # an ordinary run: its run time
    res["timing"] = {"resumed": True, "cached_tasks": -1}
    with pytest.raises(ResultSchemaError, match="timing.cached_tasks"):
        validate_result(res)


def _ledger_card(receipts: int) -> dict:
    return {"study": "ledger", "title": "Deletion-receipt ledger", "data": "demo", "runtime_s": 0.0,
            "seed_figure": {}, "tables": [], "figures": [],
            "metrics": {"receipts": receipts, "certified": receipts, "chain_verified": True, "pending_erasures": 0,
                        "head": "ab" * 32, "last_deletion_utc": "2026-01-01T00:00:00Z"}}


def test_ledger_card_is_never_stale_and_says_when_it_is_behind(tmp_path):
    runs = write_fixture_runs(tmp_path)
    (runs / "ledger").mkdir()
    (runs / "ledger" / "result.json").write_text(json.dumps(_ledger_card(1)))
    stale = {"receipt_seq": 1, "files": ["ledger/result.json", "cohort/result.json"],
             "since": {"ledger/result.json": 1, "cohort/result.json": 1}}
    (runs / "stale.json").write_text(json.dumps(stale))
    page = render_report(runs)
    card = _article(page, "ledger")
    assert '<span class="count">1</span> deletion receipt(s)' in card and "stale since" not in card
    assert "the ledger is empty" not in card and "predates receipt" not in card
    assert "stale since receipt #1: rerun forgetful build-cohort" in _article(page, "cohort")
    # a card older than the newest receipt the folder knows of (written by an older version): said, not hidden
    stale["latest"] = 3
    (runs / "stale.json").write_text(json.dumps(stale))
    card = _article(render_report(runs), "ledger")
    assert "This card predates receipt #3" in card


def test_markup_lives_in_the_templates():
    import dashboards

    root = Path(dashboards.__file__).parent
    for name in ("report.py", "stream_card.py"):
        code = (root / name).read_text()
        body = code.split('"""', 2)[2]  # after the module docstring
        assert not re.search(r"""["']<(div|table|p|span|h[1-6]|section|article|img|td|tr)\b""", body), name
    from dashboards.templating import environment

    assert environment().autoescape is True


def test_figure_titles_fit_their_figure():
    from dashboards.figures import draw_figure

    long = ("test AUROC of the seed-averaged predictions (bars: 95% stay-clustered bootstrap interval) "
            "with an even longer tail so that a single line could never fit")
    specs = [dict(f) for r in fixture_results() for f in r["figures"]]
    specs.append({"kind": "bar", "title": long, "categories": ["LSTM", "causal softmax", "causal SV attention",
                                                               "event now (trivial baseline)"],
                  "values": [0.66, 0.6, 0.61, 0.63], "ci_low": [0.5, 0.5, 0.5, 0.6], "ci_high": [0.8, 0.7, 0.7, 0.7]})
    specs.append({"kind": "line", "title": long, "diagonal": True, "series": [
        {"label": "LSTM: 0.657 [0.537, 0.792]", "x": [0, 0.5, 1], "y": [0, 0.8, 1]}]})
    for spec in specs:
        for seed in (False, True):
            fig = draw_figure(spec, seed=seed)
            r = fig.canvas.get_renderer()
            fig.canvas.draw()
            t = fig.axes[0].title.get_window_extent(r)
            assert t.x0 >= 0 and t.x1 <= fig.bbox.x1 and t.y1 <= fig.bbox.y1, (spec.get("title"), t, fig.bbox)
    # the negative control: without wrapping, the long title runs off the figure
    fig = draw_figure({**specs[-2], "title": "x"}, seed=False)
    fig.axes[0].set_title(long, fontsize=10)
    fig.canvas.draw()
    t = fig.axes[0].title.get_window_extent(fig.canvas.get_renderer())
    assert t.x0 < 0 or t.x1 > fig.bbox.x1


def test_seed_figures_and_run_figures_are_rendered_once_per_process(tmp_path, monkeypatch):
    import dashboards.report as rep

    runs = write_fixture_runs(tmp_path)
    render_report(runs)
    calls = []
    monkeypatch.setattr(rep, "render_png", lambda *a, **k: calls.append(1) or b"\x89PNG")
    render_report(runs)  # everything came from the cache
    assert calls == []
