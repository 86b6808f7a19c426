"""The scale benchmark: its arithmetic (summaries, marginal cost, exponents, extrapolation), the
rendering of docs/SCALE.md from the result JSON, option detection, the process measurement, and
the build's scan peers against a plain-Python computation. The end-to-end run is ``slow``."""
from __future__ import annotations

import copy
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from dashboards.numbers import fixed
from pipelines.bench import scale as bs
from pipelines.bench import scale_report as rep

ROOT = Path(__file__).resolve().parents[1]


def _run(cpu, wall=None, rss=100.0, comp=None, load=(1.0, 2.0), ccpu=None):
    r = {"wall_s": wall if wall is not None else 2 * cpu, "cpu_s": cpu, "compute_s": comp, "peak_rss_mb": rss,
         "tree_rss_mb": rss + 1, "load_start": load[0], "load_end": load[1]}
    if ccpu is not None:
        r["compute_cpu_s"] = ccpu
    return r


def _result():
    """Three sizes whose build's own CPU is exactly 2e-6·rows^1.1 (process CPU: + 3 s of start-up)
    and retention CPU 0.05·stays + 3."""
    sizes = []
    for rows, stays in ((1_000_000, 100), (4_000_000, 400), (16_000_000, 1600)):
        b = 2e-6 * rows ** 1.1
        sizes.append({
            "label": f"{rows / 1e6:.1f}M rows", "chartevents_rows": rows, "stays_generated": 2 * stays,
            "eligible_stays": stays, "hourly_rows": 50 * stays,
            "steps": {
                "build": {"status": "ok", "stays": stays,
                          "runs": [_run(b * 1.1 + 3, rss=300, comp=b / 2, ccpu=b * 1.1),
                                   _run(b + 3, rss=310, comp=b / 2, ccpu=b),
                                   _run(b * 0.9 + 3, rss=305, comp=b / 2, ccpu=b * 0.9)]},
                "peer_duckdb": {"status": "ok", "stays": stays, "runs": [_run(b / 2, rss=200, comp=b / 4)]},
                "retention": {"status": "ok", "stays": stays, "runs": [_run(0.05 * stays + 3, rss=100 + stays / 10)],
                              "longest_stay_h": 300 + stays},
                "deterioration": {"status": "skipped", "reason": "no stays option; too many", "stays": None,
                                  "runs": []},
            }})
    return {"kind": "bench_scale", "machine": {"cpu_count": 2, "mem_total_gb": 24.0, "platform": "Linux"},
            "settings": {}, "created_utc": "2026-01-01T00:00:00Z", "sizes": sizes}


def test_fit_power_recovers_the_exponent_and_needs_two_sizes():
    xs = [10.0, 100.0, 1000.0]
    f = rep.fit_power(xs, [3 * x ** 1.5 for x in xs])
    assert f["exponent"] == pytest.approx(1.5, abs=1e-12) and f["prefactor"] == pytest.approx(3.0, rel=1e-9)
    assert f["n"] == 3
    assert rep.fit_power([10.0, 10.0], [1.0, 2.0]) is None  # one distinct size: no slope
    assert rep.fit_power([10.0, 100.0], [0.0, 2.0]) is None  # non-positive figures are left out


def test_step_summary_medians_spread_and_peak():
    s = rep.step_summary(_result()["sizes"][0]["steps"]["build"])
    b = 2e-6 * 1e6 ** 1.1
    assert s["compute_cpu_s"] == pytest.approx(b) and s["compute_cpu_min"] == pytest.approx(0.9 * b)
    assert s["compute_cpu_max"] == pytest.approx(1.1 * b) and s["cpu_s"] == pytest.approx(b + 3)
    assert s["peak_rss_mb"] == 310 and s["n_runs"] == 3
    assert s["load_start"] == 1.0 and s["load_end"] == 2.0
    assert rep.step_summary({"status": "skipped", "runs": []}) is None
    assert rep.step_summary({"status": "failed", "runs": [_run(1.0)]}) is None


def test_fits_marginals_and_extrapolation():
    r = _result()
    f = rep.fits(r)
    # the build is fitted on its own CPU (the 3 s start-up would flatten the exponent); the peer
    # has no compute CPU here, so its process CPU is used
    assert f["build"]["cpu_metric"] == "compute_cpu_s" and f["peer_duckdb"]["cpu_metric"] == "cpu_s"
    assert f["build"]["cpu_s"]["exponent"] == pytest.approx(1.1, abs=1e-9)
    assert f["peer_duckdb"]["cpu_s"]["exponent"] == pytest.approx(1.1, abs=1e-9)
    assert f["deterioration"]["cpu_s"] is None
    m = rep.marginals(r)
    # retention CPU = 0.05·stays + 3: the marginal cost is exactly 50 ms per stay
    assert [x["cpu_ms_per_stay"] for x in m["retention"]] == pytest.approx([50.0, 50.0])
    ex = rep.extrapolate(r)
    tgt = rep.FULL_MIMIC
    assert ex["build"]["cpu_s"] == pytest.approx(2e-6 * tgt["chartevents_rows"] ** 1.1, rel=1e-9)
    b1, b0 = 2e-6 * 4e6 ** 1.1, 2e-6 * 16e6 ** 1.1
    assert ex["build"]["cpu_s_marginal"] == pytest.approx(b0 + (b0 - b1) / 12e6 * (tgt["chartevents_rows"] - 16e6))
    rf = f["retention"]["cpu_s"]
    assert ex["retention"]["cpu_s"] == pytest.approx(83.0 * (tgt["eligible_stays"] / 1600) ** rf["exponent"])
    assert ex["retention"]["cpu_s_marginal"] == pytest.approx(0.05 * tgt["eligible_stays"] + 3)  # exact: linear
    assert ex["retention"]["x_target"] == tgt["eligible_stays"] and "deterioration" not in ex
    # retention's peak RSS is 100 MB + 0.1 MB per stay: the marginal memory estimate is exact
    assert ex["retention"]["peak_rss_mb_marginal"] == pytest.approx(100 + tgt["eligible_stays"] / 10)
    g = rep.memory_growth(r)
    assert g["retention"] == pytest.approx({"x_from": 100, "x_to": 1600, "ratio": 16.0, "rss_from": 110.0,
                                            "rss_to": 260.0, "growth_mb": 150.0, "longest_from": 400,
                                            "longest_to": 1900})
    assert g["build"]["growth_mb"] == 0 and "deterioration" not in g
    doc = rep.render_markdown(r)
    assert "| retention | 100 → 1,600 | 16.0 | 400 → 1,900 | 110 → 260 | 150 |" in doc
    assert "| build-cohort --source mimic | 1,000,000 → 16,000,000 | 16.0 | – | 310 → 310 | 0 |" in doc
    assert f"| {fixed(100 + tgt['eligible_stays'] / 10, 0)} |" in doc


def test_render_takes_every_figure_from_the_result():
    r = _result()
    doc = rep.render_markdown(r, "result.json")
    s = rep.step_summary(r["sizes"][2]["steps"]["build"])
    ps = rep.step_summary(r["sizes"][2]["steps"]["peer_duckdb"])
    assert f"| {fixed(s['cpu_s'])} |" in doc and f"| {fixed(s['compute_cpu_s'], 2)} |" in doc
    assert f"process CPU {fixed(s['cpu_s'] / ps['cpu_s'], 2)}×" in doc  # build vs peer ratio
    assert "skipped: no stays option; too many" in doc
    ex = rep.extrapolate(r)
    assert fixed(rep.fits(r)["build"]["cpu_s"]["exponent"], 2) in doc
    assert rep._dur(ex["build"]["cpu_s"]) in doc and rep._dur(ex["retention"]["cpu_s_marginal"]) in doc
    # a changed figure in the JSON changes the document, and only through the JSON
    r2 = copy.deepcopy(r)
    for run in r2["sizes"][2]["steps"]["retention"]["runs"]:
        run["cpu_s"] = 999.0
    doc2 = rep.render_markdown(r2, "result.json")
    assert doc2 != doc and "| 999.0 |" in doc2 and "| 999.0 |" not in doc


def test_sizes_with_different_steps_render():
    """A size measured with other steps (e.g. an appended build-only size) is left out of the
    series of the steps it did not run."""
    r = _result()
    big = copy.deepcopy(r["sizes"][2])
    big.update(label="64.0M rows", chartevents_rows=64_000_000, eligible_stays=6400)
    big["steps"] = {"build": big["steps"]["build"]}
    r["sizes"].append(big)
    assert [x["to_stays"] for x in rep.marginals(r)["retention"]] == [400, 1600]
    assert rep.fits(r)["build"]["cpu_s"]["n"] == 4 and rep.fits(r)["retention"]["cpu_s"]["n"] == 3
    doc = rep.render_markdown(r)
    # size tables, marginals, exponents, growth, extrapolation
    assert "## 64.0M rows" in doc and doc.count("| retention |") == 3 + 2 + 1 + 1 + 1


def test_merge_keeps_each_sizes_settings_and_replaces_a_remeasured_size():
    a, b = _result(), _result()
    a["settings"], b["settings"] = {"repeat": 3}, {"repeat": 1}
    a["created_utc"], b["created_utc"] = "A", "B"
    b["sizes"] = [copy.deepcopy(b["sizes"][1]), {**copy.deepcopy(b["sizes"][0]), "label": "big",
                                                  "chartevents_rows": 10**9}]
    b["sizes"][0]["eligible_stays"] = 7  # the 4M size measured again
    m = rep.merge_results([a, b])
    assert [z["chartevents_rows"] for z in m["sizes"]] == [1_000_000, 4_000_000, 16_000_000, 10**9]
    assert m["sizes"][1]["eligible_stays"] == 7 and m["sizes"][1]["settings"] == {"repeat": 1}
    assert m["sizes"][0]["settings"] == {"repeat": 3} and m["merged_runs"] == ["A", "B"]
    assert rep.merge_results([m]) == m  # re-rendering a merged file changes nothing
    doc = rep.render_markdown(m)
    assert "interleaved 3×" in doc and "interleaved 1×" in doc and "runs started A, B" in doc
    # each size keeps the command that measured it; the document lists the reruns in order
    a["command"], b["command"] = "python -m pipelines.bench.scale CA", "python -m pipelines.bench.scale CB --append"
    m = rep.merge_results([a, b])
    assert [z["command"] for z in m["sizes"]] == [a["command"], b["command"], a["command"], b["command"]]
    doc = rep.render_markdown(m)
    assert "```\n" + a["command"] + " && " + b["command"] + "\n```" in doc  # still one line
    assert "```\n" + a["command"] + "\n```" in rep.render_markdown(a)  # one run: one line
    # each run's uptime stays with its sizes; the document names the later run's beside its sizes
    a["uptime_start"], b["uptime_start"], b["uptime_end"] = "load average: 1.00", "load average: 9.00", "la 8"
    m = rep.merge_results([a, b])
    assert [z["uptime_start"] for z in m["sizes"]] == ["load average: 1.00", "load average: 9.00"] * 2
    doc = rep.render_markdown(m)
    assert doc.count("`uptime` of its run at the start: load average: 9.00; at the end: la 8.") == 2


def test_docs_scale_md_is_the_rendering_of_its_result():
    res, doc = ROOT / "docs" / "SCALE.json", ROOT / "docs" / "SCALE.md"
    if not res.is_file():
        pytest.skip("docs/SCALE.json not present")
    assert doc.read_text() == rep.render_markdown(json.loads(res.read_text()), "SCALE.json")


def test_study_arguments_follow_the_command_options():
    full = {"--warehouse", "--stays"}
    args, n, _ = bs.study_argv("retention", full, 5000, 200, 3000)
    assert args == ["--stays", "200"] and n == 200
    assert not bs.needs_sample("retention", full, 5000, 200)  # the command's own option, no sampled warehouse
    # no stays option: a cap runs on a sampled warehouse (build-cohort --sample), no cap skips a big one
    args, n, why = bs.study_argv("retention", {"--warehouse"}, 5000, 200, 3000)
    assert args == [] and n == 200 and "--sample 200" in why
    assert bs.needs_sample("retention", {"--warehouse"}, 5000, 200)
    args, n, why = bs.study_argv("retention", {"--warehouse"}, 5000, None, 3000)
    assert args is None and "no stays option" in why and "5,000" in why
    args, n, _ = bs.study_argv("retention", {"--warehouse"}, 800, None, 3000)
    assert args == [] and n == 800  # small enough for the whole warehouse
    args, n, _ = bs.study_argv("retention", {"--warehouse"}, 150, 200, 3000)
    assert args == [] and n == 150 and not bs.needs_sample("retention", {"--warehouse"}, 150, 200)
    args, n, _ = bs.study_argv("retention", {"--warehouse"}, 4000, 5000, 3000)
    assert args == [] and n == 4000  # a cap above the warehouse: the whole warehouse, never skipped
    args, n, _ = bs.study_argv("deterioration", {"--max-stays"}, 5000, 300, 3000)
    assert args == ["--seeds", "1", "--max-epochs", "2", "--max-stays", "300"] and n == 300


def test_result_path_and_document_source_name(tmp_path):
    assert bs.result_path("runs/bench_scale") == Path("runs/bench_scale/result.json")
    assert bs.result_path("docs/SCALE.json") == Path("docs/SCALE.json")
    assert bs.source_name(tmp_path / "docs" / "SCALE.json", tmp_path / "docs" / "SCALE.md") == "SCALE.json"
    assert bs.source_name(tmp_path / "r" / "x.json", tmp_path / "docs" / "S.md") == str(Path("..") / "r" / "x.json")


def test_bad_arguments_fail_in_one_line_and_write_nothing(tmp_path, capsys):
    out, doc = tmp_path / "r.json", tmp_path / "S.md"
    for argv in (["--sizes", "1e6", "2e6", "--study-stays", "1", "2", "3"], ["--sizes", "1e6", "--steps", "nope"],
                 ["--sizes", "1e6", "--study-stays", "0"]):
        with pytest.raises(SystemExit) as e:
            bs.main([*argv, "--out", str(out), "--doc", str(doc)])
        assert e.value.code == 2
    assert not out.exists() and not doc.exists()


def test_render_states_the_rerun_command_uptime_and_the_sampled_warehouse(tmp_path):
    r = _result()
    r["command"] = "python -m pipelines.bench.scale --sizes 1e6 4e6 16e6 --study-stays 100 400 1600"
    r["uptime_start"], r["uptime_end"] = "up 1 day, load average: 5.10, 4.00, 3.00", "load average: 6.20, 5, 4"
    r["sizes"][1]["study_warehouse"] = {"sample": 400, "command": "build-cohort --source mimic --sample 400",
                                        "run": {"wall_s": 12.5, "cpu_s": 20.31, "rc": 0}}
    doc = rep.render_markdown(r, "SCALE.json")
    assert "```\n" + r["command"] + "\n```" in doc
    assert "5.10, 4.00, 3.00" in doc and "6.20, 5, 4" in doc
    assert doc.count("sampled by `build-cohort --source mimic --sample 400`") == 1 and "CPU 20.3 s" in doc
    # the --render path: the same document, named after its result file
    res = tmp_path / "docs" / "SCALE.json"
    res.parent.mkdir()
    res.write_text(json.dumps(r))
    assert bs.main(["--render", str(res), "--doc", str(tmp_path / "docs" / "SCALE.md")]) == 0
    assert (tmp_path / "docs" / "SCALE.md").read_text() == rep.render_markdown(r, "SCALE.json")


def test_step_table_names_real_commands_and_options():
    from pipelines.cli import COMMANDS

    for spec in bs.STEPS.values():
        assert spec.command in COMMANDS
    opts = bs.command_options("deterioration")
    assert {"--warehouse", "--runs", "--json", "--seeds", "--max-epochs"} <= opts
    assert set(bs.STEPS["deterioration"].args[::2]) <= opts  # the documented caps exist


def test_measure_reports_exit_code_peak_rss_and_timeout(tmp_path):
    code = "import sys; b = bytearray(200 * 2**20); b[::4096] = b'x' * len(b[::4096]); sys.exit(3)"
    run = bs.measure([sys.executable, "-c", code], {}, tmp_path, tmp_path / "alloc")
    assert run["rc"] == 3 and not run["timed_out"]
    assert run["peak_rss_mb"] >= 200 and run["cpu_s"] >= 0
    slow = bs.measure([sys.executable, "-c", "import time; time.sleep(60)"], {}, tmp_path, tmp_path / "sleep",
                      timeout=0.5)
    assert slow["timed_out"] and slow["rc"] != 0 and slow["wall_s"] < 30


def test_measured_peak_rss_is_the_commands_own(tmp_path):
    """A small command started by a large process reports its own peak, not the parent's."""
    ballast = bytearray(300 * 2**20)
    ballast[::4096] = b"x" * len(ballast[::4096])  # this process now holds > 300 MB
    run = bs.measure([sys.executable, "-c", "pass"], {}, tmp_path, tmp_path / "small")
    assert run["rc"] == 0 and run["peak_rss_mb"] < 100
    del ballast


@pytest.fixture(scope="module")
def small_root(tmp_path_factory):
    from cohort.synthetic import generate

    out = tmp_path_factory.mktemp("root") / "mimic"
    generate(out, stays=40, seed=3, fmt="parquet", workers=1)
    return out


def _python_hourly_means(root: Path) -> tuple[int, float]:
    """The peers' definition, row by row in plain Python (independent of DuckDB and Polars)."""
    import pyarrow.parquet as pq

    from cohort.constants import CELSIUS_ITEMID, FAHRENHEIT_ITEMID, ITEMIDS, PLAINLY_FAHRENHEIT_ABOVE, PLAUSIBLE

    st = pq.read_table(root / "icu" / "icustays.parquet", columns=["stay_id", "intime", "outtime"]).to_pylist()
    win = {s["stay_id"]: (s["intime"], s["outtime"]) for s in st
           if (s["outtime"] - s["intime"]).total_seconds() >= 48 * 3600}
    ce = pq.read_table(root / "icu" / "chartevents.parquet",
                       columns=["stay_id", "charttime", "itemid", "valuenum"]).to_pylist()
    groups = defaultdict(list)
    for r in ce:
        if r["itemid"] not in ITEMIDS or r["valuenum"] is None or r["stay_id"] not in win:
            continue
        t_in, t_out = win[r["stay_id"]]
        if not t_in <= r["charttime"] <= t_out:
            continue
        v = r["valuenum"]
        if r["itemid"] == FAHRENHEIT_ITEMID or (r["itemid"] == CELSIUS_ITEMID and v > PLAINLY_FAHRENHEIT_ABOVE):
            v = (v - 32.0) * 5.0 / 9.0
        lo, hi = PLAUSIBLE[ITEMIDS[r["itemid"]][0]]
        if lo <= v <= hi:
            hour = int((r["charttime"] - t_in).total_seconds() * 1_000_000) // 3_600_000_000
            groups[(r["stay_id"], hour, r["itemid"])].append(v)
    return len(groups), sum(sum(g) / len(g) for g in groups.values())


def test_scan_peers_compute_the_hourly_means(small_root):
    from cohort.bench import run_peer

    n, total = _python_hourly_means(small_root)
    assert n > 100
    for kind in ("duckdb", "polars"):
        r = run_peer(kind, small_root)
        assert r["groups"] == n, kind
        assert math.isclose(r["checksum"], round(total, 3), rel_tol=1e-9, abs_tol=2e-3), kind
    with pytest.raises(ValueError, match="unknown peer"):
        run_peer("sqlite", small_root)


def _table_rows(doc: str) -> list[list[str]]:
    """The cells of every row of the per-size tables (header first)."""
    out = []
    for ln in doc.splitlines():
        if ln.startswith("| step | stays |") or (out and ln.startswith("| ") and not ln.startswith("|---")):
            out.append([c.strip() for c in ln.strip().strip("|").split("|")])
        elif out and not ln.startswith("|"):
            break
    return out


def test_harness_builds_a_small_root_through_the_cli(small_root, tmp_path, prefect_harness):
    """The real harness on a 40-stay root: the build through ``python -m pipelines.cli``
    interleaved with both peers, one row per step with every column, figures that belong to it."""
    from prefect.settings import PREFECT_API_URL

    out, doc = tmp_path / "r.json", tmp_path / "SCALE.md"
    rc = bs.main(["--root", str(small_root), "--steps", "build", "--repeat", "1", "--workdir", str(tmp_path / "w"),
                  "--out", str(out), "--doc", str(doc), "--api-url", str(PREFECT_API_URL.value()),
                  "--step-timeout", "600"])
    assert rc == 0
    r = json.loads(out.read_text())
    (size,) = r["sizes"]
    assert r["command"].startswith("python -m pipelines.bench.scale --root ") and "load average" in r["uptime_start"]
    assert size["chartevents_rows"] == rep_rows(small_root) and 0 < size["eligible_stays"] <= 40
    for name in ("build", "peer_duckdb", "peer_polars"):
        st = size["steps"][name]
        assert st["status"] == "ok" and len(st["runs"]) == 1, (name, st.get("reason"))
        for run in st["runs"]:
            assert run["rc"] == 0 and 0 < run["cpu_s"] and 30 < run["peak_rss_mb"] < 4096
            assert 0 < run["compute_s"] <= run["wall_s"]
    assert set(size["steps"]["build"]["runs"][0]["cpu_phases"]) == {"stays", "scan", "hourly", "write", "hash",
                                                                    "finish"}
    assert len({run["groups"] for p in ("peer_duckdb", "peer_polars") for run in size["steps"][p]["runs"]}) == 1
    rows = _table_rows(doc.read_text())
    assert len(rows) == 4 and all(len(row) == len(rows[0]) == 11 for row in rows)
    assert [row[0] for row in rows[1:]] == [rep.STEP_TITLES[k] for k in ("build", "peer_duckdb", "peer_polars")]
    assert all(c not in ("", "–") for row in rows[1:2] for c in row)  # the build fills every column
    assert doc.read_text() == rep.render_markdown(r, "r.json")
    # the longest stay a study step processes: of its seeded --stays sample, or of every eligible stay
    from evaluation.clinical.sampling import sample_stays
    from pipelines.store import warehouse as whs

    (wpath,) = (tmp_path / "w").glob("size_*/warehouse.duckdb")
    hours = {int(x[0]): int(x[3]) for x in whs.stays(str(wpath))}
    assert bs.longest_stay(wpath, []) == max(hours.values())
    five = [hours[int(i)] for i in sample_stays(list(hours), 5, 0)]
    assert bs.longest_stay(wpath, ["--stays", "5"]) == max(five) <= max(hours.values())
    assert bs.longest_stay(tmp_path / "missing.duckdb", []) is None


def rep_rows(root: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(root / "icu" / "chartevents.parquet").metadata.num_rows


@pytest.mark.slow
def test_bench_scale_end_to_end_tiny(tmp_path):
    """20 stays through every step with the real command line (minutes on a loaded 2-core machine)."""
    out, doc = tmp_path / "out", tmp_path / "SCALE.md"
    rc = bs.main(["--stays", "20", "--repeat", "2", "--workdir", str(tmp_path / "w"), "--out", str(out),
                  "--doc", str(doc), "--gen-workers", "1", "--step-timeout", "900"])
    assert rc == 0
    r = json.loads((out / "result.json").read_text())
    (size,) = r["sizes"]
    assert size["stays_generated"] == 20 and size["eligible_stays"] > 0
    for name in ("build", "peer_duckdb", "peer_polars", "retention", "heldout", "deterioration"):
        st = size["steps"][name]
        assert st["status"] == "ok", (name, st.get("reason"))
        assert all(run["rc"] == 0 and run["cpu_s"] > 0 and run["peak_rss_mb"] > 50 for run in st["runs"])
    assert len(size["steps"]["build"]["runs"]) == 2
    g = {run["groups"] for p in ("peer_duckdb", "peer_polars") for run in size["steps"][p]["runs"]}
    assert len(g) == 1  # both peers, every round, the same groups
    assert doc.read_text() == rep.render_markdown(r, bs.source_name(out / "result.json", doc))
