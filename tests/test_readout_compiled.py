"""Compiled hybrid readout (`models.sv_hybrid_readout.hybrid_attend_compiled`, loops in
``sv_core/_readout_body.h``) against the reference ``hybrid_weights(q, k, gate, chunk) @ v``:
values and all four gradients at float64 and float32, thread invariance, the fallback without
the extension, and the gate really being read; and the compiled backward of `rbf_gram` against
its torch backward."""
from __future__ import annotations

import pytest
import torch

from models.sv_hybrid_readout import hybrid_attend, hybrid_attend_compiled, hybrid_weights
from sv_core.batched import common as batched_common
from sv_core.batched.readout import compiled_readout_applicable, readout_forward

pytestmark = pytest.mark.skipif(not batched_common.compiled_batch_available(),
                                reason="compiled loops not built (python setup.py build_ext --inplace)")


def _inputs(T, chunk, dtype, B=2, H=2, d=4, dv=5, seed=0, gate_grad=True, zero_chunk=None):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, n, generator=g, dtype=dtype).requires_grad_(True) for n in (d, d, dv))
    nc = -(-T // chunk)
    prefix = torch.zeros(B, H, nc, T, dtype=torch.bool)
    for c in range(1, nc):
        prefix[:, :, c, : c * chunk] = True
    gate = torch.rand(B, H, nc, T, generator=g, dtype=dtype) * prefix
    if zero_chunk is not None and zero_chunk < nc:
        gate[:, :, zero_chunk] = 0.0  # every prefix gate of that chunk's queries is zero
    return q, k, v, gate.requires_grad_(gate_grad), prefix, torch.randn(B, H, T, dv, generator=g, dtype=dtype)


def _value_and_grads(f, q, k, v, gate, prefix, wout):
    y = f(q, k, v, gate)
    ins = (q, k, v, gate) if gate.requires_grad else (q, k, v)
    grads = list(torch.autograd.grad((y * wout).sum(), ins))
    if gate.requires_grad:
        grads[3] = grads[3] * prefix  # the gate is zero outside the prefixes by contract
    return [y.detach()] + grads


CASES = [(16, 4), (13, 4), (7, 8), (10, 3), (27, 2), (1, 3), (8, 8), (96, 8), (50, 7)]


@pytest.mark.parametrize("T,chunk", CASES)
@pytest.mark.parametrize("dtype,rtol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("dims", [(4, 5), (16, 16)])
def test_compiled_readout_matches_the_reference(T, chunk, dtype, rtol, dims):
    d, dv = dims
    for gate_grad, zero_chunk in ((True, None), (False, 1), (True, 2)):
        q, k, v, gate, prefix, wout = _inputs(T, chunk, dtype, d=d, dv=dv, gate_grad=gate_grad, zero_chunk=zero_chunk)
        ref = _value_and_grads(lambda *t: hybrid_weights(*t[:2], t[3], chunk) @ t[2], q, k, v, gate, prefix, wout)
        fast = _value_and_grads(lambda *t: hybrid_attend_compiled(*t, chunk), q, k, v, gate, prefix, wout)
        for name, a, b in zip(("y", "dq", "dk", "dv", "dgate"), ref, fast):
            scale = float(a.abs().max()) if a.numel() else 0.0
            err = float((a - b).abs().max()) if a.numel() else 0.0
            assert err <= rtol * max(scale, 1e-30), (name, err, scale)


def test_compiled_readout_gradcheck_and_gate_gradient_is_exercised():
    q, k, v, gate, prefix, wout = _inputs(11, 3, torch.float64, B=1, d=3, dv=2)
    assert torch.autograd.gradcheck(lambda *t: hybrid_attend_compiled(*t, 3), (q, k, v, gate), fast_mode=True)
    dgate = _value_and_grads(lambda *t: hybrid_attend_compiled(*t, 3), q, k, v, gate, prefix, wout)[4]
    assert dgate.abs().max() > 1e-3


def test_perturbing_one_gate_entry_moves_exactly_the_queries_of_its_chunk():
    q, k, v, gate, _, _ = _inputs(24, 8, torch.float64)
    with torch.no_grad():
        y0 = hybrid_attend_compiled(q, k, v, gate, 8)
        gate2 = gate.clone()
        gate2[0, 1, 2, 5] += 0.5  # chunk 2 (queries 16..23), prefix key 5
        y1 = hybrid_attend_compiled(q, k, v, gate2, 8)
    moved = (y1 - y0).abs().amax(-1)
    assert moved[0, 1, 16:].min() > 1e-6
    assert moved[0, 1, :16].max() == 0 and moved[1].max() == 0 and moved[0, 0].max() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compiled_readout_is_bit_identical_for_one_and_two_threads(dtype):
    q, k, v, gate, prefix, wout = _inputs(96, 8, dtype, B=5, H=2, d=16, dv=16)
    f = lambda *t: hybrid_attend_compiled(*t, 8)  # noqa: E731
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _value_and_grads(f, q, k, v, gate, prefix, wout)
        torch.set_num_threads(2)
        assert batched_common.compiled_threads() == 2
        two = _value_and_grads(f, q, k, v, gate, prefix, wout)
    finally:
        torch.set_num_threads(before)
    for a, b in zip(one, two):
        assert torch.equal(a, b)


def test_hybrid_attend_uses_the_compiled_loops_and_falls_back_without_them(monkeypatch):
    q, k, v, gate, prefix, wout = _inputs(48, 8, torch.float32, d=16, dv=16)  # 6 chunks: dense
    fused = _value_and_grads(lambda *t: hybrid_attend(*t, 8), q, k, v, gate, prefix, wout)
    compiled = _value_and_grads(lambda *t: hybrid_attend_compiled(*t, 8), q, k, v, gate, prefix, wout)
    assert all(torch.equal(a, b) for a, b in zip(fused, compiled))
    monkeypatch.setattr(batched_common, "batchfast", None)  # as on an install without a C compiler
    assert not compiled_readout_applicable(q, k, v, gate)
    fallback = _value_and_grads(lambda *t: hybrid_attend(*t, 8), q, k, v, gate, prefix, wout)
    from models.sv_hybrid_readout import hybrid_attend_dense

    dense = _value_and_grads(lambda *t: hybrid_attend_dense(*t, 8), q, k, v, gate, prefix, wout)
    assert all(torch.equal(a, b) for a, b in zip(fallback, dense))  # the torch path, bit for bit
    assert any(not torch.equal(a, b) for a, b in zip(fallback, compiled))  # a different summation order
    with pytest.raises(batched_common.BatchedGateError, match="not built"):
        readout_forward(q, k, v, gate, 8)


def test_compiled_readout_rejects_bad_input_and_is_not_used_for_mixed_dtypes():
    q, k, v, gate, _, _ = _inputs(9, 4, torch.float64)
    assert not compiled_readout_applicable(q.float(), k, v, gate)
    with pytest.raises(batched_common.BatchedGateError, match="gate must have shape"):
        readout_forward(q, k, v, gate[:, :, :2], 4)
    with pytest.raises(batched_common.BatchedGateError, match="one dtype"):
        readout_forward(q.float(), k, v, gate, 4)
    with pytest.raises(batched_common.BatchedGateError, match="chunk"):
        readout_forward(q, k, v, gate, 0)


# ------------------------------------------------------------------ compiled Gram backward


def _gram_grad(X, W, backend, sigma=1.7):
    X = X.detach().clone().requires_grad_(True)
    K = batched_common.rbf_gram(X, sigma, backend=backend)
    (g,) = torch.autograd.grad((K * W).sum(), X)
    return K.detach(), g


@pytest.mark.parametrize("shape", [(4, 88, 16), (2, 3, 9, 5), (3, 1, 4), (2, 17, 3)])
def test_compiled_gram_backward_matches_the_torch_backward(shape):
    g = torch.Generator().manual_seed(1)
    X = torch.randn(*shape, generator=g, dtype=torch.float64)
    if shape[-2] > 1:
        X[..., 1, :] = X[..., 0, :]  # coincident keys: D rounds below 0, the clamp's masked entries
    W = torch.randn(*shape[:-1], shape[-2], generator=g, dtype=torch.float64)
    K_ref, g_ref = _gram_grad(X, W, "torch")
    K_c, g_c = _gram_grad(X, W, "compiled")
    assert torch.equal(K_ref, K_c)  # the forward is the same torch code
    assert (g_ref - g_c).abs().max() <= 1e-12 * g_ref.abs().max()
    # float32 against the float64 gradient at printed precision, like the torch backward
    _, g32 = _gram_grad(X.float(), W.float(), "compiled")
    _, g32_ref = _gram_grad(X.float(), W.float(), "torch")
    scale = float(g_ref.abs().max()) or 1.0
    assert (g32.double() - g_ref).abs().max() <= 5e-5 * scale
    assert (g32_ref.double() - g_ref).abs().max() <= 5e-5 * scale


def test_compiled_gram_backward_thread_invariance_and_fallback(monkeypatch):
    g = torch.Generator().manual_seed(2)
    X = torch.randn(7, 40, 16, generator=g)
    W = torch.randn(7, 40, 40, generator=g)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _gram_grad(X, W, "auto")[1]
        torch.set_num_threads(2)
        two = _gram_grad(X, W, "auto")[1]
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)
    assert torch.equal(one, _gram_grad(X, W, "compiled")[1])
    assert not torch.equal(one, _gram_grad(X, W, "torch")[1])  # another summation order: really the C loop
    monkeypatch.setattr(batched_common, "batchfast", None)
    assert torch.equal(_gram_grad(X, W, "auto")[1], _gram_grad(X, W, "torch")[1])
    with pytest.raises(batched_common.BatchedGateError, match="compiled"):
        batched_common.rbf_gram(X, 1.0, backend="compiled")
    with pytest.raises(batched_common.BatchedGateError, match="backend"):
        batched_common.rbf_gram(X, 1.0, backend="cuda")
