"""run-all's per-step wall, CPU and peak RSS (pipelines.runtime.step_meter): the high-water mark is reset
between steps on Linux, children count, and run-all's --json and summary carry the figures."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipelines.runtime import step_meter
from pipelines.runtime.step_meter import StepMeter

MB = 2**20
LINUX_HWM = step_meter.vm_hwm_mb() is not None and step_meter.reset_hwm()


def _touch(mb: int) -> np.ndarray:
    a = np.ones(mb * MB // 8)  # written, so resident
    return a


@pytest.mark.skipif(not LINUX_HWM, reason="needs /proc/self/clear_refs (Linux)")
def test_each_steps_peak_is_its_own_after_a_reset():
    m = StepMeter()
    assert m.method == "VmHWM"
    with m.step("small"):
        pass
    with m.step("big"):
        a = _touch(300)
        del a
    with m.step("after"):  # the 300 MB are freed: this step's own peak is back down
        pass
    assert m.peak_rss_mb["big"] - m.peak_rss_mb["small"] > 250
    assert m.peak_rss_mb["big"] - m.peak_rss_mb["after"] > 250
    j = m.as_json()
    assert j["rss_method"] == "VmHWM" and set(j["peak_rss_mb"]) == {"small", "big", "after"}
    assert j["peak_rss_mb_max"] == m.peak_rss_mb["big"]


def test_memory_an_earlier_step_left_shows_as_the_next_steps_start():
    m = StepMeter()
    with m.step("keeps"):
        kept = _touch(300)
    with m.step("inherits"):
        pass
    del kept
    assert m.start_rss_mb["inherits"] - m.start_rss_mb["keeps"] > 250
    assert m.peak_rss_mb["inherits"] >= m.start_rss_mb["inherits"] - 1
    assert set(m.as_json()["start_rss_mb"]) == {"keeps", "inherits"}


def test_the_fallback_is_a_high_water_mark_so_far():
    m = StepMeter(method="ru_maxrss")
    with m.step("big"):
        a = _touch(200)
        del a
    with m.step("after"):
        pass
    # cannot be reset: the later step's figure is an upper bound, never below the earlier peak
    assert m.peak_rss_mb["after"] >= m.peak_rss_mb["big"] > 200
    assert "cannot be reset" in m.as_json()["rss_method_note"]
    with pytest.raises(ValueError):
        StepMeter(method="rss")


METER_RUN = r"""
import json, subprocess, sys, time
from pipelines.runtime.step_meter import StepMeter
m = StepMeter()
code = "import numpy as np, time; a = np.ones(250 * 2**20 // 8); time.sleep(0.2)"
with m.step("child"):
    subprocess.run([sys.executable, "-c", code], check=True)
with m.step("busy"):
    t0 = time.process_time()
    while time.process_time() - t0 < 0.3:
        pass
print(json.dumps({**m.as_json(), "seconds": m.seconds}))
"""


def test_a_child_process_peak_is_counted_and_cpu_is_measured():
    # in a fresh process: the test runner's own children (a Prefect test server, say) are live
    # children too, and the meter rightly counts them
    out = subprocess.run([sys.executable, "-c", METER_RUN], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    m = json.loads(out.stdout.strip().splitlines()[-1])
    assert m["children_peak_rss_mb"]["child"] > 200 and m["peak_rss_mb"]["child"] > 200
    assert m["children_peak_rss_mb"]["busy"] == 0.0
    assert m["cpu_seconds"]["busy"] >= 0.25 and m["seconds"]["busy"] >= 0.25
    assert m["cpu_seconds"]["child"] > 0  # the ended child's CPU time counts


@pytest.mark.skipif(not LINUX_HWM, reason="needs /proc/self/clear_refs (Linux)")
def test_run_all_records_each_steps_figures_in_json_and_summary(tmp_path, monkeypatch, capsys):
    """run-all's step loop around stand-in steps (one allocates 300 MB, one is skipped)."""
    from pipelines.cli import build_parser
    from pipelines.flows import run_all

    def fake_step(step, *a, **k):
        if step == "retention":
            a = _touch(300)
            del a
        return step != "deterioration"  # deterioration: skipped (as without torch)

    monkeypatch.setattr(run_all, "_run_step", fake_step)
    run = run_all.Run("demo", None, "w.duckdb", "runs", "r.html", run_all.RunAllSettings(), False, lambda: None)
    meter = run_all._run_steps(["build-cohort", "retention", "deterioration", "report"], run)
    assert list(meter.seconds) == ["build-cohort", "retention", "report"]
    assert meter.peak_rss_mb["retention"] - meter.peak_rss_mb["report"] > 250

    class Flow:
        def with_options(self, **kw):
            return lambda **params: {"seconds": meter.seconds, "report": "r.html", "warehouse": "w.duckdb",
                                     **meter.as_json()}

    monkeypatch.setattr(run_all, "run_all_flow", Flow())
    out = tmp_path / "t.json"
    args = build_parser(["run-all"]).parse_args(["run-all", "--runs", str(tmp_path / "runs"), "--json", str(out)])
    assert run_all._main(args) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    rss = meter.peak_rss_mb["retention"]
    assert last.startswith("  time · peak RSS (VmHWM): build-cohort ") and f" s · {rss:,.0f} MB, report " in last
    d = json.loads(out.read_text())
    # the existing keys stay; the new ones sit beside them
    assert {"seconds", "report", "warehouse", "total_seconds"} <= set(d)
    assert d["peak_rss_mb"] == meter.peak_rss_mb and d["cpu_seconds"] == meter.cpu_seconds
    assert d["rss_method"] == "VmHWM" and set(d["children_peak_rss_mb"]) == set(d["seconds"]) == set(d["start_rss_mb"])


def test_run_all_bounds_the_builds_duckdb_memory(monkeypatch):
    """run-all's build gets a DuckDB memory limit (default 1GB: the build's peak is about that + 0.5 GB)."""
    from pipelines.cli import build_parser
    from pipelines.flows import clinical_cohort, run_all

    seen = {}

    class Flow:
        def with_options(self, **kw):
            return lambda **params: seen.update(params)

    monkeypatch.setattr(clinical_cohort, "build_cohort_flow", Flow())

    def run(settings):
        return run_all.Run("mimic", "root", "w.duckdb", "runs", "r.html", settings, False, lambda: None)
    assert run_all._run_step("build-cohort", run(run_all.RunAllSettings()))
    assert seen["settings"].memory_limit == run_all.BUILD_MEMORY_LIMIT == "1GB"
    args = build_parser(["run-all"]).parse_args(["run-all", "--build-memory-limit", "600MB"])
    run_all._run_step("build-cohort", run(run_all.settings_of(args)))
    assert seen["settings"].memory_limit == "600MB"
