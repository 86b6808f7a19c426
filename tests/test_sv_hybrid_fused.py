"""The SV hybrid layer's fused gate + readout node (`models.sv_hybrid_fused`) against the unfused path,
its reference: the same bits forward and backward, the same diagnostics, and the fall-backs."""
from __future__ import annotations

import pytest
import torch

import models.sv_hybrid_fused as fused_mod
from models.sv_hybrid import SVHybridAttention
from sv_core.batched import common
from sv_core.batched.kkt import FactorFailed

pytestmark = pytest.mark.skipif(common.batchfast is None, reason="sv_core._batchfast is not built")


def _pair(chunk, dtype=torch.float32, **kw):
    torch.manual_seed(0)
    a = SVHybridAttention(16, 2, 96, chunk=chunk, C=0.25, sigma=2.0, fista_iters=40, fused=True, **kw).to(dtype)
    b = SVHybridAttention(16, 2, 96, chunk=chunk, C=0.25, sigma=2.0, fista_iters=40, fused=False, **kw).to(dtype)
    b.load_state_dict(a.state_dict())
    return a, b


def _run(layer, x, g):
    x = x.clone().requires_grad_(True)
    y = layer(x)
    y.backward(g)
    return [y.detach(), x.grad] + [p.grad for p in layer.parameters()]


def _spy(monkeypatch):
    calls = []
    real = fused_mod._FusedHybrid.apply
    monkeypatch.setattr(fused_mod._FusedHybrid, "apply", lambda *a: calls.append(1) or real(*a))
    return calls


@pytest.mark.parametrize("T,chunk,threads,dtype", [
    (48, 24, 1, torch.float32), (96, 24, 2, torch.float32), (96, 8, 1, torch.float32), (40, 8, 2, torch.float32),
    (30, 4, 1, torch.float32),  # a first prefix of 4 keys: a warm-up row (uniform, no gradient)
    (33, 8, 1, torch.float64), (21, 16, 1, torch.float32),
])
def test_fused_node_is_the_unfused_path_bit_for_bit(T, chunk, threads, dtype, monkeypatch):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fused, ref = _pair(chunk, dtype)
        g = torch.Generator().manual_seed(T)
        x = torch.randn(5, T, 16, generator=g, dtype=dtype)
        gy = torch.randn(5, T, 16, generator=g, dtype=dtype)
        calls = _spy(monkeypatch)
        out_f, out_r = _run(fused, x, gy), _run(ref, x, gy)
        assert calls == [1]  # the fused node ran (and the reference did not)
        for a, b in zip(out_f, out_r):
            assert a.dtype == b.dtype and torch.equal(a, b)
        assert out_f[1].abs().max() > 0
        for key in ("active", "prefix", "warmup"):
            assert torch.equal(fused.last_stats[key], ref.last_stats[key]), key
        for key in ("fista_iterations", "max_box", "max_sum"):
            assert fused.last_stats[key] == ref.last_stats[key], key
        if chunk == 4:
            assert bool(fused.last_stats["warmup"].any())
        with torch.no_grad():  # scoring: no p/Z is formed, the same output
            assert torch.equal(fused(x), ref(x))
    finally:
        torch.set_num_threads(before)


def test_fused_node_falls_back_to_the_unfused_path(monkeypatch):
    fused, ref = _pair(8)
    x, gy = torch.randn(3, 40, 16), torch.randn(3, 40, 16)
    want = _run(ref, x, gy)

    def no_margin(a, C, mask, tol=None):  # a problem with keys but no margin key: rho from its KKT interval
        S, E = real_partition(a, C, mask, tol)
        S[0, 1] = False
        return S, E

    real_partition = fused_mod.partition_masks
    monkeypatch.setattr(fused_mod, "partition_masks", no_margin)
    calls = _spy(monkeypatch)
    for a, b in zip(_run(fused, x, gy), want):
        assert torch.equal(a, b)
    assert calls == []  # refused before the node
    monkeypatch.setattr(fused_mod, "partition_masks", real_partition)

    def fails(*a, **k):
        raise FactorFailed

    monkeypatch.setattr(fused_mod, "compiled_kkt_forward", fails)
    fused.zero_grad(set_to_none=True)
    for a, b in zip(_run(fused, x, gy), want):
        assert torch.equal(a, b)
    assert calls == [1]  # tried, refused by the solve, nothing recorded: the unfused path answered


def test_fused_node_is_not_taken_where_it_does_not_apply(monkeypatch):
    calls = _spy(monkeypatch)
    x = torch.randn(2, 24, 16)
    for kw in ({"kkt_solver": "cholesky"}, {"fista_backend": "torch"}, {"fused_readout": False}):
        layer, _ = _pair(8, **kw)
        layer(x)
    layer, _ = _pair(8)
    layer(x, keep=torch.ones(2, 24, dtype=torch.bool))  # a deletion mask: the reference readout
    layer(torch.randn(2, 8, 16))  # one chunk: no gate
    assert calls == []
