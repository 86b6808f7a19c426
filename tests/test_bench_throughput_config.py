"""The throughput benchmark times the language-model study's configuration, not a neighbour of it."""
from __future__ import annotations

import pytest
import torch

from evaluation.studies import language_model as lm
from models.bench_throughput import build_models, run_benchmark
from models.sv_hybrid import SVHybridAttention

#: every setting of the SV layer that changes what a training step computes or how fast
SETTINGS = ("chunk", "C", "sigma", "fista_iters", "fista_tol", "ridge", "gate_mode", "fista_dtype", "kkt_solver",
            "fused_readout", "fista_backend")


def _layers(model) -> list[SVHybridAttention]:
    return [m for m in model.modules() if isinstance(m, SVHybridAttention)]


def _settings(layer: SVHybridAttention) -> dict:
    return {k: getattr(layer, k) for k in SETTINGS}


def test_the_benchmark_hybrid_is_the_language_model_study_configuration():
    cfg = lm.LMConfig()
    study = lm.build_model(cfg, "sv_hybrid")
    bench = build_models(block=cfg.block, d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads)
    ours, theirs = _layers(bench["hybrid"]), _layers(study)
    assert len(ours) == len(theirs) == cfg.n_layers
    assert [_settings(a) for a in ours] == [_settings(b) for b in theirs]
    # the same shapes: the 3.22M non-embedding parameters of the paper's comparison
    assert bench["hybrid"].num_params() == study.num_params() == bench["softmax"].num_params()
    # a bench option that leaves the study's configuration is visible in the settings (the test can fail)
    other = build_models(block=cfg.block, d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
                         kkt_solver="cholesky")
    assert _settings(_layers(other["hybrid"])[0]) != _settings(theirs[0])


def test_the_benchmark_records_what_it_ran():
    res = run_benchmark(batch=2, block=32, warmup=0, repeats=1, d_model=32, n_layers=1, n_heads=2)
    assert res["kkt_solver"] == "auto" and res["fista_backend"] == "auto" and res["fista_tol"] == 1e-4
    assert set(res["compiled_loops"]) == {"built", "openmp"}
    assert res["threads"] == torch.get_num_threads()
    assert {k: len(v) for k, v in res["step_seconds"].items()} == {"softmax": 1, "softmax_fused": 1, "hybrid": 1}
    assert res["ratio_vs_fused"] == pytest.approx(res["softmax_fused_tokens_per_s"] / res["hybrid_tokens_per_s"])


def test_the_documented_throughput_table_is_rendered_from_the_result_files():
    import json
    from pathlib import Path

    from models import bench_throughput as bench

    root = Path(__file__).resolve().parents[1]
    text = bench.markdown([json.loads((root / f).read_text()) for f in bench.README_RESULTS])
    doc = (root / "docs" / "COMMANDS.md").read_text()
    assert f"{bench.BEGIN}\n{text}\n{bench.END}" in doc
    command = f"python -m models.bench_throughput --table {' '.join(bench.README_RESULTS)} --readme docs/COMMANDS.md"
    assert command in doc
