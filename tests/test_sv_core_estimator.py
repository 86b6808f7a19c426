"""sv_core.SVDDGate: scikit-learn conformance, agreement with OneClassSVM, and the gate's exactness."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.datasets import make_blobs, make_moons
from sklearn.exceptions import NotFittedError
from sklearn.svm import OneClassSVM
from sklearn.utils.estimator_checks import parametrize_with_checks

from sv_core import Gate, rbf_kernel, refit
from sv_core.errors import InfeasibleError, InvalidKeysError, InvalidParameterError, UnknownTokenError
from sv_core.estimator import TIE_TOL, SmallSampleWarning, SVDDGate


def _scores(X_train, alpha, rho, sigma, P):
    """Gate score of an independent refit: s(x) = 2 sum a_i k(x, x_i) - rho."""
    return 2.0 * rbf_kernel(P, X_train, sigma) @ alpha - rho


# ---------------------------------------------------------------- scikit-learn's own checks
@parametrize_with_checks([SVDDGate(), SVDDGate(nu=0.2, sigma=2.0)])
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)


# ---------------------------------------------------------------- agreement with OneClassSVM
def _dataset(name: str, n: int, seed: int) -> np.ndarray:
    if name == "blobs":
        return make_blobs(n, centers=3, random_state=seed)[0]
    if name == "moons":
        return make_moons(n, noise=0.1, random_state=seed)[0]
    if name == "gauss5d":
        return np.random.default_rng(seed).normal(size=(n, 5))
    return np.random.default_rng(seed).standard_t(2, size=(n, 3))  # heavy tails


_AGREEMENT_CASES = [
    (name, sigma, nu)
    for name, sigma in [("blobs", 1.0), ("moons", 0.5), ("gauss5d", 2.0), ("heavy", 1.5)]
    for nu in (0.1, 0.5)
]


def test_predictions_agree_with_one_class_svm_on_held_out_points():
    """Held-out predictions vs OneClassSVM(nu, gamma=1/sigma^2), 8 dataset/nu cases x 200 points.

    With libsvm's default stopping tolerance (tol=1e-3) its solution is approximate and points
    near the boundary can flip (pooled agreement >= 99 %; 96-100 % per case); with a tight
    tolerance libsvm reaches the same optimum and every case agrees on every point.
    """
    hits_default, hits_tight, total = 0, 0, 0
    for name, sigma, nu in _AGREEMENT_CASES:
        X = _dataset(name, 400, seed=1)
        X_train, X_test = X[:200], X[200:]
        y = SVDDGate(nu=nu, sigma=sigma).fit(X_train).predict(X_test)
        y_default = OneClassSVM(nu=nu, gamma=1.0 / sigma**2).fit(X_train).predict(X_test)
        y_tight = OneClassSVM(nu=nu, gamma=1.0 / sigma**2, tol=1e-9).fit(X_train).predict(X_test)
        assert np.mean(y == y_tight) >= 0.995, (name, nu)
        hits_default += int(np.sum(y == y_default))
        hits_tight += int(np.sum(y == y_tight))
        total += y.size
    assert hits_default / total >= 0.99
    assert hits_tight / total >= 0.999


def test_decision_function_is_one_class_svm_scaled_by_nu_n():
    """Same dual for the RBF kernel: libsvm's decision is nu * n times ours (tight libsvm tol)."""
    X = _dataset("blobs", 300, seed=2)
    n, nu, sigma = 150, 0.3, 1.0
    est = SVDDGate(nu=nu, sigma=sigma).fit(X[:n])
    oc = OneClassSVM(nu=nu, gamma=1.0 / sigma**2, tol=1e-10).fit(X[:n])
    np.testing.assert_allclose(oc.decision_function(X[n:]), nu * n * est.decision_function(X[n:]), atol=1e-5)
    np.testing.assert_allclose(oc.offset_[0], nu * n * est.offset_, atol=1e-5)
    assert est.dual_coef_.sum() == pytest.approx(1.0, abs=1e-12)


# ---------------------------------------------------------------- the boundary and the mapping
def test_decision_function_is_zero_on_the_boundary_and_maps_to_the_gate_score():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 2))
    est = SVDDGate(nu=0.4, sigma=1.5).fit(X)
    g = est.gate_
    margin = np.isin(g.ids, g.partition()["margin"])
    error = np.isin(g.ids, g.partition()["error"])
    reserve = np.isin(g.ids, g.partition()["reserve"])
    assert margin.any() and error.any() and reserve.any()
    d = est.decision_function(X)
    assert np.all(d[margin] == 0.0)  # boundary ties are reported as exactly 0
    assert np.all(d[error] <= TIE_TOL) and np.all(d[reserve] >= -TIE_TOL)
    assert np.all(est.predict(X)[margin] == 1)
    # gate score s = 2 sum a k - rho; boundary at s = 1 - 2 rho; decision = (s - (1 - 2 rho)) / 2
    s = g.score(X)
    np.testing.assert_allclose(s[margin], 1.0 - 2.0 * g.rho, atol=1e-12)
    P = rng.normal(scale=2.0, size=(500, 2))
    np.testing.assert_allclose(est.decision_function(P), (g.score(P) - (1.0 - 2.0 * g.rho)) / 2.0, atol=1e-14)
    np.testing.assert_allclose(est.gate_score(P), g.score(P), rtol=0, atol=0)
    np.testing.assert_array_equal(est.decision_function(P), est.score_samples(P) - est.offset_)
    assert est.offset_ == pytest.approx((1.0 - g.rho) / 2.0)
    # fitted attributes are the gate's support
    np.testing.assert_array_equal(np.sort(est.support_), np.sort(g.support_ids()))
    assert est.support_vectors_.shape == (est.support_.size, 2)
    assert est.dual_coef_.shape == (1, est.support_.size)
    assert est.dual_coef_.max() <= est.C_ + 1e-15
    assert est.C_ == pytest.approx(1.0 / (0.4 * 120)) and est.n_features_in_ == 2


# ---------------------------------------------------------------- exact streaming and deletion
def test_partial_fit_equals_a_fresh_solve_on_the_union_at_the_same_C():
    rng = np.random.default_rng(3)
    X1, X2 = rng.normal(size=(60, 3)), rng.normal(size=(25, 3))
    est = SVDDGate(nu=0.3, sigma=2.0).fit(X1).partial_fit(X2)
    assert est.C_ == pytest.approx(1.0 / (0.3 * 60))  # C is not recomputed
    assert est.n_samples_seen_ == 85 and list(est.ids_) == list(range(85))
    U = np.vstack([X1, X2])
    a, rho = refit(U, C=est.C_, sigma=2.0)
    P = np.vstack([U, rng.normal(size=(200, 3))])
    np.testing.assert_allclose(est.gate_score(P), _scores(U, a, rho, 2.0, P), atol=1e-8)
    fresh = Gate(est.C_, 2.0)
    fresh.admit(U)
    np.testing.assert_allclose(est.gate_score(P), fresh.score(P), atol=1e-9)


def test_forget_equals_a_refit_without_the_samples_and_returns_receipts():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(80, 2))
    est = SVDDGate(nu=0.25, sigma=1.0).fit(X)
    gone = [int(est.support_[0]), int(est.support_[-1]), 7]
    gone = list(dict.fromkeys(gone))
    receipts = est.forget(gone, verify=True)
    assert [r.token_id for r in receipts] == gone
    assert all(r.certified for r in receipts)
    # every receipt carries the one verification of the batch, naming what it covers (issue 18:
    # the first receipt used to show verification=None), removed keys among the probes
    for r in receipts:
        assert r.verification["max_abs_score_dev"] < 1e-8 and r.verification["batch_tokens"] == gone
        assert "removed" in r.verification["score_dev_by_probe"]
    keep = np.setdiff1d(np.arange(80), gone)
    np.testing.assert_array_equal(est.ids_, keep)
    assert not np.isin(gone, est.support_).any()
    a, rho = refit(X[keep], C=est.C_, sigma=1.0)
    P = np.vstack([X, rng.normal(size=(100, 2))])
    np.testing.assert_allclose(est.gate_score(P), _scores(X[keep], a, rho, 1.0, P), atol=1e-8)
    # a single int works too, and forgotten indices are refused
    assert len(est.forget(int(keep[0]))) == 1
    with pytest.raises(UnknownTokenError):
        est.forget(gone[0])


def test_evict_reserve_keeps_decisions_and_support():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(90, 2))
    est = SVDDGate(nu=0.3, sigma=1.0).fit(X)
    P = rng.normal(scale=2.0, size=(300, 2))
    d0, sup0 = est.decision_function(P), est.support_.copy()
    cert = est.evict_reserve()
    assert cert.issued and len(cert.evicted) > 0 and cert.max_abs_score_change < 1e-12
    np.testing.assert_array_equal(est.support_, sup0)
    np.testing.assert_array_equal(est.ids_, sup0)
    np.testing.assert_allclose(est.decision_function(P), d0, atol=1e-12)


def test_fit_resets_and_pickles():
    rng = np.random.default_rng(6)
    X = rng.normal(size=(40, 2))
    est = SVDDGate().fit(X).partial_fit(X[:5])
    est.fit(X)
    assert est.n_samples_seen_ == 40 and est.gate_.n == 40
    again = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(again.decision_function(X), est.decision_function(X))
    again.forget([0])  # the unpickled gate is live
    assert again.gate_.n == 39 and est.gate_.n == 40
    assert clone(est).get_params() == est.get_params()


# ---------------------------------------------------------------- typed errors and small samples
@pytest.mark.parametrize(
    "params",
    [
        {"nu": 0.0},
        {"nu": 1.5},
        {"nu": float("nan")},
        {"nu": "0.5"},
        {"sigma": 0.0},
        {"sigma": -1.0},
        {"sigma": float("inf")},
        {"refactor_every": 0},
        {"refactor_every": 2.5},
    ],
)
def test_invalid_parameters_raise_typed_errors_at_fit(params):
    est = SVDDGate(**params)  # __init__ never validates (sklearn convention)
    with pytest.raises(InvalidParameterError):
        est.fit(np.zeros((10, 2)) + np.arange(10)[:, None])
    assert issubclass(InvalidParameterError, ValueError)


def test_errors_are_typed():
    X = np.random.default_rng(7).normal(size=(30, 3))
    with pytest.raises(NotFittedError):
        SVDDGate().decision_function(X)
    with pytest.raises(NotFittedError):
        SVDDGate().forget([0])
    with pytest.raises(InvalidKeysError, match="n_samples=1"):
        SVDDGate().fit(X[:1])
    with pytest.raises(InvalidKeysError, match="n_samples=2"):
        SVDDGate().fit(X[:2])
    est = SVDDGate(nu=0.5).fit(X)
    with pytest.raises(ValueError, match="features"):
        est.predict(X[:, :2])
    with pytest.raises(ValueError, match="features"):
        est.partial_fit(X[:, :2])
    with pytest.raises(ValueError, match="NaN"):
        est.partial_fit(np.full((2, 3), np.nan))
    with pytest.raises(UnknownTokenError):
        est.forget([999])
    with pytest.raises(UnknownTokenError):
        est.forget([1, 1])
    with pytest.raises(UnknownTokenError):
        est.forget([1.5])
    # C = 1/(0.5*30): at most 15 keys may go; asking for 16 is refused and changes nothing
    d0 = est.decision_function(X)
    with pytest.raises(InfeasibleError):
        est.forget(np.arange(16))
    np.testing.assert_array_equal(est.decision_function(X), d0)
    assert est.gate_.n == 30


def test_small_samples_raise_C_with_a_warning():
    X = np.random.default_rng(8).normal(size=(6, 2))
    with pytest.warns(SmallSampleWarning, match="effective nu"):
        est = SVDDGate(nu=0.9).fit(X)
    assert est.C_ == pytest.approx(1.0 / 4) and est.nu_ == pytest.approx(4 / 6)
    assert est.gate_.gated
    with pytest.warns(SmallSampleWarning):
        SVDDGate(nu=1.0).fit(X[:3])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SVDDGate(nu=0.5).fit(X)  # ceil(3) + 2 = 5 <= 6: no warning


def test_top_level_export():
    import sv_core

    assert sv_core.SVDDGate is SVDDGate
