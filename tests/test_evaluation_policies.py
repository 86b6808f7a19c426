"""Selection policies: hand-computed scores, deterministic tie-breaking, SV top-k = support set."""
from __future__ import annotations

import math

import numpy as np
import pytest

from evaluation.errors import PolicyError, UnknownPolicyError
from evaluation.policies import (
    DensityPolicy,
    OracleAttentionPolicy,
    RandomPolicy,
    RecencyPolicy,
    SupportVectorPolicy,
    available_policies,
    density_scores_reference,
    get_policy,
    oracle_scores_reference,
    select_top_k,
    select_top_k_reference,
)

E = math.e


# ---------------------------------------------------------------- select_top_k
def test_select_top_k_breaks_ties_by_ascending_index():
    assert select_top_k([1.0, 2.0, 2.0, 2.0, 0.0], 2).tolist() == [1, 2]
    assert select_top_k([0.0, 0.0, 0.0, 0.0], 2).tolist() == [0, 1]
    assert select_top_k([3.0, 1.0, 3.0, 5.0], 3).tolist() == [0, 2, 3]
    # returned in temporal (ascending) order, not score order
    assert select_top_k([0.1, 0.9, 0.5], 2).tolist() == [1, 2]


def test_select_top_k_edges_and_errors():
    assert select_top_k([1.0, 2.0], 0).tolist() == []
    assert select_top_k([1.0, 2.0], 2).tolist() == [0, 1]
    with pytest.raises(PolicyError, match="0 <= k <= n"):
        select_top_k([1.0, 2.0], 3)
    with pytest.raises(PolicyError, match="integer"):
        select_top_k([1.0, 2.0], 1.5)
    with pytest.raises(PolicyError, match="NaN"):
        select_top_k([1.0, float("nan")], 1)
    with pytest.raises(PolicyError, match="shape"):
        select_top_k([[1.0, 2.0]], 1)


def test_select_top_k_matches_reference_with_many_ties():
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(1, 30))
        s = rng.integers(0, 4, size=n).astype(float)  # heavy ties
        k = int(rng.integers(0, n + 1))
        np.testing.assert_array_equal(select_top_k(s, k), select_top_k_reference(s, k))


# ---------------------------------------------------------------- density
def test_density_on_four_points_by_hand():
    # 1-D points 0, 1, 2, 10 with sigma = 1: kappa = exp(-d^2)
    X = np.array([[0.0], [1.0], [2.0], [10.0]])
    s = DensityPolicy(sigma=1.0).score(X)
    expected = [E**-1 + E**-4, 2 * E**-1, E**-1 + E**-4, E**-64 + E**-81 + E**-100]
    np.testing.assert_allclose(s, expected, rtol=1e-12, atol=1e-300)
    assert DensityPolicy(1.0).select(X, 1).tolist() == [1]  # densest point
    assert DensityPolicy(1.0).select(X, 3).tolist() == [0, 1, 2]  # the outlier goes first


def test_density_matches_slow_reference():
    X = np.random.default_rng(0).normal(size=(17, 3))
    np.testing.assert_allclose(DensityPolicy(1.7).score(X), density_scores_reference(X, 1.7), rtol=1e-12)


# ---------------------------------------------------------------- oracle
def test_oracle_attention_mass_by_hand():
    X = np.array([[0.0], [1.0]])
    s = OracleAttentionPolicy(sigma=1.0).score(X, queries=np.array([[0.0]]))
    np.testing.assert_allclose(s, [1 / (1 + E**-1), E**-1 / (1 + E**-1)], rtol=1e-12)
    # two queries sitting on the keys: by symmetry each key gets the same total mass 1
    s2 = OracleAttentionPolicy(sigma=1.0).score(X, queries=X)
    np.testing.assert_allclose(s2, [1.0, 1.0], rtol=1e-12)


def test_oracle_matches_reference_and_needs_queries():
    rng = np.random.default_rng(1)
    X, Q = rng.normal(size=(12, 2)), rng.normal(size=(5, 2))
    np.testing.assert_allclose(OracleAttentionPolicy(1.3).score(X, queries=Q), oracle_scores_reference(X, Q, 1.3),
                               rtol=1e-12)
    with pytest.raises(PolicyError, match="queries"):
        OracleAttentionPolicy(1.0).score(X)
    with pytest.raises(PolicyError, match="d="):
        OracleAttentionPolicy(1.0).score(X, queries=np.zeros((2, 3)))
    assert OracleAttentionPolicy.requires_queries and not DensityPolicy.requires_queries


# ---------------------------------------------------------------- recency / random
def test_recency_keeps_last_k():
    X = np.zeros((5, 2))  # identical keys: recency must not care about content
    assert RecencyPolicy().select(X, 2).tolist() == [3, 4]
    assert RecencyPolicy().score(X).tolist() == [0, 1, 2, 3, 4]


def test_random_is_seeded_uniform_and_uses_given_rng():
    X = np.zeros((4, 1))
    p = RandomPolicy(seed=7)
    assert p.select(X, 2).tolist() == p.select(X, 2).tolist()  # same seed, same draw
    np.testing.assert_array_equal(p.score(X), np.random.default_rng(7).random(4))
    rng = np.random.default_rng(11)
    counts = np.zeros(4)
    for _ in range(4000):
        kept = p.select(X, 2, rng=rng)
        assert len(set(kept.tolist())) == 2
        counts[kept] += 1
    np.testing.assert_allclose(counts / 4000, 0.5, atol=0.04)  # each index kept w.p. k/n


# ---------------------------------------------------------------- registry
def test_registry_names_aliases_and_errors():
    assert available_policies() == ["density", "kernel_leverage", "keydiff", "leverage", "oracle", "random", "recency",
                                    "snapkv", "sv", "tova"]
    assert isinstance(get_policy("h2o", sigma=2.0), DensityPolicy)
    assert isinstance(get_policy("SV", nu=0.3, sigma=3.0), SupportVectorPolicy)
    assert get_policy("random", seed=3).seed == 3
    with pytest.raises(UnknownPolicyError, match="available: density"):
        get_policy("lru")
    with pytest.raises(PolicyError, match="bad arguments"):
        get_policy("density", bandwidth=2.0)
    with pytest.raises(PolicyError, match="sigma"):
        get_policy("density", sigma=-1.0)


# ---------------------------------------------------------------- support vectors (needs sv_core)
def test_sv_policy_example_3_1_keeps_the_two_margin_keys():
    # SPEC Example 3.1: C = 1 (nu * n0 = 1), sigma = 5: alpha = (1/2, 1/2, 0)
    X = np.array([[-1.0, 0.0], [1.0, 0.0], [0.0, 0.9]])
    pol = SupportVectorPolicy(nu=1 / 3, sigma=5.0, n0=3)
    np.testing.assert_allclose(pol.score(X), [0.5, 0.5, 0.0], atol=1e-8)
    assert pol.support_size(X) == 2
    assert pol.select(X, pol.support_size(X)).tolist() == [0, 1]


def test_sv_topk_at_support_size_is_exactly_the_support_set():
    rng = np.random.default_rng(5)
    for _trial in range(4):
        X = np.vstack([rng.normal(size=(30, 3)), rng.normal(size=(10, 3)) * 0.05 + 2.0])
        pol = SupportVectorPolicy(nu=0.3, sigma=3.0)
        alpha = pol.alpha(X)
        np.testing.assert_allclose(alpha.sum(), 1.0, atol=1e-9)
        C = 1.0 / (0.3 * len(X))
        assert np.all(alpha <= C + 1e-9)
        k = pol.support_size(X)
        assert 0 < k < len(X)
        np.testing.assert_array_equal(pol.select(X, k), np.flatnonzero(alpha > pol.tol))


def test_sv_policy_alpha_is_the_certified_solve_and_equals_the_refit_oracle():
    """α comes from sv_core.solve (its certificate is kept); the independent refit agrees."""
    from sv_core import refit

    rng = np.random.default_rng(11)
    X = rng.normal(size=(80, 6))
    pol = SupportVectorPolicy(nu=0.3, sigma=3.0)
    alpha = pol.alpha(X)
    cert = pol.last_certificate
    assert cert.certified and cert.fallbacks == 0 and cert.kkt_violation <= 1e-12
    C = pol.box_C(80)
    a_ref, _ = refit(X, C=C, sigma=3.0)
    np.testing.assert_allclose(alpha, a_ref, rtol=0, atol=1e-9 * C)
    np.testing.assert_array_equal(alpha > pol.tol, a_ref > pol.tol)


def test_sv_policy_rejects_infeasible_box():
    X = np.random.default_rng(0).normal(size=(5, 2))
    with pytest.raises(PolicyError, match="infeasible"):
        SupportVectorPolicy(nu=0.5, sigma=2.0, n0=100).score(X)  # n*C = 5/50 < 1
    with pytest.raises(PolicyError, match="nu"):
        SupportVectorPolicy(nu=0.0, sigma=2.0)
