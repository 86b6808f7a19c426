"""A study whose tasks come from the task cache reports the original computation's run time (and
says "cached"), not the seconds of the cache hits (issue 18: a resumed run showed cache-hit
seconds as the study's run time)."""
from __future__ import annotations

import time

import pytest

from pipelines.runtime import runner, task_cache

TASK_S = 0.4  # each task sleeps this long; a cache hit takes milliseconds


def test_covered_counts_overlapping_spans_once():
    assert task_cache.covered([]) == 0.0
    assert task_cache.covered([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (5.5, 5.7)]) == pytest.approx(4.0)
    assert task_cache.covered([(3.0, 4.0), (0.0, 1.0)]) == pytest.approx(2.0)


def test_a_cache_hit_reports_the_original_computation(tmp_path):
    wh = str(tmp_path / "w.duckdb")
    calls = []

    @task_cache.cached
    def slow(warehouse, content_hash, x):
        calls.append(x)
        time.sleep(TASK_S)
        return {"x": x}

    task_cache.take_tally(None)  # whatever earlier tests left outside a flow run
    t0 = time.perf_counter()
    assert slow(wh, "h", 1) == {"x": 1} and slow(wh, "h", 2) == {"x": 2}
    first = {"runtime_s": time.perf_counter() - t0}
    tally = task_cache.take_tally(None)
    assert (tally.hits, tally.computed) == (0, 2)
    runner.runtime_with_cache(first, tally)
    assert "config" not in first and "notes" not in first  # computed now: nothing to say

    t0 = time.perf_counter()
    assert slow(wh, "h", 1) == {"x": 1} and slow(wh, "h", 2) == {"x": 2} and calls == [1, 2]
    resumed = {"runtime_s": time.perf_counter() - t0, "notes": "n"}
    assert resumed["runtime_s"] < TASK_S  # the hits themselves are fast
    runner.runtime_with_cache(resumed, task_cache.take_tally(None))
    # the two tasks ran one after the other the first time: 2 x TASK_S of original computation
    assert resumed["runtime_s"] >= 2 * TASK_S and resumed["runtime_s"] == pytest.approx(first["runtime_s"], abs=0.3)
    assert (resumed["config"]["task_cache"]["tasks_cached"] == 2
            and resumed["config"]["task_cache"]["tasks_computed"] == 0)
    assert resumed["notes"].startswith("n · cached: 2 task(s) came from the task cache; the run time counts")
    assert runner.cache_note(resumed) == " (cached)" and runner.cache_note(first) == ""


def test_an_entry_of_another_layout_is_never_read(tmp_path, monkeypatch):
    """The entry layout is part of the key: a result cached by another ``_pack`` is recomputed."""
    wh = str(tmp_path / "w.duckdb")
    calls = []

    @task_cache.cached
    def f(warehouse, x):
        calls.append(x)
        return x

    assert f(wh, 1) == 1 and f(wh, 1) == 1 and calls == [1]
    monkeypatch.setattr(task_cache, "_LAYOUT", "another layout")
    assert f(wh, 1) == 1 and calls == [1, 1]
    task_cache.take_tally(None)


def test_in_a_flow_the_study_result_states_the_original_run_time(prefect_harness, tmp_path):
    """Tasks run in the flow's thread pool; their hits are attributed to the flow run that writes
    the result (one tally per flow run), and the written file carries the original seconds."""
    import json

    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE

    wh = str(tmp_path / "w.duckdb")

    @task(cache_policy=NO_CACHE, persist_result=False)
    @task_cache.cached
    def work(warehouse, i):
        time.sleep(TASK_S)
        return i

    @flow
    def study(runs_dir: str) -> dict:
        t0 = time.perf_counter()
        futures = [work.submit(wh, i) for i in range(4)]
        out = runner.gather(futures, "work", progress=False)
        res = {"study": "cache_probe", "title": "cache probe", "data": "synthetic", "seed_figure": {},
               "metrics": {"n": len(out)}, "tables": [], "figures": [], "runtime_s": time.perf_counter() - t0}
        runner.write_study_result(res, runs_dir)
        return res

    runs = tmp_path / "runs"
    flow_ = study.with_options(task_runner=runner.make_task_runner(max_workers=2))
    first = flow_(str(runs))
    second = flow_(str(runs))
    stored = json.loads((runs / "cache_probe" / "result.json").read_text())
    tc = stored["config"]["task_cache"]
    assert "config" not in first or "task_cache" not in first.get("config", {})
    assert tc["tasks_cached"] == 4 and tc["tasks_computed"] == 0 and tc["this_run_s"] < first["runtime_s"]
    # 4 tasks of TASK_S on 2 workers took about 2 x TASK_S of wall time, and that is what is stated
    assert stored["runtime_s"] >= 2 * TASK_S and stored["runtime_s"] == pytest.approx(second["runtime_s"])
    assert "cached: 4 task(s) came from the task cache;" in stored["notes"]
