"""The deletion-latency study writes a valid, report-ready result with measured timings."""
from __future__ import annotations

import json

import pytest

from dashboards.schema import validate_result


@pytest.mark.parametrize("with_osqp", [True, False])
def test_bench_delete_flow_writes_valid_result(prefect_harness, tmp_path, monkeypatch, with_osqp):
    import sys

    from pipelines.flows.bench_delete_flow import bench_delete_flow

    if not with_osqp:  # the optional peer is absent (the default install): null, never NaN
        monkeypatch.setitem(sys.modules, "osqp", None)
    r = bench_delete_flow(sizes=(40,), deletions=4, seed=0, runs_dir=str(tmp_path))
    saved = json.loads((tmp_path / "deletion_latency" / "result.json").read_text())
    validate_result(saved)
    (row,) = saved["tables"][0]["rows"]
    assert row[0] == 40
    cols = saved["tables"][0]["columns"]
    val = dict(zip(cols, row))
    # the deletion and every peer were measured on the same retained keys
    assert val["active deletion"] > 0 and val["project refit"] > 0 and val["scikit-learn OCSVM"] > 0
    assert val["q25"] <= val["active deletion"] <= val["q75"]
    assert val["one-key admission"] > 0 and val["fallbacks"] == 0
    from sv_core import fast_path_available

    if fast_path_available():  # the twin gate ran the NumPy reference loop on the same deletions
        assert val["NumPy reference loop"] > 0 and val["× reference"] > 0
    if not with_osqp:
        assert val["warm OSQP"] is None and val["× warm OSQP"] is None
    assert r["metrics"]["n40"]["count"] == 4


def test_throughput_flow_writes_valid_result(prefect_harness, tmp_path):
    from pipelines.flows.throughput_flow import ThroughputSettings, throughput_flow

    r = throughput_flow(runs_dir=str(tmp_path), settings=ThroughputSettings(batch=2, repeats=1, warmup=0, block=64,
                                                                            d_model=32, n_layers=1, n_heads=2))
    saved = json.loads((tmp_path / "throughput" / "result.json").read_text())
    validate_result(saved)
    m = saved["metrics"]
    assert m["softmax_tokens_per_s"] > 0 and m["hybrid_tokens_per_s"] > 0
    assert abs(m["ratio"] - m["softmax_tokens_per_s"] / m["hybrid_tokens_per_s"]) < 1e-9 * m["ratio"]
    assert r["config"]["block"] == 64
