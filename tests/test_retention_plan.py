"""The retention study's audit and sensitivity chunks share the stay batches' pool (issue 21):
one pool over several phases, longest first; the look-ahead of which stays have an event equals
what the batches compute, and a wrong look-ahead never changes the result."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from cohort.synthetic import make_small_warehouse
from pipelines.flows import retention_plan
from pipelines.runtime import runner, scaleout


def test_map_phases_one_pool_longest_first_results_per_phase_in_order():
    calls = []

    def f(w, h, stay_ids):
        calls.append(("f", tuple(stay_ids)))
        return sum(stay_ids)

    def g(w, h, stay_ids, k):
        calls.append(("g", tuple(stay_ids)))
        return [k * s for s in stay_ids]

    phases = [scaleout.Phase(f, [("w", "h", [1, 2]), ("w", "h", [3])], desc="a (stay batches)", costs=[0.5, 3.0]),
              scaleout.Phase(g, [("w", "h", [4], 10), ("w", "h", [5, 6], 10)], desc="a (refit audit)",
                             costs=[2.0, 0.1]),
              scaleout.Phase(g, [], desc="a (sensitivity)", costs=[])]
    with scaleout.chunk_log() as log:
        out = scaleout.map_phases(phases, progress=False)
    assert out == [[3, 3], [[40], [50, 60]], []]
    assert calls == [("f", (3,)), ("g", (4,)), ("f", (1, 2)), ("g", (5, 6))]  # across phases, most expensive first
    assert [r["desc"] for r in log] == ["a (stay batches)", "a (refit audit)", "a (sensitivity)"]
    assert [c["predicted_s"] for c in log[1]["chunks"]] == [2.0, 0.1] and log[2]["chunks"] == []
    assert log[0]["start"] == log[1]["start"] and log[0]["end"] <= log[1]["end"]  # one pool: the audit ended last
    assert all(c["start"] <= c["end"] <= c["received"] for r in log for c in r["chunks"])


def test_bench_flow_seconds_count_overlapping_phases_once():
    from pipelines.bench.dask_workers import timeline

    def chunk(ids, start, secs):
        return {"stay_ids": ids, "predicted_s": secs, "seconds": secs, "worker": "0", "start": start,
                "end": start + secs, "received": start + secs}
    log = [{"desc": "x (stay batches)", "executor": "dask", "start": 2.0, "end": 10.0,
            "chunks": [chunk([1], 2.0, 8.0)]},
           {"desc": "x (refit audit)", "executor": "dask", "start": 2.0, "end": 11.0, "chunks": [chunk([2], 2.0, 9.0)]}]
    tl = timeline(log, 0.0, 20.0, {1: 10, 2: 20})
    assert tl["pool_s"] == pytest.approx(9.0) and tl["flow_s"] == pytest.approx(11.0)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_small_warehouse(tmp_path_factory.mktemp("plan") / "src", stays=40, seed=3)


@pytest.mark.parametrize("label,drop", [("event_composite", []), ("event_spo2", ["spo2"])])
def test_the_look_ahead_equals_the_batch_columns(base, label, drop):
    from evaluation.clinical.retention_spec import StaySpec
    from pipelines.flows.retention_chunks import batch_results, event_stays
    from pipelines.store import warehouse as wh

    ids = [int(s[0]) for s in wh.stays(str(base))]
    spec = StaySpec(label=label, drop=tuple(drop), build_gate=False)
    cols = batch_results(str(base), ids, spec)["columns"]
    ahead = event_stays(str(base), ids, spec)
    assert np.array_equal(ahead["stay_id"], cols["stay_id"]) and np.array_equal(ahead["included"], cols["included"])
    inc = cols["included"]
    assert 0 < inc.sum() < inc.size and np.array_equal(ahead["n"][inc], cols["n"][inc])
    for m, cap in ((5, None), (7, 60), (100, None)):
        assert retention_plan.first_included(ahead, m, 0, cap) == retention_plan.first_included(cols, m, 0, cap)


def test_a_wrong_look_ahead_is_recomputed_and_changes_nothing(prefect_harness, base, tmp_path, monkeypatch):
    from pipelines.flows import retention_chunks
    from pipelines.flows.clinical_retention import retention_flow
    from pipelines.settings import RetentionSettings

    runs = tmp_path / "runs"
    runs.mkdir()
    w = runs / "warehouse.duckdb"
    shutil.copy(base, w)

    def run():
        with runner.results_context(str(runs)):
            return retention_flow.with_options(task_runner=runner.make_task_runner(None, 2))(
                warehouse=str(w), runs_dir=str(runs), progress=False,
                settings=RetentionSettings(n_boot=200, audit_stays=3, sensitivity_stays=5))
    relaunched = []
    finish = retention_plan.SidePlan.finish

    def spy(self, *a, **k):
        out = finish(self, *a, **k)
        relaunched.append(self.relaunched)
        return out
    monkeypatch.setattr(retention_plan.SidePlan, "finish", spy)
    ref = run()
    assert relaunched == [False]  # the look-ahead was right: no second pass
    real = retention_chunks.event_stays
    seen = []

    def wrong(*a, **k):
        out = real(*a, **k)
        out["included"] = ~out["included"]  # every stay with an event taken for one without, and back
        seen.append(1)
        return out
    monkeypatch.setattr(retention_chunks, "event_stays", wrong)
    again = run()
    assert seen == [1] and relaunched == [False, True]
    for k in ("retention", "refit_audit", "sensitivity"):
        assert again["metrics"][k] == ref["metrics"][k]
    assert ref["metrics"]["refit_audit"]["stays_audited"] == 3 and ref["metrics"]["sensitivity"]["stays"] == 5


def test_the_table_says_when_the_longest_stay_dominates():
    from pipelines.bench.dask_workers import dominance

    big = {"stays": 1, "hours_max": 8410, "seconds": 31.0, "share_of_chunk_work": 0.62}
    text = dominance(big)
    assert "dominates" in text and "8,410-hour" in text and "62 %" in text and "1.61×" in text
    assert dominance({**big, "share_of_chunk_work": 0.45}) == ""  # the others' work can fill 2 workers
    assert dominance({**big, "stays": 3}) == "" and dominance(None) == ""
    assert dominance({**big, "share_of_chunk_work": None}) == ""
