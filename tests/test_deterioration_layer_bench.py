"""The layer bench of the deterioration study (`evaluation.clinical.deterioration_layer_bench`) and the
byte-maximum bool check its measurements led to (`sv_core.batched.common.any_true`)."""
from __future__ import annotations

import json

import pytest
import torch
from doc_blocks import assert_block_renders

from evaluation.clinical import deterioration_layer_bench as lb
from evaluation.clinical import deterioration_models as dm
from sv_core.batched import common


@pytest.mark.parametrize("shape", [(0,), (5,), (3, 4), (2, 3, 7)])
def test_any_true_is_bool_any(shape):
    g = torch.Generator().manual_seed(sum(shape))
    for p in (0.0, 0.05, 0.5, 1.0):
        t = torch.rand(shape, generator=g) < p
        views = [t]
        if t.dim() >= 2:
            views += [t.transpose(0, 1), t[:, ::2]]
        if t.numel():
            views.append(t.reshape(-1)[:1].expand(6))  # a stride-0 view
        for v in views:
            assert common.any_true(v) is bool(v.any()), (shape, p)
    with pytest.raises(TypeError):  # the bytes of a float are not a mask: refused, not misread
        common.any_true(torch.ones(3, dtype=torch.float32))


def test_timed_loops_counts_the_compiled_calls_and_restores_the_module():
    if common.batchfast is None:
        pytest.skip("sv_core._batchfast is not built")
    ext = common.batchfast
    layer = lb.attention_layer("sv_attention", {"chunk": 8})
    x = torch.randn(4, 24, 32, requires_grad=True)
    g = torch.randn(4, 24, 32)
    s, loops = lb.time_layer(layer, x, g, reps=2)
    assert common.batchfast is ext  # the real module is back
    # a chunk-8 gate on 24 hours solves prefixes of 8 and 16 keys: every loop of a training step ran
    assert set(loops) == set(lb.LOOPS) and all(v > 0 for v in loops.values())
    assert sum(loops.values()) < s  # the loops are a part of the pass
    _, none = lb.time_layer(lb.attention_layer("softmax", {}), x, g, reps=1)
    assert none == {}
    # an error inside the block still puts the module back
    with pytest.raises(KeyError), lb.timed_loops({}):
        {}["missing"]
    assert common.batchfast is ext


def test_layer_bench_pairs_rounds_and_renders_its_result(tmp_path, monkeypatch):
    before = torch.get_num_threads()
    out = lb.bench(["softmax", "sv_attention:chunk=8"], lengths=(16, 24), threads=(1, 2), rounds=2, reps=1, warmup=1)
    assert torch.get_num_threads() == before  # the process's thread count is put back
    assert out["lengths"] == [16, 24] and out["threads"] == [1, 2]
    assert out["sizes"]["sv_attention:chunk=8"]["chunk"] == 8
    for t in ("1", "2"):
        for T in ("16", "24"):
            row = out["summary"][t][T]
            base, sv = out["times_ms"][t][T]["softmax"], out["times_ms"][t][T]["sv_attention:chunk=8"]
            assert len(base) == len(sv) == 2 and min(base + sv) > 0
            ratios = sorted(a / b for a, b in zip(sv, base))
            assert row["sv_attention:chunk=8"]["paired_ratio"]["min"] == ratios[0]
            assert row["softmax"]["paired_ratio"] == {"median": 1.0, "min": 1.0, "max": 1.0}
            assert row["softmax"]["loops_median_ms"] == {} and row["softmax"]["around_loops_median_ms"] is None
            if common.batchfast is not None:
                per = row["sv_attention:chunk=8"]["loops_median_ms"]
                assert list(per) == [k for k in lb.LOOPS if k in per] and per["fista"] > 0
                loops = [sum(lp.values()) for lp in out["loops_ms"][t][T]["sv_attention:chunk=8"]]
                assert all(0 < a < b for a, b in zip(loops, sv))
    path = tmp_path / "lb.json"
    path.write_text(json.dumps(out))
    readme = tmp_path / "COMMANDS.md"
    readme.write_text(f"intro\n{lb.BEGIN}\nold\n{lb.END}\noutro\n")
    assert lb.main(["--table", str(path), "--readme", str(readme)]) == 0
    doc = readme.read_text()
    assert doc.startswith("intro\n") and doc.endswith("outro\n") and "old" not in doc and lb.markdown(out) in doc
    s = out["summary"]["2"]["24"]["softmax"]
    spread = f"{s['median_ms']:.2f} ({s['min_ms']:.2f}–{s['max_ms']:.2f})"
    row = f"| 2 | 24 | `softmax` | {spread} | 1.00× (1.00–1.00) | – | – |"
    assert row in doc
    # without the compiled loops the layers run their torch paths and nothing is counted
    monkeypatch.setattr(common, "batchfast", None)
    bare = lb.bench(["softmax", "sv_attention"], lengths=(24,), rounds=1, reps=1, warmup=1)
    assert bare["summary"]["1"]["24"]["sv_attention"]["loops_median_ms"] == {}


@pytest.mark.parametrize("argv", [["--models", "softmax", "lstm"], ["--models", "softmax", "softmax"],
                                  ["--models", "sv_attention:chunk=0"]])
def test_layer_bench_refuses_a_model_without_attention_in_one_line(argv, capsys):
    assert lb.main([*argv, "--rounds", "1", "--reps", "1", "--lengths", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("deterioration_layer_bench: ") and "\n" not in err


def test_layer_bench_usage_errors_exit_before_timing():
    for argv in (["--lengths", "0"], ["--lengths", "97"], ["--rounds", "0"], ["--readme", "x.md"]):
        with pytest.raises(SystemExit) as e:
            lb.main(argv)
        assert e.value.code == 2


def test_commands_layer_table_is_the_rendering_of_its_result():
    out = assert_block_renders(lb.README_RESULT, lb.BEGIN, lb.END, lb.markdown)
    assert out["sizes"]["sv_attention"] == dm.DEFAULT_SIZE  # the study's own size is the row named sv_attention
