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


def test_twin_groups_link_near_and_exact_duplicates_only():
    from sv_core.refit import twin_groups

    X = np.array([[0.0, 0.0], [1e-6, 0.0], [5.0, 5.0], [5.0, 5.0], [1.0, 0.0], [1.0, 2e-6]])
    # feature distance^2 of the 1e-6 pair: 2(1 - exp(-1e-12/4)) = 5e-13 <= 1e-8; of 2e-6: 2e-12
    assert twin_groups(X, 2.0).tolist() == [0, 0, 2, 2, 4, 4]
    # a 1e-3 offset is 5e-7 in feature space: not a twin at the default tolerance
    assert twin_groups(np.array([[0.0, 0.0], [1e-3, 0.0]]), 2.0).tolist() == [0, 1]


def test_read_off_fills_a_twin_group_in_gradient_order():
    """Interior-point mass spread evenly over 3 twins (total 2.5 C) becomes C, C, margin 0.5 C
    in increasing-gradient order; the singleton (0 < 0.1 < C) is read off by its coefficient."""
    from sv_core.refit import read_off_partition
    from sv_core.solver import ERROR, MARGIN

    C = 0.2
    K = np.eye(4)
    a0 = np.array([2.5 * C / 3] * 3 + [0.1])
    # gradient 2 K a0 - 1 = 2 a0_i + 0.2 K_i3 - 1 in the group: ordered 1 < 2 < 0
    K[3, :3] = K[:3, 3] = [0.3, 0.1, 0.2]
    st = read_off_partition(K, C, a0, np.array([0, 0, 0, 3]), tol=1e-7 * C)
    assert st.tolist() == [MARGIN, ERROR, ERROR, MARGIN]


@pytest.mark.parametrize("seed", range(4))
def test_refit_reaches_kkt_on_near_duplicate_keys(seed):
    """12 keys x 6 copies, half jittered by 1e-6 (the audit's duplicates regime): the refit
    reaches KKT with at most one margin key per twin group (it raised RefitError before)."""
    from sv_core.audit import duplicate_keys
    from sv_core.refit import twin_groups
    from sv_core.solver import MARGIN

    X = duplicate_keys(np.random.default_rng(seed))
    C = calibrate_C(0.4, X.shape[0])
    a, rho, info = refit(X, C=C, sigma=2.0, return_info=True)
    assert info["kkt_violation"] <= 1e-9
    groups = twin_groups(X, 2.0)
    margin_groups = groups[info["status"] == MARGIN]
    assert np.unique(margin_groups).size == margin_groups.size
    assert abs(a.sum() - 1.0) < 1e-12 and a.min() >= 0.0 and a.max() <= C


def test_refit_reaches_kkt_on_near_vertex_problem_with_duplicates():
    """Regression (found by hypothesis): the optimum sits 7.5e-9 from a vertex; two bound keys
    must enter the margin set together, which the one-key repair cannot do."""
    from sv_core import Gate

    base = np.array([[-0.29342232, 1.57370885, -0.53667996], [-2.63379808, -1.62672487, 0.08108072],
                     [2.19700938, -0.21091831, 2.20696639]])
    X = np.repeat(np.vstack([base, [[1.30742303, 0.26689555, -1.89058588], [-2.89040509, -0.89543488, 0.80163916],
                                    [-2.6540146, 2.02362268, -0.05619305]]]), 3, axis=0)[:8]
    C = 1.0 / 6.0
    a, rho, info = refit(X, C=C, sigma=1.0, return_info=True)
    assert info["kkt_violation"] < 1e-9
    g = Gate(C=C, sigma=1.0)
    g.admit(X)
    assert np.abs(g.score(X) - (2 * rbf_kernel(X, X, 1.0) @ a - rho)).max() < 1e-12
