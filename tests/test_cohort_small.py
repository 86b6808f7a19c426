"""Cohorts too small for a study fail at its start: one line naming the minimum and the split (or
the count) that came out short, exit code 3, no traceback, no result file written."""
from __future__ import annotations

import json
import os

import pytest
from test_cohort_build import mimic_fixture_warehouse

from cohort.selection import assign_splits
from pipelines.study_inputs import (
    CohortTooSmallError,
    min_patients_for_all_splits,
    require_event_stays,
    require_patients,
    require_splits,
    split_counts,
)


@pytest.fixture(scope="module")
def small_wh(tmp_path_factory):
    """The hand-written MIMIC fixture: 3 eligible stays of 3 patients -> train 2, val 0, test 1."""
    return mimic_fixture_warehouse(tmp_path_factory.mktemp("small"))


def test_the_fixture_has_an_empty_split(small_wh):
    c = split_counts(small_wh)
    assert c["val"] == (0, 0) and c["train"][0] >= 1 and c["test"][0] >= 1
    assert sum(s for s, _ in c.values()) < min_patients_for_all_splits()


def test_min_patients_for_all_splits_matches_assign_splits():
    m = min_patients_for_all_splits()
    nonempty = lambda n: set(assign_splits(range(n), 0).values()) == {"train", "val", "test"}  # noqa: E731
    assert not nonempty(m - 1)  # the hint's number is the real threshold, not a guess
    assert all(nonempty(n) for n in range(m, m + 300))


def test_split_message_names_minimum_split_and_counts(small_wh):
    with pytest.raises(CohortTooSmallError) as e:
        require_splits(small_wh, "deterioration", {"train": 1, "val": 1, "test": 1})
    msg = str(e.value)
    total = sum(s for s, _ in split_counts(small_wh).values())
    assert msg.startswith(f"deterioration needs ≥ 1 stay in the val split; this cohort's val split has 0 of "
                          f"{total} stays")
    assert f"from {min_patients_for_all_splits()} patients on" in msg and "--source synthetic --stays N" in msg
    assert "\n" not in msg
    with pytest.raises(CohortTooSmallError, match=r"needs ≥ 1 stay with an SpO2 < 90 % hour in the test split; "
                                                  r"this cohort's test split has 0 of 1 stay with one"):
        require_event_stays(small_wh, "heldout-spo2", "event_spo2", split="test", what="an SpO2 < 90 % hour")
    assert require_event_stays(small_wh, "retention", "event_composite") >= 1
    with pytest.raises(CohortTooSmallError, match=r"patient-deletion needs ≥ 5 patients \(x\); this cohort has 3"):
        require_patients(small_wh, "patient-deletion", 5, "x")


@pytest.mark.parametrize("command, first", [
    ("deterioration", "deterioration needs ≥ 1 stay in the val split; this cohort's val split has 0 of 3 stays"),
    ("patient-deletion", "patient-deletion needs ≥ 5 patients (one context shares 5 patients); this cohort has "
                         "3 patients"),
    ("audit", None),
])
def test_study_command_fails_early_with_one_line(prefect_harness, small_wh, tmp_path, capsys, command, first):
    from pipelines.cli import main

    runs = tmp_path / "runs"
    extra = ["--regimes", "gaussian", "icu_warehouse", "--trials", "2"] if command == "audit" else []
    rc = main([command, "--warehouse", small_wh, "--runs", str(runs), "--no-progress", "--json",
               str(tmp_path / "out.json"), *extra])
    out, err = capsys.readouterr()
    assert rc == 3
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if command == "audit":  # fails before any regime runs, with counts and what to do
        first = ("StudyConfigError: the icu_warehouse audit regime needs >= 1 stay with >= 12 distinct hourly keys "
                 "(deduplicated at 0.1 SD); this cohort has 0 of 3 stays")
        assert lines == [lines[0]] and lines[0].startswith(f"error: {first}"), err[-2000:]
    else:
        assert lines == [lines[0]] and lines[0].startswith(f"error: CohortTooSmallError: {first}"), err[-2000:]
    assert "Traceback" not in out + err
    written = [os.path.relpath(os.path.join(d, f), runs) for d, _, fs in os.walk(runs) for f in fs
               if f.endswith(".json") and not f.startswith(".")] if runs.exists() else []
    assert not [w for w in written if w.endswith("result.json")], written  # no half-written results
    assert not (tmp_path / "out.json").exists()
    json.dumps(written)
