"""Internals of the maintained solver that the fast path relies on: the cached bordered rows
``[1; 2 K[S, :n]]`` and index view of S stay equal to a fresh gather through every kind of
operation (admission, active/reserve deletion, eviction, compaction, rollback, exact fallback),
and the BLAS limiter restores the thread count it found."""
from __future__ import annotations

import numpy as np
import pytest

from sv_core import Gate, calibrate_C
from sv_core.errors import GateError


def _assert_cache_fresh(g: Gate) -> None:
    core = g._solver
    S, B = core.margin_rows()
    n = core.n_slots
    want_S = np.asarray(core.S, dtype=np.int64)
    assert np.array_equal(S, want_S)
    want = np.vstack([np.ones((1, n)), 2.0 * core.K[want_S, :n]])
    assert B.shape == want.shape
    assert np.array_equal(B, want)  # bit-for-bit: rows are copies of 2 K, never recomputed
    if core.S:
        M = core._bordered()
        assert np.abs(M @ core.Rinv - np.eye(M.shape[0])).max() < 1e-6


@pytest.mark.parametrize("seed", range(3))
def test_bordered_row_cache_matches_a_fresh_gather(seed):
    rng = np.random.default_rng(seed)
    C = calibrate_C(0.4, 40)
    g = Gate(C=C, sigma=2.0)
    g.admit(rng.normal(size=(40, 4)))
    _assert_cache_fresh(g)
    for _step in range(120):
        r = rng.random()
        if r < 0.35:
            g.admit(rng.normal(size=(int(rng.integers(1, 3)), 4)))
        elif r < 0.75 and (g.n - 1) * C >= 1.0:
            act = g.support_ids()
            g.forget(int(rng.choice(act if act.size and rng.random() < 0.8 else g.ids)))
        elif r < 0.85:
            g.evict_reserve(max_evict=3)
        elif r < 0.95:
            try:
                g.forget(10**9)  # invalid: typed error, state unchanged
            except GateError:
                pass
        else:
            g._state.exact.fallback(g._solver, "test", "forced")  # state rebuilt from a fresh refit
        _assert_cache_fresh(g)
        assert g.kkt_residual()["max"] <= 1e-9


def test_single_thread_limits_and_restores_blas_threads():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from sv_core import _blas

    libs = _blas._controllers()
    if not libs:
        pytest.skip("no BLAS library visible to threadpoolctl")
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        before = [lc.get_num_threads() for lc in libs]
        with _blas.single_thread(_blas.MIN_KEYS):
            assert all(lc.get_num_threads() == 1 for lc in libs)
        assert [lc.get_num_threads() for lc in libs] == before
        with _blas.single_thread(_blas.MIN_KEYS - 1):  # small problems: no limit applied
            assert [lc.get_num_threads() for lc in libs] == before
