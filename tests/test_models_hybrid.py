"""SV hybrid layer: readout rule, gradcheck, exact-vs-batched gate, warm-up, deletion semantics."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from models.sv_hybrid import (
    ExactHybridMemory,
    HybridDeletionError,
    SVHybridAttention,
    hybrid_weights,
    prefix_gate_batched,
    prefix_gate_exact,
)
from sv_core import Gate, refit


def test_hybrid_weights_hand_example():
    # T = 3, chunk 2: query 2 is in chunk [2, 4); prefix {0, 1} weighted by alpha = (0.25, 0.75);
    # q = 0 -> all scores 0 -> w ∝ (0.25, 0.75, 1) / 2
    q = torch.zeros(1, 1, 3, 2, dtype=torch.float64)
    k = torch.randn(1, 1, 3, 2, dtype=torch.float64)
    gate = torch.zeros(1, 1, 2, 3, dtype=torch.float64)
    gate[0, 0, 1, :2] = torch.tensor([0.25, 0.75])
    w = hybrid_weights(q, k, gate, chunk=2)[0, 0]
    assert torch.allclose(w[2], torch.tensor([0.125, 0.375, 0.5], dtype=torch.float64))
    assert torch.allclose(w[1], torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64))  # local only
    keep = torch.tensor([[True, True, True]])
    keep[0, 1] = False
    w2 = hybrid_weights(q, k, gate, chunk=2, keep=keep)[0, 0]
    assert torch.allclose(w2[2], torch.tensor([0.2, 0.0, 0.8], dtype=torch.float64))


def test_hybrid_layer_gradcheck_float64():
    torch.manual_seed(0)
    layer = SVHybridAttention(8, 2, 16, chunk=6, C=0.25, sigma=2.0, fista_iters=200,
                              fista_tol=1e-10, fista_dtype=None).double()
    x = torch.randn(1, 13, 8, dtype=torch.float64, requires_grad=True)
    layer(x)
    stats = layer.last_stats
    assert not bool(stats["warmup"].any())  # prefixes 6 and 12 are solved (threshold 6)
    assert torch.autograd.gradcheck(lambda inp: layer(inp), (x,), eps=1e-6, atol=1e-5)


def test_exact_vs_batched_gate_in_hybrid_layer(capsys):
    torch.manual_seed(1)
    B, H, T, d = 2, 2, 48, 4
    k = torch.randn(B, H, T, d, dtype=torch.float64)
    q = torch.randn(B, H, T, d, dtype=torch.float64)
    v = torch.randn(B, H, T, 3, dtype=torch.float64)
    chunk, C = 12, 0.25
    g_b, stats = prefix_gate_batched(k, chunk, C, 2.0, iters=400, tol=1e-9, fista_dtype=None)
    g_e = prefix_gate_exact(k, chunk, C, 2.0)
    dg = (g_b - g_e).abs().max().item()
    y_b = hybrid_weights(q, k, g_b, chunk) @ v
    y_e = hybrid_weights(q, k, g_e, chunk) @ v
    dy = (y_b - y_e).abs().max().item()
    with capsys.disabled():
        print(f"\n[hybrid exact vs batched] max|dalpha|={dg:.3e} max|doutput|={dy:.3e}")
    assert dg < 5e-3 and dy < 5e-3
    assert dg > 0  # the ridge makes them differ: a real comparison
    # the layer's exact mode is the same computation
    layer = SVHybridAttention(8, 2, T, chunk=chunk, C=C, gate="exact").double()
    x = torch.randn(1, T, 8, dtype=torch.float64)
    layer.gate_mode = "batched"
    layer.fista_iters, layer.fista_tol, layer.fista_dtype = 400, 1e-9, None
    yb = layer(x)
    layer.gate_mode = "exact"
    ye = layer(x)
    assert (yb - ye).abs().max() < 5e-3


def test_warmup_prefixes_are_uniform():
    torch.manual_seed(2)
    k = torch.randn(1, 1, 12, 3, dtype=torch.float64)
    # chunk 2, C = 0.25: threshold 6 -> prefixes 2, 4 ungated (uniform), 6, 8, 10 solved
    g, stats = prefix_gate_batched(k, 2, 0.25, 2.0, iters=300, fista_dtype=None)
    assert stats["warmup"].tolist() == [True, True, False, False, False]
    assert torch.allclose(g[0, 0, 1, :2], torch.full((2,), 0.5, dtype=torch.float64))
    assert torch.allclose(g[0, 0, 2, :4], torch.full((4,), 0.25, dtype=torch.float64))
    alpha, _ = refit(k[0, 0, :6].numpy(), C=0.25, sigma=2.0)
    assert np.abs(g[0, 0, 3, :6].numpy() - alpha).max() < 5e-3


def _memory(T=24, chunk=8, C=0.25, seed=3):
    rng = np.random.default_rng(seed)
    q, k, v = rng.normal(size=(1, T, 3)), rng.normal(size=(1, T, 3)), rng.normal(size=(1, T, 2))
    return ExactHybridMemory(q, k, v, chunk, C, 2.0), q, k, v


def test_forget_long_range_token_equals_fresh_retained_solve():
    mem, q, k, v = _memory()
    p = 3  # admitted to the gates of chunks 1 and 2 (prefixes 8 and 16)
    rec = mem.forget(p)
    assert sorted(rec.certified_gates) == [(0, 1), (0, 2)] and rec.local_masked
    W = mem.weights()[0]
    assert torch.all(W[:, p] == 0.0)  # no query reads the deleted token any more
    # reference: same layer on the sequence without position p, gates solved from scratch
    for j, s in ((1, 8), (2, 16)):
        keep = [i for i in range(s) if i != p]
        alpha, _ = refit(k[0, keep], C=0.25, sigma=2.0)
        g = mem.gates[(0, j)]
        np.testing.assert_allclose(np.asarray(g.alpha), alpha, atol=1e-7)
    # readout of a chunk-2 query matches a direct fp64 computation
    t = 20
    alpha, _ = refit(k[0, [i for i in range(16) if i != p]], C=0.25, sigma=2.0)
    idx = [i for i in range(16) if i != p] + list(range(16, t + 1))
    mult = np.concatenate([alpha, np.ones(t + 1 - 16)])
    sc = k[0, idx] @ q[0, t] / math.sqrt(3)
    w = np.exp(sc - sc.max()) * mult
    w /= w.sum()
    np.testing.assert_allclose(mem.readout()[0, t].numpy(), w @ v[0, idx], atol=1e-7)


def test_forget_current_chunk_token_masks_and_renormalises():
    mem, q, k, v = _memory()
    before = mem.weights()[0].clone()
    p = 21  # in the last chunk [16, 24): not admitted to any gate
    rec = mem.forget(p)
    assert rec.certified_gates == [] and rec.local_masked
    after = mem.weights()[0]
    assert torch.allclose(after[:p], before[:p])  # earlier queries untouched
    for t in range(p, 24):
        expect = before[t].clone()
        expect[p] = 0.0
        assert torch.allclose(after[t], expect / expect.sum(), atol=1e-14)
    with pytest.raises(HybridDeletionError):
        mem.forget(p)
    with pytest.raises(HybridDeletionError):
        mem.forget(99)


def test_forget_below_warmup_retires_gate_without_certificate():
    # chunk 6, C = 0.25 (threshold 6): the prefix-6 gate drops to 5 keys -> ungated, flagged
    mem, q, k, v = _memory(T=12, chunk=6)
    assert (0, 1) in mem.gates
    rec = mem.forget(0)
    assert rec.warmup_gates == [(0, 1)] and rec.certified_gates == []
    W = mem.weights()[0]
    t = 8  # prefix {1..5} read ungated: alpha = 1/5 each
    sc = k[0, : t + 1] @ q[0, t] / math.sqrt(3)
    mult = np.array([0.0] + [0.2] * 5 + [1.0] * (t + 1 - 6))
    w = np.exp(sc - sc.max()) * mult
    np.testing.assert_allclose(W[t, : t + 1].numpy(), w / w.sum(), atol=1e-12)


def test_layer_freeze_builds_exact_memory_matching_exact_mode():
    torch.manual_seed(4)
    layer = SVHybridAttention(8, 2, 24, chunk=8, C=0.25, gate="exact").double()
    x = torch.randn(1, 24, 8, dtype=torch.float64)
    mem = layer.freeze(x)
    q, k, v = layer.io.split(x)
    ref = hybrid_weights(q, k, prefix_gate_exact(k, 8, 0.25, 2.0), 8) @ v
    assert torch.allclose(mem.readout(), ref[0], atol=1e-7)
    assert isinstance(mem.gates[(1, 2)], Gate)


# ------------------------------------------------------------------ fast paths vs references


@pytest.mark.parametrize("T,chunk", [(16, 4), (13, 4), (7, 8), (10, 3), (27, 2), (1, 3)])
def test_fast_readouts_match_the_dense_reference(T, chunk):
    from models.sv_hybrid import hybrid_attend, hybrid_attend_chunked, hybrid_attend_dense

    torch.manual_seed(5)
    B, H, d = 2, 2, 4
    q, k, v = (torch.randn(B, H, T, d, dtype=torch.float64, requires_grad=True) for _ in range(3))
    nc = -(-T // chunk)
    prefix = torch.zeros(B, H, nc, T, dtype=torch.bool)
    for c in range(1, nc):
        prefix[:, :, c, : c * chunk] = True
    gate = (torch.rand(B, H, nc, T, dtype=torch.float64) * prefix).requires_grad_(True)
    w = torch.randn(B, H, T, d, dtype=torch.float64)
    res = {}
    paths = {"ref": lambda *t: hybrid_attend(*t, chunk, fused=False), "fused": lambda *t: hybrid_attend(*t, chunk),
             "chunked": lambda *t: hybrid_attend_chunked(*t, chunk), "dense": lambda *t: hybrid_attend_dense(*t, chunk)}
    for name, f in paths.items():
        y = f(q, k, v, gate)
        grads = torch.autograd.grad((y * w).sum(), (q, k, v, gate))
        res[name] = (y.detach(),) + grads[:3] + (grads[3] * prefix,)
    for name in ("fused", "chunked", "dense"):
        for ref, fast in zip(res["ref"], res[name]):
            assert torch.allclose(ref, fast, atol=1e-12, rtol=0), name
    if nc > 1:
        assert res["dense"][4].abs().max() > 1e-3  # the gate gradient is really exercised
    for name in ("chunked", "dense"):
        assert torch.autograd.gradcheck(paths[name], (q, k, v, gate), fast_mode=True)


def test_fast_layer_equals_reference_layer_values_and_gradients():
    torch.manual_seed(6)
    kw = dict(chunk=6, C=0.25, sigma=2.0, fista_iters=200, fista_tol=1e-10, fista_dtype=None)
    fast = SVHybridAttention(8, 2, 24, **kw).double()
    ref = SVHybridAttention(8, 2, 24, kkt_solver="lu", fused_readout=False, **kw).double()
    ref.load_state_dict(fast.state_dict())
    x = torch.randn(2, 20, 8, dtype=torch.float64, requires_grad=True)
    out = {}
    for name, layer in (("fast", fast), ("ref", ref)):
        y = layer(x)
        (gx,) = torch.autograd.grad(y.square().sum(), x)
        out[name] = (y.detach(), gx)
    assert torch.allclose(out["fast"][0], out["ref"][0], atol=1e-10, rtol=0)
    assert torch.allclose(out["fast"][1], out["ref"][1], atol=1e-9, rtol=0)
    with pytest.raises(Exception, match="kkt_solver"):
        SVHybridAttention(8, 2, 24, kkt_solver="qr")


def test_layer_rejects_unknown_solver_and_backend_names():
    from models.multihead import AttentionConfigError
    from models.sv_hybrid import SVHybridAttention

    with pytest.raises(AttentionConfigError, match="kkt_solver"):
        SVHybridAttention(8, 2, chunk=4, kkt_solver="qr")
    with pytest.raises(AttentionConfigError, match="fista_backend"):
        SVHybridAttention(8, 2, chunk=4, fista_backend="fortran")
    for backend in ("auto", "torch", "compiled"):
        assert SVHybridAttention(8, 2, chunk=4, fista_backend=backend).fista_backend == backend
