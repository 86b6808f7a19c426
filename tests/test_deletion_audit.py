"""The deletion audit, like for like with seed 001 §4: every result counts attempted, completed on
the maintained path, completed on it only after the SMO polish, completed by the exact fallback and
failed; a polished or fallback trial is never counted as plain maintained; the headline compares the
paper's regimes and trial counts; real-data and synthetic regimes are separate rows; runs with fewer
trials are labelled low power; the partition is compared on the unique part of the optimum."""
from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

from sv_core import audit
from sv_core.errors import GateError, PathError

CLASSES = ("attempted", "completed_maintained", "completed_polished", "completed_fallback", "failed")


def _classes_add_up(s: dict) -> None:
    for k in CLASSES + ("completed", "fallbacks", "trials_with_fallback", "polishes", "trials_with_polish"):
        assert k in s, k
    assert s["completed_maintained"] + s["completed_polished"] + s["completed_fallback"] + s["failed"] == s["attempted"]
    assert s["completed"] == s["completed_maintained"] + s["completed_polished"] + s["completed_fallback"]


def test_every_regime_summary_has_the_three_completion_classes_and_its_construction():
    res = audit.run_audit(trials=3, seed=0, progress=False)
    assert list(res["regimes"]) == ["gaussian", "redundant"]  # the paper's synthetic regimes by default
    for name, s in res["regimes"].items():
        _classes_add_up(s)
        assert s["info"]["paper_regime"] == name and s["info"]["data"] == "synthetic"
        assert s["all_completed"]["trials"] == s["completed"]
    assert "consequence of that construction" in res["regimes"]["redundant"]["info"]["construction"]
    json.dumps(res, allow_nan=False)


def test_a_fallback_deletion_is_counted_as_fallback_never_as_maintained(monkeypatch):
    from sv_core.solver import MaintainedSVDD

    def boom(self, slot):
        raise PathError("injected")

    monkeypatch.setattr(MaintainedSVDD, "remove_slot", boom)
    s = audit.run_audit(trials=3, regimes=["gaussian"], progress=False)["regimes"]["gaussian"]
    _classes_add_up(s)
    assert (s["completed_fallback"], s["completed_maintained"], s["completed_polished"], s["failed"]) == (3, 0, 0, 0)
    assert s["fallbacks"] == 6 and s["trials_with_fallback"] == 3  # two deletions per trial
    # the headline statistics are over the maintained path: there is none
    assert s["score_dev_median"] is None and s["partition_match_pct"] is None
    # the fallback's own agreement with the refit is still reported, apart
    assert s["all_completed"]["trials"] == 3 and s["all_completed"]["score_dev_worst"] < 1e-9
    assert "fallback" in audit.format_table({"regimes": {"gaussian": s}})


def test_a_deletion_finished_by_the_smo_polish_is_counted_as_polished_never_as_maintained(monkeypatch):
    """The KKT guard polishes when the maintained residual is above rounding level: force that on every
    deletion (the first two residual reads after a removal report 1e-10, so the real warm SMO polish runs
    and is kept) and check each trial lands under 'polished', with the error statistics still computed."""
    from sv_core.solver import MaintainedSVDD

    real_remove, real_guard = MaintainedSVDD.remove_slot, MaintainedSVDD.guard_residual
    fake = {"left": 0}

    def remove(self, slot):
        fake["left"] = 2
        return real_remove(self, slot)

    def guard(self):
        if fake["left"]:
            fake["left"] -= 1
            return 1e-10
        return real_guard(self)

    monkeypatch.setattr(MaintainedSVDD, "remove_slot", remove)
    monkeypatch.setattr(MaintainedSVDD, "guard_residual", guard)
    s = audit.run_audit(trials=3, regimes=["gaussian"], progress=False)["regimes"]["gaussian"]
    _classes_add_up(s)
    assert (s["completed_polished"], s["completed_maintained"], s["completed_fallback"], s["failed"]) == (3, 0, 0, 0)
    assert s["polishes"] == 6 and s["trials_with_polish"] == 3 and s["polishes_admission"] == 0
    assert s["completed_maintained_state"] == 3 and s["score_dev_worst"] < 1e-9  # polished trials stay in the stats
    assert s["by_path"]["polished"]["trials"] == 3 and s["by_path"]["maintained"]["trials"] == 0
    assert "polished" in audit.format_table({"regimes": {"gaussian": s}})


def test_unique_partition_is_well_defined_under_exact_repeats():
    """Any split of a repeat group's mass is optimal: two solutions that split it differently agree on
    the unique part of the optimum, while a real difference (mass moved between distinct keys) is seen."""
    X = np.array([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    C = 0.4
    a = np.array([0.4, 0.0, 0.3, 0.3])
    b = np.array([0.1, 0.3, 0.3, 0.3])  # the repeated key's 0.4 split differently
    assert not np.array_equal(audit.unique_partition(X[:1], a[:1], C), audit.unique_partition(X[:1], b[:1], C))
    assert np.array_equal(audit.unique_partition(X, a, C), audit.unique_partition(X, b, C))
    c = np.array([0.2, 0.0, 0.4, 0.4])  # mass moved from the repeat group to distinct keys
    assert not np.array_equal(audit.unique_partition(X, a, C), audit.unique_partition(X, c, C))
    # without repeats it is the per-key partition (0 reserve, 1 margin, 2 bound)
    assert audit.unique_partition(X[1:], np.array([0.0, 0.4, 0.3]), C).tolist() == [0, 2, 1]


def test_a_deletion_that_raises_is_a_failed_trial_in_the_denominator(monkeypatch):
    def fail(self, *a, **k):
        raise GateError("injected")

    monkeypatch.setattr(audit.Gate, "forget", fail)
    res = audit.run_audit(trials=2, regimes=["gaussian"], progress=False)
    s = res["regimes"]["gaussian"]
    _classes_add_up(s)
    assert (s["failed"], s["completed"]) == (2, 0) and len(res["failures"]) == 2


def test_regimes_draw_the_same_trials_alone_or_together():
    a = audit.run_audit(trials=2, regimes=["redundant"], progress=False)["regimes"]["redundant"]
    b = audit.run_audit(trials=2, regimes=["gaussian", "redundant"], progress=False)["regimes"]["redundant"]
    assert a == b


def test_trial_count_label_and_low_power():
    assert audit.trials_label(300) == "300 trials per regime (the paper's count)"
    assert audit.trials_label(50, 4) == "4 regimes x 50 of the paper's 300 trials per regime"
    p = audit.power(300, 4)
    assert not p["low_power"] and p["label"] == ""
    q = audit.power(50, 4)
    assert q["low_power"] and "50 of the paper's 300" in q["label"]
    assert q["p_see_paper_failure_rate"] == pytest.approx(1 - (1 - 1 / 1200) ** 200)  # 0.154
    assert "0.15" in q["label"]
    with pytest.raises(KeyError):
        audit.register_regime("x", audit.gaussian_keys, paper_regime="not-a-regime")


def _summary(att, maint, fb, median, data, paper, polished=0):
    failed = att - maint - fb - polished
    return {"attempted": att, "completed": maint + fb + polished, "completed_maintained": maint,
            "completed_polished": polished, "completed_fallback": fb,
            "failed": failed, "partition_match_pct": 100.0, "score_dev_median": median, "score_dev_mean": median,
            "score_dev_p95": median, "score_dev_worst": 10 * median, "decay_median": 0.05, "kkt_residual_worst": 1e-15,
            "fallbacks": fb, "fallbacks_admission": 0, "trials_with_fallback": fb, "all_completed": {},
            "info": {"data": data, "paper_regime": paper, "construction": f"built for {paper}"}}


@pytest.mark.parametrize("icu_data", ["demo", "synthetic"])
def test_result_rows_headline_and_paper_columns(icu_data):
    from evaluation.studies.deletion_audit import PAPER_TABLE, audit_result

    summ = {"gaussian": _summary(300, 300, 0, 1e-15, "synthetic", "gaussian"),
            "redundant": _summary(300, 276, 3, 1e-14, "synthetic", "redundant", polished=20),
            "icu_warehouse": _summary(300, 299, 0, 2e-15, icu_data, "mimic"),
            "learned": _summary(300, 300, 0, 3e-16, "learned", "learned")}
    r = audit_result(summ, trials=300, seed=0, protocol={"gamma": 0.01, "nu": 0.4})
    m = r["metrics"]
    assert (m["attempted"], m["completed_maintained"], m["completed_polished"], m["completed_fallback"],
            m["failed"]) == (1200, 1175, 20, 3, 2)
    assert m["headline"].startswith("1,175/1,200 completed on the maintained path, 20 on it after an SMO polish, "
                                    "3 by the exact fallback, 2 failed")
    assert m["completion_paths"] == {"maintained_path": 1175, "after_SMO_polish": 20, "exact_fallback": 3, "failed": 2}
    assert "paper: 1,199/1,200" in m["headline"]
    assert m["paper_protocol"] and not m["power"]["low_power"] and "not the paper" not in r["title"]
    rows = {row[0]: row for row in r["tables"][0]["rows"]}
    icu = rows["icu_warehouse"]
    real = icu_data == "demo"
    # real-data rows first, then synthetic ones, each group with its own total
    order = [row[0] for row in r["tables"][0]["rows"]]
    if real:
        assert order[0] == "icu_warehouse" and rows["total: real-data regimes"][3] == 300
    else:
        assert "total: real-data regimes" not in rows
    assert rows["total: synthetic regimes (incl. learned keys)"][3] == (900 if real else 1200)
    # the paper's MIMIC-IV row is shown only beside real ICU keys
    assert icu[13:17] == (["299/300", 98, PAPER_TABLE["mimic"]["median"], PAPER_TABLE["mimic"]["worst"]] if real
                          else [None, None, None, None])
    assert rows["redundant"][4:8] == [276, 20, 3, 1]
    # residuals below 1e-12 print as the bound, never as rounding digits
    assert rows["gaussian"][9:12] == ["< 1e-12", "< 1e-12", "< 1e-12"]
    # every claim has a status decided on a range / interval, the paper's figure and the peer's
    from dashboards.schema import validate_result

    validate_result({**r, "seed_figure": {}})
    assert [c["status"] for c in r["claims"]] == ["does not hold"] + ["holds"] * 4  # 2 failed trials
    reg = r["claims"][1]
    assert reg["peer"]["value"] == 0.05 and reg["run"]["high"] == pytest.approx(1e-14) and reg["paper"]["figure"]
    assert r["data"] == icu_data
    assert "redundant: built for redundant" in r["figures"][0]["caption"]


def test_result_with_fewer_trials_is_labelled():
    from evaluation.studies.deletion_audit import audit_result

    summ = {"gaussian": _summary(50, 50, 0, 1e-15, "synthetic", "gaussian")}
    r = audit_result(summ, trials=50, seed=0, protocol={"gamma": 0.01})
    assert "1 regime x 50 of the paper's 300 trials per regime" in r["title"]
    assert "not the paper's protocol" in r["title"]
    assert r["metrics"]["power"]["low_power"] and not r["metrics"]["paper_protocol"]
    assert all(c["status"] == "not run at the paper's protocol" and c["low_power"]["n"] == 50 for c in r["claims"])
    assert all("50 of the paper's 300" in c["reason"] for c in r["claims"])
    from dashboards.report import low_power_warning

    assert "50 of the paper's 300 trials per regime" in low_power_warning(r)


def test_audit_flow_result_carries_fallback_counts(prefect_harness, tmp_path):
    from cohort.synthetic import make_small_warehouse
    from pipelines.errors import StudyInputError
    from pipelines.flows.audit_flow import audit_flow
    from pipelines.runtime import runner

    w = make_small_warehouse(tmp_path / "src", stays=40, seed=0)
    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copy(w, runs / "warehouse.duckdb")
    w = str(runs / "warehouse.duckdb")
    from pipelines.store.warehouse import set_data_kind

    set_data_kind(w, "synthetic")
    with runner.results_context(runs):
        res = audit_flow.with_options(task_runner=runner.make_task_runner(None, 2))(
            warehouse=w, runs_dir=str(runs), trials=3, regimes=("gaussian", "icu_warehouse"), progress=False)
        with pytest.raises(StudyInputError, match="unknown regime"):
            audit_flow(warehouse=w, runs_dir=str(runs), trials=3, regimes=("nope",), progress=False)
    stored = json.loads((runs / "deletion_audit" / "result.json").read_text())
    for r in (res, stored):
        for regime in ("gaussian", "icu_warehouse"):
            _classes_add_up(r["metrics"][regime])
        cols = r["tables"][0]["columns"]
        assert {"maintained path", "exact fallback", "failed"} <= set(cols)
        assert r["data"] == "synthetic" and "x 3 of the paper's 300" in r["title"]
        icu = next(row for row in r["tables"][0]["rows"] if row[0] == "icu_warehouse")
        assert icu[1] == "synthetic" and icu[13:17] == [None, None, None, None]
        assert {c["status"] for c in r["claims"]} == {"not run at the paper's protocol"}
    assert stored["seed_figure"]["text"]  # the synthetic regimes stay comparable (a mixed seed figure)
    assert math.isfinite(stored["metrics"]["gaussian"]["score_dev_median"])
    assert np.isclose(stored["metrics"]["power"]["p_see_paper_failure_rate"], 1 - (1 - 1 / 1200) ** 6)
