"""The n x n peer work by row blocks (issue 36 item 3): the density and kernel-leverage scores
are those of the whole Gram matrix to rounding, with the same selections, and their memory stays
below one n x n matrix (density) or at one (kernel leverage, which needs one buffer for its Cholesky
factor).

Rounding, not bits: a block's products come from a BLAS call on fewer rows, and some BLAS builds
take another kernel (another summation order) for another row count. Bit for bit on most builds;
an AMD EPYC OpenBLAS here differs by up to 2e-15 in a Gram entry and 2e-16 relative in a score."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from scipy.linalg.lapack import dpotrf, dtrtri

from evaluation import policy_base
from evaluation.peers import KernelLeveragePolicy
from evaluation.policies import DensityPolicy
from sv_core import rbf_kernel
from sv_core.bench.solve import icu_like_keys

#: rounding of a block's BLAS products against the whole matrix's (see the module docstring)
GRAM_TOL = 1e-13
SCORE_RTOL = 1e-12


def _keys(n: int, seed: int) -> np.ndarray:
    X = icu_like_keys(n, np.random.default_rng(seed)) * 1.9 + 0.4  # off-origin: the kernel centres
    X[5:9] = X[3]  # exact repeats, as hourly vitals have
    return X


def _whole_density(X, sigma):
    K = rbf_kernel(X, X, sigma)
    np.fill_diagonal(K, 0.0)
    return K.sum(axis=0)


def _whole_kernel_leverage(X, sigma, lam_rel=1e-2):
    K = rbf_kernel(X, X, sigma)
    lam = lam_rel * float(np.trace(K)) / K.shape[0]
    K.flat[:: K.shape[0] + 1] += lam
    L, _ = dpotrf(K.T, lower=1, clean=1, overwrite_a=1)
    Linv, _ = dtrtri(L, lower=1, overwrite_c=1)
    return 1.0 - lam * np.einsum("ij,ij->j", Linv, Linv)


@pytest.mark.parametrize("block", [1, 97 * 300, 1 << 20])
def test_row_blocks_are_the_whole_gram_matrix_bit_for_bit(block):
    X = _keys(300, 0)
    K = rbf_kernel(X, X, 2.5)
    got = np.full_like(K, np.nan)
    low = np.full_like(K, np.nan)
    for r0, r1, B in policy_base.gram_row_blocks(X, 2.5, block=block):
        got[r0:r1] = B
    for r0, r1, B in policy_base.gram_row_blocks(X, 2.5, lower=True, block=block):
        low[r0:r1, :r1] = B
    assert not np.isnan(got).any() and np.abs(got - K).max() <= GRAM_TOL  # entries in [0, 1]
    tri = np.tril_indices(300)
    assert not np.isnan(low[tri]).any() and np.abs(low[tri] - K[tri]).max() <= GRAM_TOL


@pytest.mark.parametrize("n, block", [(40, 1 << 20), (350, 4096), (900, 50_000)])
def test_blocked_scores_equal_the_whole_matrix_scores(monkeypatch, n, block):
    monkeypatch.setattr(policy_base, "GRAM_BLOCK", block)
    X = _keys(n, n)
    for got, want in ((DensityPolicy(3.0).score(X), _whole_density(X, 3.0)),
                      (KernelLeveragePolicy(3.0).score(X), _whole_kernel_leverage(X, 3.0))):
        assert np.abs(got - want).max() <= SCORE_RTOL * np.abs(want).max()
        for k in (n // 10, n // 3, n // 2):  # what a policy does with its scores: the same tokens kept
            assert np.array_equal(policy_base.select_top_k(got, k), policy_base.select_top_k(want, k))


def _peak(f) -> int:
    tracemalloc.start()
    try:
        f()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_peer_memory_is_bounded_by_blocks(monkeypatch):
    """The whole-matrix versions peak at two n x n fp64 matrices (the kernel and its temporaries)."""
    monkeypatch.setattr(policy_base, "GRAM_BLOCK", 1 << 15)  # 64-row blocks (GRAM_MIN_ROWS)
    X = _keys(1200, 1)
    full = X.shape[0] ** 2 * 8
    assert _peak(lambda: DensityPolicy(3.0).score(X)) < 0.25 * full
    assert _peak(lambda: KernelLeveragePolicy(3.0).score(X)) < 1.25 * full
    assert _peak(lambda: _whole_density(X, 3.0)) > 1.5 * full  # the checks can fail
    assert _peak(lambda: _whole_kernel_leverage(X, 3.0)) > 1.5 * full
