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
from sklearn.utils._param_validation import InvalidParameterError as SklearnInvalidParameterError
from sklearn.utils.estimator_checks import parametrize_with_checks

from sv_core import Gate, rbf_kernel, refit
from sv_core.errors import (
    InfeasibleError,
    InvalidKeysError,
    InvalidParameterError,
    InvalidStateError,
    UnknownTokenError,
)
from sv_core.estimator import TIE_TOL, SmallSampleWarning, SVDDGate, SVDDParameterError


def _scores(X_train, alpha, rho, sigma, P):
    """Gate score of an independent refit: s(x) = 2 sum a_i k(x, x_i) - rho."""
    return 2.0 * rbf_kernel(P, X_train, sigma) @ alpha - rho


# ---------------------------------------------------------------- scikit-learn's own checks
@parametrize_with_checks([SVDDGate(), SVDDGate(nu=0.2, sigma=2.0), SVDDGate(gamma=0.5, boundary="libsvm")])
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


# ---------------------------------------------------------------- persistence in O(n d), no kernel
def _pickle_bound(n: int, d: int) -> int:
    """Bytes a pickle may take: keys (n d), coefficients and ids (2 n) as fp64/int64, 25 % and 6 kB
    of slack for the status bytes, the scalars and pickle's framing. The n x n kernel is 8 n^2."""
    return int(1.25 * 8 * n * (d + 2)) + 6144


def test_pickle_round_trip_is_exact_and_holds_no_solver_state():
    rng = np.random.default_rng(11)
    X, P = rng.normal(size=(300, 4)), rng.normal(scale=2.0, size=(500, 4))
    est = SVDDGate(nu=0.3, sigma=2.0).fit(X)
    est.forget([5, 17])
    blob = pickle.dumps(est)
    assert len(blob) <= _pickle_bound(300, 4) < 8 * 300**2
    again = pickle.loads(blob)
    assert again.__dict__["_gate"] is None  # loading did no solver work
    for method in ("predict", "decision_function", "score_samples", "gate_score"):
        np.testing.assert_array_equal(getattr(again, method)(P), getattr(est, method)(P))
        np.testing.assert_array_equal(getattr(again, method)(X), getattr(est, method)(X))
    for name in ("ids_", "support_", "support_vectors_", "dual_coef_", "rho_", "offset_", "C_", "sigma_", "nu_",
                 "n0_", "n_samples_seen_", "n_features_in_"):
        np.testing.assert_array_equal(getattr(again, name), getattr(est, name))
    assert again.__dict__["_gate"] is None  # predicting did not rebuild it either
    # pickled again before any rebuild: the same state, the same bytes
    assert pickle.dumps(again) == blob
    # the rebuilt gate is the fitted one: same ids, coefficients, partition; forgotten ids stay forgotten
    g0, g1 = est.gate_, again.gate_
    np.testing.assert_array_equal(g1.ids, g0.ids)
    np.testing.assert_array_equal(g1.alpha, g0.alpha)
    assert g1.partition() == g0.partition() and g1.kkt_residual()["max"] <= 1e-9
    with pytest.raises(UnknownTokenError, match="already forgotten"):
        again.forget([17])


def test_after_unpickling_forget_and_partial_fit_equal_a_same_C_refit():
    rng = np.random.default_rng(12)
    X, X2 = rng.normal(size=(120, 3)), rng.normal(size=(30, 3))
    P = np.vstack([X, X2, rng.normal(scale=2.0, size=(200, 3))])
    est = pickle.loads(pickle.dumps(SVDDGate(nu=0.25, sigma=1.5).fit(X)))
    gone = [int(est.support_[0]), int(est.support_[-1]), 3]
    gone = list(dict.fromkeys(gone))
    receipts = est.forget(gone, verify=True)
    assert all(r.certified for r in receipts) and receipts[-1].verification["max_abs_score_dev"] < 1e-8
    keep = np.setdiff1d(np.arange(120), gone)
    a, rho = refit(X[keep], C=est.C_, sigma=1.5)
    np.testing.assert_allclose(est.gate_score(P), _scores(X[keep], a, rho, 1.5, P), atol=1e-8)
    # a second round trip after the deletion, then more samples: indices continue from 120
    est = pickle.loads(pickle.dumps(est)).partial_fit(X2)
    np.testing.assert_array_equal(est.ids_, np.concatenate([keep, np.arange(120, 150)]))
    U = np.vstack([X[keep], X2])
    a, rho = refit(U, C=est.C_, sigma=1.5)
    np.testing.assert_allclose(est.gate_score(P), _scores(U, a, rho, 1.5, P), atol=1e-8)


def test_evict_reserve_then_pickle_is_O_n_sv_d():
    rng = np.random.default_rng(13)
    X, P = rng.normal(size=(400, 3)), rng.normal(scale=2.0, size=(300, 3))
    est = SVDDGate(nu=0.2, sigma=2.0).fit(X)
    full = len(pickle.dumps(est))
    est.evict_reserve()
    n_sv = est.support_.size
    assert n_sv < 400 // 2
    blob = pickle.dumps(est)
    assert len(blob) <= _pickle_bound(n_sv, 3) < full
    again = pickle.loads(blob)
    np.testing.assert_array_equal(again.decision_function(P), est.decision_function(P))
    again.forget([int(again.support_[0])], verify=True)  # still exact for the samples kept


def test_a_tampered_pickled_state_is_refused_at_rebuild_and_changes_nothing():
    """The state is checked when the solver is rebuilt (Gate.from_state: shapes, ids, the box,
    the KKT residual recomputed from the keys); a refused rebuild leaves the estimator as loaded."""
    rng = np.random.default_rng(14)
    X = rng.normal(size=(60, 2))
    est = pickle.loads(pickle.dumps(SVDDGate(nu=0.3).fit(X)))
    st = est.__dict__["_gate_state"]
    st["alpha"] = st["alpha"].copy()
    inner = np.flatnonzero((st["alpha"] > 1e-4 * est.C_) & (st["alpha"] < (1 - 1e-4) * est.C_))
    assert inner.size >= 2
    st["alpha"][inner[:2]] += [1e-5 * est.C_, -1e-5 * est.C_]  # in the box, sum still 1, no longer KKT
    d0 = est.decision_function(X)
    with pytest.raises(InvalidStateError, match="KKT"):
        est.partial_fit(X[:3])
    with pytest.raises(InvalidStateError):
        est.forget([0])
    assert est.n_samples_seen_ == 60 and est.__dict__["_gate"] is None
    np.testing.assert_array_equal(est.decision_function(X), d0)


@pytest.mark.parametrize("n", [200, 1000, pytest.param(5000, marks=pytest.mark.slow)])
def test_pickle_size_beside_one_class_svm(n):
    """Pickle sizes (``pytest -s`` prints them): SVDDGate (default and after ``evict_reserve``)
    beside OneClassSVM with the same nu and kernel; d = 5, nu = 0.5, sigma = 2."""
    X = np.random.default_rng(15).normal(size=(n, 5))
    est = SVDDGate(nu=0.5, sigma=2.0).fit(X)
    default = len(pickle.dumps(est))
    est.evict_reserve()
    compact = len(pickle.dumps(est))
    ocsvm = len(pickle.dumps(OneClassSVM(nu=0.5, gamma=0.25).fit(X)))
    print(f"\npickle n={n} d=5 nu=0.5: SVDDGate {default / 1e3:.1f} kB, after evict_reserve {compact / 1e3:.1f} kB "
          f"(n_SV={est.support_.size}), OneClassSVM {ocsvm / 1e3:.1f} kB")
    assert default <= _pickle_bound(n, 5) and compact <= _pickle_bound(est.support_.size, 5)


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
        {"sigma": 1e-200},
        {"sigma": "1"},
        {"gamma": 0.0},
        {"gamma": -2.0},
        {"gamma": float("inf")},
        {"gamma": float("nan")},
        {"sigma": 2.0, "gamma": 0.5},  # both spellings, disagreeing (gamma must be 1/sigma**2 = 0.25)
        {"boundary": "outside"},
        {"boundary": None},
        {"refactor_every": 0},
        {"refactor_every": 2.5},
    ],
)
def test_invalid_parameters_raise_typed_errors_at_fit(params):
    """scikit-learn's parameter validation, raised as one error type that is both sv_core's and
    scikit-learn's InvalidParameterError; one line naming the parameter; nothing fitted."""
    est = SVDDGate(**params)  # __init__ never validates (sklearn convention)
    X = np.zeros((10, 2)) + np.arange(10)[:, None]
    for method in (est.fit, est.partial_fit):
        with pytest.raises(SVDDParameterError) as info:
            method(X)
        assert isinstance(info.value, InvalidParameterError) and isinstance(info.value, SklearnInvalidParameterError)
        msg = str(info.value)
        assert "\n" not in msg and any(name in msg for name in params), msg
        assert not hasattr(est, "C_")
    assert issubclass(InvalidParameterError, ValueError)


def test_gamma_is_the_other_spelling_of_the_bandwidth():
    """gamma = 1/sigma**2: the same kernel as OneClassSVM(gamma=...); both spellings may be given
    when they agree."""
    X = _dataset("blobs", 300, seed=9)
    by_sigma = SVDDGate(nu=0.3, sigma=2.0).fit(X[:150])
    by_gamma = SVDDGate(nu=0.3, gamma=0.25).fit(X[:150])
    both = SVDDGate(nu=0.3, sigma=2.0, gamma=0.25).fit(X[:150])
    assert by_gamma.sigma_ == both.sigma_ == by_sigma.sigma_ == 2.0
    for est in (by_gamma, both):
        np.testing.assert_array_equal(est.decision_function(X[150:]), by_sigma.decision_function(X[150:]))
    assert SVDDGate().fit(X[:150]).sigma_ == 1.0  # neither given: sigma = 1
    oc = OneClassSVM(nu=0.3, gamma=0.25, tol=1e-10).fit(X[:150])
    np.testing.assert_allclose(oc.decision_function(X[150:]), 0.3 * 150 * by_gamma.decision_function(X[150:]),
                               atol=1e-5)


def test_boundary_libsvm_breaks_ties_as_libsvm_does():
    """``boundary="libsvm"`` puts exact ties (every margin support vector) one ulp outside, so they
    are -1 as libsvm's ``(decision > 0) ? 1 : -1`` labels a tie, while predict stays +1 exactly where
    decision_function >= 0; every other value is the same. On the training samples every
    disagreement with OneClassSVM (tight tol) is a margin support vector: there libsvm's own
    decision is solver noise of either sign (printed), which no tie rule reproduces."""
    rng = np.random.default_rng(10)
    X = rng.normal(size=(120, 2))
    est = SVDDGate(nu=0.4, sigma=1.5).fit(X)
    margin = np.isin(est.ids_, est.gate_.partition()["margin"])
    assert margin.sum() >= 3
    inside, d_inside = est.predict(X), est.decision_function(X)
    libsvm_est = clone(est).set_params(boundary="libsvm").fit(X)
    libsvm, d_libsvm = libsvm_est.predict(X), libsvm_est.decision_function(X)
    assert np.all(inside[margin] == 1) and np.all(d_inside[margin] == 0.0)
    assert np.all(libsvm[margin] == -1) and np.all(d_libsvm[margin] == -np.spacing(est.offset_))
    np.testing.assert_array_equal(d_inside[~margin], d_libsvm[~margin])
    np.testing.assert_array_equal(inside[~margin], libsvm[~margin])
    for y, d in ((inside, d_inside), (libsvm, d_libsvm)):
        np.testing.assert_array_equal(y, np.where(d >= 0, 1, -1))
    P = rng.normal(scale=2.0, size=(400, 2))  # no ties off the training set
    est.set_params(boundary="libsvm")  # read at predict time: no refit needed
    np.testing.assert_array_equal(est.predict(P), libsvm_est.predict(P))
    oc = OneClassSVM(nu=0.4, gamma=1 / 1.5**2, tol=1e-9).fit(X)
    y_oc, d_oc = oc.predict(X), oc.decision_function(X)
    for ours in (inside, libsvm):
        assert np.all(margin[ours != y_oc]), "a disagreement off the margin set"
    print(f"\nmargin SVs {int(margin.sum())}: libsvm labels {int((y_oc[margin] == 1).sum())} of them +1, "
          f"max |libsvm decision| on them {np.abs(d_oc[margin]).max():.1e}")
    est.set_params(boundary="outside")
    with pytest.raises(SVDDParameterError, match="boundary"):
        est.predict(P)


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
