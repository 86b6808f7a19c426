"""The scale-out makespan model (issue 36 item 4): its schedule, its calibration and its workloads
are checked against what they model (a model, not a timing: nothing here is timed)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.bench import makespan
from pipelines.runtime.scaleout import lpt_makespan, stay_units

ROOT = Path(__file__).resolve().parents[1]


def test_the_simulated_schedule_is_the_list_schedule():
    d = [7.0, 5.0, 4.0, 3.0, 3.0, 2.0, 1.0]
    pairs = [(x, x) for x in d]
    for p in (1, 2, 3, 8):
        assert makespan.simulate(pairs, p, 0.0, 0.0) == pytest.approx(lpt_makespan(d, p))
    # a round trip per chunk on its worker; one client handling completions in turn
    assert makespan.simulate([(1.0, 1.0)] * 4, 1, 0.5, 0.0) == pytest.approx(4 * 1.5)
    assert makespan.simulate([(1.0, 1.0)] * 4, 4, 0.0, 0.25) == pytest.approx(1.0 + 4 * 0.25)
    # submitted by estimate, not by true duration
    assert makespan.simulate([(2.0, 1.0), (1.0, 9.0)], 1, 0.0, 0.0) == pytest.approx(10.0)


def _run(mode: str, rnd: int, chunks: list[tuple[str, int, int, float]], k: float) -> dict:
    """A dask_workers run record: chunks (phase, stays, hours of each stay, seconds)."""
    f = makespan._factors()
    phases: dict[str, list] = {}
    t = 0.0
    for ph, stays, h, secs in chunks:
        u = stays * stay_units([h])[0]
        phases.setdefault(ph, []).append({"stays": stays, "hours_max": h, "predicted_s": k * f[ph] * u,
                                           "seconds": secs, "worker": 0, "start": t, "end": t + secs})
        t += secs + 0.01
    return {"mode": mode, "round": rnd, "flow_s": 1.0, "pool_s": t, "lead_cpu_s": 1.0 + 0.02 * len(chunks),
            "seconds": 1.0 + t, "load_1min": 1.0,
            "phases": [{"phase": p, "start": 0.4, "chunks": c} for p, c in phases.items()]}


def test_calibration_recovers_known_costs():
    s = {"batches": 2e-7, "audit": 1.5e-6, "sensitivity": 8e-7}
    o = 0.05
    spec = [("batches", 1, 4000), ("batches", 3, 300), ("batches", 10, 120), ("audit", 1, 700),
            ("audit", 4, 200), ("sensitivity", 2, 500), ("sensitivity", 1, 900), ("batches", 1, 1500)]
    chunks = [(ph, m, h, s[ph] * m * stay_units([h])[0] + o) for ph, m, h in spec]
    res = {"stays": 1000, "load_1min": {"median": 1.0}, "runs": [_run("dask-1", 0, chunks, 3e-7),
                                   _run("dask-2", 0, [(p, m, h, 1.2 * x) for p, m, h, x in chunks], 3e-7)]}
    cal = makespan.calibrate([res])
    for ph in s:
        assert cal["s_per_unit"][ph] == pytest.approx(s[ph], rel=1e-6)
    assert cal["chunk_s"] == pytest.approx(o, abs=1e-9)
    assert cal["kappa"]["median"] == pytest.approx(1.2, rel=1e-6)
    assert cal["flow"]["a_s"] == pytest.approx(0.4) and cal["flow"]["b_s_per_stay"] == pytest.approx(0.6 / 1000)


@pytest.mark.parametrize("name", ["bench_dask.json", "bench_dask_seed1.json"])
def test_workloads_are_the_measured_stay_sets(name):
    """The stay draws reproduce each benchmark's sample (its recorded length summary)."""
    res = json.loads((ROOT / "docs" / "results" / name).read_text())
    w = makespan.bench_workload(res)
    h = sorted(w["hours"][s] for s in w["ids"])
    got = {"stays": len(h), "median": h[len(h) // 2], "p90": h[int(0.9 * (len(h) - 1))], "max": h[-1]}
    assert got == {k: res["sample_hours"][k] for k in got}
    assert len(w["sensitivity"]) == res["sensitivity_stays"] and 0 < len(w["audit"]) <= makespan.AUDIT_STAYS


def test_the_full_workload_is_the_full_size_run_all_data():
    data = json.loads((ROOT / "docs" / "results" / "run_all_full.json").read_text())["data"]
    w = makespan.full_workload()
    assert len(w["ids"]) == data["eligible_stays"]
    assert sum(w["hours"].values()) == pytest.approx(data["hourly_tokens"], rel=1e-5)


def test_scale_md_is_the_rendering_of_its_result():
    from pipelines.bench.scale_report import render_markdown

    result = json.loads((ROOT / "docs" / "SCALE.json").read_text())
    assert "scaleout" in result
    assert (ROOT / "docs" / "SCALE.md").read_text() == render_markdown(result, "SCALE.json")
