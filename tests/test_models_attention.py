"""Attention variants, backbone and clinical classifiers: causality, references, shapes."""
from __future__ import annotations

import pytest
import torch

from models.attn_deltanet import deltanet_chunked
from models.attn_linear import linear_attention, linear_attention_naive
from models.backbone import ATTENTION, GPT, GPTConfig, make_attention
from models.deltanet_naive import deltanet_naive
from models.lstm import LSTMClassifier
from models.multihead import AttentionConfigError, window_mask
from models.sequence_classifier import CausalSequenceClassifier

VARIANT_KW = {
    "softmax": {},
    "sliding": {"window": 5},
    "linear": {},
    "deltanet": {"chunk": 4},
    "sv_hybrid": {"chunk": 4, "C": 0.25, "sigma": 2.0, "fista_iters": 60},
}


@pytest.mark.parametrize("name", sorted(ATTENTION))
def test_every_attention_is_causal(name):
    torch.manual_seed(0)
    attn = make_attention(name, 16, 2, 32, **VARIANT_KW[name]).double()
    x = torch.randn(2, 20, 16, dtype=torch.float64)
    y = attn(x)
    t0 = 13
    x2 = x.clone()
    x2[:, t0:] += torch.randn_like(x2[:, t0:])
    y2 = attn(x2)
    assert torch.allclose(y[:, :t0], y2[:, :t0], atol=1e-12), name
    assert (y[:, t0:] - y2[:, t0:]).abs().max() > 1e-6  # later outputs do see the change


def test_sliding_window_mask_hand_values():
    m = window_mask(4, 2)
    assert m.tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [False, True, True, False],
        [False, False, True, True],
    ]
    with pytest.raises(AttentionConfigError):
        window_mask(4, 0)


def test_sliding_window_equals_softmax_when_window_covers_sequence():
    torch.manual_seed(1)
    sw = make_attention("sliding", 16, 2, 32, window=32)
    sm = make_attention("softmax", 16, 2, 32)
    sm.load_state_dict(sw.state_dict())
    x = torch.randn(2, 12, 16)
    assert torch.allclose(sw(x), sm(x), atol=1e-6)


def test_deltanet_chunked_matches_naive():
    torch.manual_seed(2)
    B, H, T, d = 2, 3, 23, 8
    q = torch.randn(B, H, T, d, dtype=torch.float64)
    k = torch.nn.functional.normalize(torch.randn(B, H, T, d, dtype=torch.float64), dim=-1)
    v = torch.randn(B, H, T, 5, dtype=torch.float64)
    beta = torch.rand(B, H, T, dtype=torch.float64)
    ref = deltanet_naive(q, k, v, beta)
    for chunk in (1, 4, 7, 64):
        assert torch.allclose(deltanet_chunked(q, k, v, beta, chunk), ref, atol=1e-10)


def test_deltanet_single_step_hand_value():
    # one step: S = beta v k^T, o = S q = beta v (k.q)
    k = torch.tensor([[[[1.0, 0.0]]]])
    q = torch.tensor([[[[0.5, 2.0]]]])
    v = torch.tensor([[[[3.0]]]])
    beta = torch.tensor([[[0.5]]])
    assert torch.allclose(deltanet_naive(q, k, v, beta), torch.tensor([[[[0.75]]]]))


def test_linear_attention_parallel_matches_recurrence():
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 2, 15, 6, dtype=torch.float64) for _ in range(3))
    assert torch.allclose(linear_attention(q, k, v), linear_attention_naive(q, k, v), atol=1e-10)


def test_backbone_parameter_count_and_tied_head():
    m = GPT(GPTConfig())
    assert m.num_params() == 3_225_088  # 3.22M (nanoGPT count, position embedding excluded)
    assert m.head.weight is m.wte.weight
    idx = torch.randint(0, 256, (2, 16))
    logits, loss = m(idx, torch.roll(idx, 1, dims=1))
    assert logits.shape == (2, 16, 256)
    assert 4.0 < float(loss.detach()) < 7.0  # roughly log(256) = 5.55 at init


def test_backbone_rejects_long_sequences_and_unknown_attention():
    with pytest.raises(AttentionConfigError):
        GPT(GPTConfig(attention="nope"))
    m = GPT(GPTConfig(block_size=8, d_model=16, n_layers=1, n_heads=2))
    with pytest.raises(AttentionConfigError):
        m(torch.zeros(1, 9, dtype=torch.long))


@pytest.mark.parametrize(
    "model",
    [
        lambda: LSTMClassifier(5, hidden=8),
        lambda: CausalSequenceClassifier(5, "softmax", d_model=16, n_heads=2, n_layers=1, max_len=64),
        lambda: CausalSequenceClassifier(
            5, "sv_hybrid", d_model=16, n_heads=2, n_layers=1, max_len=64,
            attn_kwargs={"chunk": 4, "C": 0.25, "sigma": 2.0},
        ),
    ],
)
def test_clinical_classifiers_shape_and_causality(model):
    torch.manual_seed(4)
    net = model().double()
    x = torch.randn(3, 24, 5, dtype=torch.float64)
    y = net(x)
    assert y.shape == (3, 24)
    x2 = x.clone()
    x2[:, 17:] = 0.0
    assert torch.allclose(net(x2)[:, :17], y[:, :17], atol=1e-12)
