"""``forgetful run-all`` ends with a short human summary read from the result files (issue 18: it
ended with a raw JSON of step timings); the JSON goes to ``--json PATH`` only."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from pipelines.flows.run_summary import summary_lines


def _claim(statement: str, value, holds: bool) -> dict:
    return {"statement": statement, "reference": "r", "path": "p", "value": value, "holds": holds}


def _retention(study: str, diffs: dict[str, tuple[str, bool]], n: int) -> dict:
    return {"study": study, "title": study, "data": "demo", "runtime_s": 1.0, "seed_figure": {}, "tables": [],
            "figures": [], "metrics": {"n_stays_included": n},
            "claims": [_claim(f"mean event-hour retention, SV minus {k} (95% paired bootstrap over stays)", v, h)
                       for k, (v, h) in diffs.items()]}


def _write(runs: Path, payload: dict, mtime: float | None = None) -> None:
    p = runs / payload["study"] / "result.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(payload))
    if mtime is not None:
        os.utime(p, (mtime, mtime))


@pytest.fixture
def runs(tmp_path) -> Path:
    r = tmp_path / "runs"
    _write(r, {"study": "cohort", "title": "c", "data": "demo", "runtime_s": 1, "seed_figure": {}, "tables": [],
               "figures": [], "metrics": {"n_stays": 77, "n_tokens": 10476}})
    _write(r, _retention("icu_retention", {"density": ("0.705 [0.631, 0.777]", True),
                                            "leverage": ("0.064 [0.032, 0.101]", True),
                                            "random": ("0.414 [0.341, 0.488]", True)}, 69))
    held = _retention("heldout_spo2", {"density": ("0.355 [0.118, 0.574]", True),
                                       "leverage": ("-0.091 [-0.191, -0.007]", False)}, 38)
    held["config"] = {"task_cache": {"tasks_cached": 10, "tasks_computed": 0, "this_run_s": 2.0}}
    _write(r, held)
    _write(r, {"study": "deterioration", "title": "d", "data": "demo", "runtime_s": 1, "seed_figure": {},
               "tables": [], "figures": [],
               "metrics": {"test_stays": 10,
                           **{k: {"auroc_seedavg": a, "auroc_seedavg_low": a - 0.1, "auroc_seedavg_high": a + 0.1}
                              for k, a in (("lstm", 0.731), ("softmax", 0.719), ("sv_attention", 0.680))},
                           "paired": {"sv_attention - lstm": {"auroc_diff": -0.0517, "auroc_diff_low": -0.102,
                                                              "auroc_diff_high": 0.0665}}}})
    _write(r, {"study": "deletion_audit", "title": "a", "data": "demo", "runtime_s": 1, "seed_figure": {},
               "tables": [], "figures": [],
               "metrics": {"attempted": 300, "completed": 299, "gaussian": {"score_dev_worst": 4e-16},
                           "redundant": {"score_dev_worst": 8.3e-9}},
               "claims": [_claim("gaussian: median", 4e-16, True), _claim("redundant: median", 3e-15, True)]})
    old = time.time() - 3600
    for study, holds in (("planted_secret", [True]), ("skewed_redundancy", [True, False, False])):
        _write(r, {"study": study, "title": study, "data": "synthetic", "runtime_s": 1, "seed_figure": {},
                   "tables": [], "figures": [], "metrics": {},
                   "claims": [_claim(f"claim {i}", 1.0, h) for i, h in enumerate(holds)]},
               mtime=old if study == "planted_secret" else None)
    return r


def test_the_summary_states_each_studys_headline_from_its_result_file(runs):
    lines = summary_lines(runs, report="runs/report.html", seconds={"build-cohort": 4.46, "deterioration": 177.6},
                          total_s=351.6, since=time.time() - 600)
    text = "\n".join(lines)
    assert lines[0] == "run-all done in 5.9 min · report: runs/report.html"
    assert "  build-cohort      77 stays, 10,476 hourly tokens (real MIMIC-IV demo)" in lines
    ret = next(ln for ln in lines if ln.startswith("  retention "))
    # the seed's comparator (first claim) and the closest peer (smallest difference), each with holds
    assert ("SV − density 0.705 [0.631, 0.777] holds; closest peer: SV − leverage 0.064 [0.032, 0.101] holds "
            "(69 stays) · 3/3 claims hold") in ret
    held = next(ln for ln in lines if ln.startswith("  heldout-spo2 "))
    assert "SV − leverage -0.091 [-0.191, -0.007] does NOT hold" in held and "1/2 claims hold" in held
    assert held.endswith("(cached)")
    det = next(ln for ln in lines if ln.startswith("  deterioration "))
    assert "AUROC SV attention 0.680 [0.580, 0.780] vs LSTM 0.731 [0.631, 0.831]: Δ -0.052 [-0.102, 0.067]" in det
    assert "299/300 deletions complete, worst max |Δ score| vs refit 8.30e-09 (redundant) · 2/2 claims hold" in text
    syn = next(ln for ln in lines if ln.startswith("  synthetic (2)"))
    assert "2/4 claims hold; not all: skewed-redundancy 1/3 (1 from an earlier run)" in syn
    assert lines[-1] == "  time: build-cohort 4 s, deterioration 3.0 min"
    assert "{" not in text and len(lines) <= 20


def test_a_missing_or_unreadable_result_is_left_out(tmp_path):
    runs = tmp_path / "runs"
    (runs / "icu_retention").mkdir(parents=True)
    (runs / "icu_retention" / "result.json").write_text("{not json")
    assert summary_lines(runs, total_s=10.0) == ["run-all done in 10 s"]


def test_run_all_prints_the_summary_and_writes_the_json_only_to_the_json_path(runs, tmp_path, monkeypatch, capsys):
    """The command's own printing, around a stand-in for the flow (which writes the result files)."""
    from pipelines.cli import build_parser
    from pipelines.flows import run_all

    seconds = {"build-cohort": 1.0, "retention": 2.0}

    class Flow:
        def with_options(self, **kw):
            return lambda **params: {"seconds": seconds, "report": params["report"] or "r.html",
                                     "warehouse": str(runs / "warehouse.duckdb")}

    monkeypatch.setattr(run_all, "run_all_flow", Flow())
    out = tmp_path / "timings.json"
    args = build_parser(["run-all"]).parse_args(["run-all", "--runs", str(runs), "--json", str(out)])
    assert run_all._main(args) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("run-all done in ") and printed[0].endswith("· report: r.html")
    assert (any(ln.startswith("  retention ") for ln in printed)
            and printed[-1] == "  time: build-cohort 1 s, retention 2 s")
    assert not any(ln.lstrip().startswith(("{", '"seconds"')) for ln in printed)  # no raw JSON on the console
    d = json.loads(out.read_text())
    assert d["seconds"] == seconds and d["report"] == "r.html" and d["total_seconds"] >= 0


def test_patient_deletion_line_states_both_gaps_to_the_refit():
    from pipelines.flows.run_summary import LINES

    claim = {"statement": "exact deletion reaches the same-C refit …", "holds": True,
             "value": {"exact max": 4.4e-15, "naive median": 0.15}}
    other = {"statement": "leakage zero", "holds": True, "value": 0.0}
    line = LINES["patient_deletion"]({"claims": [other, claim]})
    assert "exact deletion 4.40e-15 (max)" in line and "naive removal 0.15 (median)" in line
    assert "…" not in line and "refit sample" not in line
    # gaps over a refit sample: the denominator is stated
    sampled = LINES["patient_deletion"]({"claims": [claim], "metrics": {"refit_contexts": 200,
                                                                          "contexts_completed": 8543}})
    assert "naive removal 0.15 (median) over 200 of 8,543 contexts (refit sample) holds" in sampled
    # a result without the gap claim falls back to the first claim's statement
    assert LINES["patient_deletion"]({"claims": [other]}).startswith("leakage zero")


def test_the_cohort_line_names_where_the_data_came_from():
    from pipelines.flows.run_summary import LINES

    base = {"metrics": {"n_stays": 12, "n_tokens": 600}}
    assert LINES["cohort"]({**base, "data": "demo", "config": {"source": "demo"}}).endswith("(real MIMIC-IV demo)")
    assert LINES["cohort"]({**base, "data": "mimic", "config": {"source": "mimic"}}).endswith("(your MIMIC-IV root)")
    # a MEDS build holds real data ("mimic" for the report) but was not read from a MIMIC-IV root
    assert LINES["cohort"]({**base, "data": "mimic", "config": {"source": "meds"}}).endswith("(your MEDS dataset)")
