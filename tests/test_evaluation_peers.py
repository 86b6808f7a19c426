"""The selection peers (evaluation.peers): hand-computed cases, slow references, interface."""
from __future__ import annotations

import math

import numpy as np
import pytest

from evaluation.errors import PolicyError
from evaluation.peers import (
    PEER_POLICIES,
    QUERY_FREE_PEERS,
    QUERY_PEERS,
    kernel_leverage_scores_reference,
    keydiff_scores_reference,
    leverage_scores_reference,
    snapkv_scores_reference,
)
from evaluation.policies import available_policies, get_policy


def test_leverage_hand_case():
    # X = [e1, e2, e1]: XᵀX = diag(2, 1); with λ = 1, (XᵀX + I)⁻¹ = diag(1/3, 1/2)
    X = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    np.testing.assert_allclose(get_policy("leverage", lam=1.0).score(X), [1 / 3, 1 / 2, 1 / 3], rtol=1e-14)
    # default λ = 1e-2 · tr(XᵀX)/d = 1e-2 · 3/2
    pol = get_policy("leverage")
    assert pol.ridge(X) == pytest.approx(0.015)
    np.testing.assert_allclose(pol.score(X), [1 / 2.015, 1 / 1.015, 1 / 2.015], rtol=1e-13)
    assert pol.select(X, 1).tolist() == [1]  # the unduplicated key


def test_kernel_leverage_hand_case():
    # two identical keys and one far away: K = [[1,1,0],[1,1,0],[0,0,1]] (exp(-1e4) underflows to 0)
    # K(K+λI)⁻¹ on the all-ones 2×2 block is J/(2+λ); the singleton gets 1/(1+λ)
    X = np.array([[0.0], [0.0], [100.0]])
    s = get_policy("kernel_leverage", sigma=1.0).score(X)  # λ = 1e-2 · tr(K)/n = 1e-2
    np.testing.assert_allclose(s, [1 / 2.01, 1 / 2.01, 1 / 1.01], rtol=1e-13)
    np.testing.assert_allclose(get_policy("kernel_leverage", sigma=1.0, lam=0.5).score(X), [1 / 2.5, 1 / 2.5, 1 / 1.5],
                               rtol=1e-13)


def test_keydiff_hand_case():
    # units e1, e1, e2: anchor (2/3, 1/3), ‖a‖ = √5/3 -> cos = 2/√5, 2/√5, 1/√5
    X = np.array([[2.0, 0.0], [1.0, 0.0], [0.0, 3.0]])
    s = get_policy("keydiff").score(X)
    np.testing.assert_allclose(s, [-2 / math.sqrt(5), -2 / math.sqrt(5), -1 / math.sqrt(5)], rtol=1e-14)
    assert get_policy("keydiff").select(X, 1).tolist() == [2]
    # zero key scores 0 instead of NaN
    assert np.all(np.isfinite(get_policy("keydiff").score(np.array([[0.0, 0.0], [1.0, 0.0]]))))


def test_snapkv_and_tova_hand_case():
    # 1-d keys 0, 10, 20, 30 with σ = 1: each query at a key puts (almost exactly) all mass on it
    X = np.array([[0.0], [10.0], [20.0], [30.0]])
    Q = np.array([[0.0], [20.0]])  # votes ≈ [1, 0, 1, 0]
    snap1 = get_policy("snapkv", sigma=1.0, kernel_size=1).score(X, queries=Q)
    np.testing.assert_allclose(snap1, [1, 0, 1, 0], atol=1e-40)
    mx = get_policy("snapkv", sigma=1.0, kernel_size=3, pooling="max").score(X, queries=Q)
    np.testing.assert_allclose(mx, [1, 1, 1, 1], atol=1e-40)
    av = get_policy("snapkv", sigma=1.0, kernel_size=3, pooling="avg").score(X, queries=Q)
    np.testing.assert_allclose(av, [1 / 3, 2 / 3, 1 / 3, 1 / 3], atol=1e-40)  # zero padding, /kernel_size
    # window = 1 keeps only the last observed query
    w1 = get_policy("snapkv", sigma=1.0, kernel_size=1, window=1).score(X, queries=Q)
    np.testing.assert_allclose(w1, [0, 0, 1, 0], atol=1e-40)
    tova = get_policy("tova", sigma=1.0)
    np.testing.assert_allclose(tova.score(X, queries=Q), [0, 0, 1, 0], atol=1e-40)
    assert tova.select(X, 1, queries=Q).tolist() == [2]


@pytest.mark.parametrize("pooling", ["max", "avg"])
def test_fast_paths_match_references(pooling):
    rng = np.random.default_rng(3)
    X, Q = rng.standard_normal((25, 3)), rng.standard_normal((6, 3))
    lev = get_policy("leverage")
    np.testing.assert_allclose(lev.score(X), leverage_scores_reference(X, lev.ridge(X)), atol=1e-12)
    np.testing.assert_allclose(get_policy("kernel_leverage", sigma=2.0).score(X),
                               kernel_leverage_scores_reference(X, 2.0, 1e-2), atol=1e-10)
    np.testing.assert_allclose(get_policy("keydiff").score(X), keydiff_scores_reference(X), atol=1e-14)
    np.testing.assert_allclose(get_policy("snapkv", sigma=2.0, pooling=pooling).score(X, queries=Q),
                               snapkv_scores_reference(X, Q, 2.0, 5, pooling), atol=1e-14)


def test_leverage_ranking_is_scale_free_and_sums_to_effective_dimension():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 4))
    a, b = get_policy("leverage").score(X), get_policy("leverage").score(1e3 * X)
    np.testing.assert_allclose(a, b, rtol=1e-9)
    assert 3.5 < a.sum() < 4.0  # d_λ slightly below d = 4
    assert np.all((a > 0) & (a < 1))


def test_registry_and_query_requirements():
    for name in PEER_POLICIES:
        assert name in available_policies()
    assert set(PEER_POLICIES) == set(QUERY_FREE_PEERS) | set(QUERY_PEERS)
    X = np.random.default_rng(1).standard_normal((8, 2))
    for name in QUERY_PEERS:
        pol = get_policy(name, sigma=1.0)
        assert pol.requires_queries
        with pytest.raises(PolicyError, match="query stream"):
            pol.score(X)
        with pytest.raises(PolicyError, match="d="):
            pol.score(X, queries=np.zeros((2, 3)))
    for name in QUERY_FREE_PEERS:
        pol = get_policy(name, **({"sigma": 1.0} if name == "kernel_leverage" else {}))
        assert not pol.requires_queries
        assert pol.select(X, 3).shape == (3,)


@pytest.mark.parametrize("name,kw", [
    ("leverage", {"lam_rel": 0.0}), ("leverage", {"lam": -1.0}), ("kernel_leverage", {"sigma": 0.0}),
    ("snapkv", {"sigma": 1.0, "kernel_size": 4}), ("snapkv", {"sigma": 1.0, "pooling": "median"}),
    ("snapkv", {"sigma": 1.0, "window": 0}), ("keydiff", {"eps": 0}), ("tova", {}),
])
def test_bad_parameters_raise_policy_error(name, kw):
    with pytest.raises(PolicyError):
        get_policy(name, **kw)
