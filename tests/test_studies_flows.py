"""The study flows end to end through the ``forgetful`` CLI (one Prefect session)."""
from __future__ import annotations

import json

from pipelines.cli import build_parser, main


def test_study_subcommands_registered():
    text = build_parser().format_help()
    for name in ("planted-secret", "skewed-redundancy", "streaming-eviction", "selective-copying", "capacity",
                 "mqar-control", "learned-keys", "retrieval-memory"):
        assert name in text


def test_planted_secret_and_mqar_flows_write_valid_results(prefect_harness, tmp_path):
    from dashboards.schema import validate_result

    out = tmp_path / "ps.json"
    assert main(["planted-secret", "--trials", "3", "--out", str(out), "--no-progress"]) == 0
    res = json.loads(out.read_text())
    validate_result(res)
    assert res["study"] == "planted_secret"
    assert res["metrics"]["retrieved_after_exact_pct"] == 0.0
    out2 = tmp_path / "mq.json"
    assert main(["mqar-control", "--trials", "5", "--out", str(out2), "--no-progress"]) == 0
    assert json.loads(out2.read_text())["metrics"]["support_fraction"] == 1.0
