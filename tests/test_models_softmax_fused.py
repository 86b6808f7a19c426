"""torch's fused causal attention (the throughput benchmark's strongest softmax peer) computes the
unfused masked reference: same outputs and gradients to float32 rounding."""
from __future__ import annotations

import torch

from models.attn_softmax import CausalSoftmaxAttention
from models.backbone import GPT, GPTConfig


def test_fused_softmax_is_the_unfused_reference():
    torch.manual_seed(0)
    ref, fused = CausalSoftmaxAttention(64, 4), CausalSoftmaxAttention(64, 4, fused=True)
    fused.load_state_dict(ref.state_dict())
    x = torch.randn(3, 37, 64)
    xr, xf = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    yr, yf = ref(xr), fused(xf)
    assert torch.allclose(yf, yr, atol=1e-5, rtol=0)
    g = torch.randn_like(yr)
    (yr * g).sum().backward()
    (yf * g).sum().backward()
    assert torch.allclose(xf.grad, xr.grad, atol=1e-5, rtol=0)
    # causal: a change to the last position leaves every earlier output as it was
    x2 = x.clone()
    x2[:, -1] += 1.0
    assert torch.allclose(fused(x2)[:, :-1], fused(x)[:, :-1], atol=1e-6, rtol=0)
    assert not torch.allclose(fused(x2)[:, -1], fused(x)[:, -1], atol=1e-3)


def test_the_fused_flag_reaches_the_layers():
    m = GPT(GPTConfig(d_model=32, n_layers=2, n_heads=2, block_size=16, attention="softmax",
                      attn_kwargs={"fused": True}))
    assert [blk.attn.fused for blk in m.blocks] == [True, True]
    plain = GPT(GPTConfig(d_model=32, n_layers=1, n_heads=2, block_size=16))
    assert [blk.attn.fused for blk in plain.blocks] == [False]
