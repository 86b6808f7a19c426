"""The refit oracle is itself checked: KKT in its own right, and against scikit-learn."""
from __future__ import annotations

import numpy as np
import pytest

from sv_core import calibrate_C, rbf_kernel, refit
from sv_core.refit import kkt_violation


@pytest.mark.parametrize("seed", range(3))
def test_refit_is_kkt_optimal_and_beats_random_feasible_points(seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(50, 4))
    C = calibrate_C(0.3, 50)
    a, rho, info = refit(X, C=C, sigma=2.0, return_info=True)
    assert info["kkt_violation"] < 1e-9
    K = rbf_kernel(X, X, 2.0)
    f = a @ K @ a - np.diag(K) @ a
    for _ in range(20):  # random feasible points: uniform mix with the optimum
        b = rng.dirichlet(np.ones(50)) * 0.5 + a * 0.5
        b = np.clip(b, 0, C); b /= b.sum()
        if b.max() <= C:
            assert b @ K @ b - np.diag(K) @ b >= f - 1e-12


def test_refit_agrees_with_sklearn_one_class_svm():
    """For RBF keys the problem equals libsvm's one-class SVM with nu' = 1/(nC)."""
    from sklearn.svm import OneClassSVM

    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3))
    n, sigma = 60, 2.0
    C = calibrate_C(0.25, 60)
    a, rho = refit(X, C=C, sigma=sigma)
    nu_p = 1.0 / (n * C)
    oc = OneClassSVM(kernel="rbf", gamma=1.0 / sigma**2, nu=nu_p, tol=1e-10, cache_size=50).fit(X)
    a_sk = np.zeros(n)
    a_sk[oc.support_] = oc.dual_coef_.ravel() / (nu_p * n)
    # libsvm uses a float32 kernel cache and loose tolerance: agreement at ~1e-5, not 1e-12
    assert np.abs(a - a_sk).max() < 1e-4
    K = rbf_kernel(X, X, sigma)
    st = np.where(a <= 1e-12, 0, np.where(a >= C - 1e-12, 2, 1))
    assert kkt_violation(K, C, a, rho, st) < 1e-9
