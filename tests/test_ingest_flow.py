"""``forgetful ingest`` as a Prefect flow (CLI), its study result, and the served deployment."""
from __future__ import annotations

import json
import shutil

import pytest

from cohort.incremental.replay import make_replay


@pytest.fixture(scope="module")
def replay_parts(tmp_path_factory):
    from cohort.synthetic import generate

    d = tmp_path_factory.mktemp("flowsyn")
    generate(d / "mimic", stays=10, seed=4, fmt="parquet")
    return d / "root", make_replay("mimic", d / "mimic", d / "root", d / "parts", 3, align=True)


def test_cli_init_then_increments(prefect_harness, replay_parts, tmp_path, capsys):
    from dashboards.schema import validate_result
    from pipelines.cli import main

    root, parts = replay_parts
    wh, runs = tmp_path / "stream.duckdb", tmp_path / "runs"
    shutil.copy(parts[0], root / "icu" / parts[0].name)
    js = tmp_path / "out.json"
    base = ["ingest", "--source", "mimic", "--root", str(root), "--warehouse", str(wh), "--runs", str(runs),
            "--json", str(js)]
    assert main(base + ["--init"]) == 0
    first = json.loads(js.read_text())
    assert first["steps"] == 1 and first["tokens_admitted"] == first["n_tokens"] > 0
    # one human line on the console (the JSON goes to --json PATH only)
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("ingest: 1 new file(s), ") and f"{first['stays_touched']:,} stays touched" in line
    assert f"{first['tokens_admitted']:,} tokens admitted" in line and " re-admissions" in line, line
    assert main(base + ["--init"]) != 0  # a second --init is refused, nothing changed
    for i, p in enumerate(parts[1:]):
        shutil.copy(p, root / "icu" / p.name)
        assert main(base + (["--final"] if i == len(parts) - 2 else [])) == 0
    out = json.loads(js.read_text())
    assert out["steps"] == 1 and out["future_safe_stays"] == out["n_stays"] > 0
    capsys.readouterr()
    assert main(base) == 0  # nothing new: says so, in one line
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith(f"ingest: nothing new ({len(parts)} files known, 0 hashed); "), line
    assert json.loads(js.read_text())["steps"] == 0
    res = json.loads((runs / "ingest" / "result.json").read_text())
    validate_result(res)
    assert res["study"] == "ingest" and res["data"] == "synthetic"
    assert 0 < res["metrics"]["certified_retention"] < 1
    ser = res["metrics"]["stream_series"]  # the warehouse's per-step series, not just this run's steps
    assert ser["step"] == list(range(1, len(parts) + 1))
    assert ser["hours_admitted"][-1] == res["metrics"]["n_tokens"] and ser["n_hot"][-1] == res["metrics"]["n_hot"]
    assert all(h + c == n for h, c, n in zip(ser["n_hot"], ser["n_cold"], ser["hours_admitted"]))


def test_serve_registers_ingest_on_an_interval():
    from pipelines.flows.serve_cli import IngestSchedule, build_deployments, describe

    deps = describe(build_deployments(ingest=IngestSchedule("/data/mimic", interval_s=120)))
    ing = [d for d in deps if d["name"] == "forgetful-ingest"]
    assert ing and ing[0]["interval_s"] == [120.0] and ing[0]["concurrency_limit"] == 1
    assert ing[0]["parameters"]["root"] == "/data/mimic"
    assert not [d for d in describe(build_deployments()) if d["name"] == "forgetful-ingest"]
