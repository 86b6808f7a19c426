"""Every bad input gets a typed error and leaves the gate exactly as it was."""
from __future__ import annotations

import numpy as np
import pytest

from sv_core import (
    Gate,
    InfeasibleError,
    InvalidKeysError,
    InvalidParameterError,
    UnknownTokenError,
    calibrate_C,
    refit,
)
from sv_core.errors import GateError, PathError


def _gate():
    g = Gate(C=calibrate_C(0.4, 25), sigma=2.0)
    g.admit(np.random.default_rng(0).normal(size=(25, 4)))
    g.forget(3)
    return g


def _fingerprint(g):
    st = g.to_state()
    return {k: (v.tobytes() if isinstance(v, np.ndarray) else v) for k, v in st.items()}


@pytest.mark.parametrize("C", [0.0, -0.1, 1.5, float("nan"), float("inf"), "x"])
def test_bad_C(C):
    with pytest.raises(InvalidParameterError):
        Gate(C=C, sigma=1.0)


@pytest.mark.parametrize("sigma", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_sigma(sigma):
    with pytest.raises(InvalidParameterError):
        Gate(C=0.1, sigma=sigma)


@pytest.mark.parametrize("nu,n0", [(0.0, 10), (1.5, 10), (0.5, 0), (0.5, 2.5)])
def test_bad_calibration(nu, n0):
    with pytest.raises(InvalidParameterError):
        calibrate_C(nu, n0)


@pytest.mark.parametrize(
    "bad",
    [
        np.array([[np.nan, 0, 0, 0]]),
        np.array([[np.inf, 0, 0, 0]]),
        np.zeros((2, 3)),          # wrong dimension
        np.zeros((2, 2, 4)),       # wrong rank
        [["a", "b", "c", "d"]],    # not numeric
    ],
)
def test_bad_keys_leave_state_unchanged(bad):
    g = _gate()
    before = _fingerprint(g)
    with pytest.raises(InvalidKeysError):
        g.admit(bad)
    after = _fingerprint(g)
    assert before.keys() == after.keys()
    for k in before:
        assert before[k] == after[k], k


def test_batch_with_one_nan_row_admits_nothing():
    g = _gate()
    n = g.n
    X = np.random.default_rng(1).normal(size=(5, 4))
    X[3, 2] = np.nan
    with pytest.raises(InvalidKeysError, match="NaN or inf"):
        g.admit(X)
    assert g.n == n


def test_unknown_and_repeated_ids():
    g = _gate()
    before = _fingerprint(g)
    with pytest.raises(UnknownTokenError, match="already forgotten"):
        g.forget(3)
    with pytest.raises(UnknownTokenError, match="not in the gate"):
        g.forget(999)
    with pytest.raises(UnknownTokenError):
        g.forget("abc")
    assert _fingerprint(g) == before


def test_infeasible_deletion_is_refused_without_change():
    g = Gate(C=0.2, sigma=1.0)  # needs n >= 5
    g.admit(np.random.default_rng(3).normal(size=(7, 2)))
    g.forget(0)
    g.forget(1)
    before = _fingerprint(g)
    with pytest.raises(InfeasibleError, match=r"\(n-1\)\*C"):
        g.forget(2)
    assert _fingerprint(g) == before


def test_failed_path_takes_the_exact_fallback_and_records_it(monkeypatch):
    g = _gate()
    from sv_core import solver

    def boom(self, c, mode, max_events=None):
        self.alpha[c] = 123.0  # scribble, then fail mid-path
        raise PathError("injected failure")

    monkeypatch.setattr(solver.MaintainedSVDD, "_sweep", boom)
    active = g.partition()["margin"][0]
    r = g.forget(active)
    assert r.fallback and "injected failure" in r.fallback_reason
    assert g.fallbacks == 1 and g.fallback_log[-1]["op"] == "forget"
    assert g.kkt_residual()["max"] <= 1e-9
    a, rho = refit(g.keys, C=g.C, sigma=g.sigma)
    from sv_core import rbf_kernel
    assert np.abs(g.score(g.keys) - (2 * rbf_kernel(g.keys, g.keys, g.sigma) @ a - rho)).max() <= 1e-9
    ids = g.admit(np.random.default_rng(5).normal(size=(1, 4)) * 10)
    assert g.fallbacks in (1, 2) and ids.size == 1  # a reserve admission needs no sweep


def test_failed_path_and_failed_fallback_restore_state_bit_for_bit(monkeypatch):
    g = _gate()
    before = _fingerprint(g)
    from sv_core import _gate_exact as gate_exact_mod
    from sv_core import _gate_forget as forget_mod
    from sv_core import solver
    from sv_core.errors import RefitError

    def boom(self, c, mode, max_events=None):
        self.alpha[c] = 123.0
        raise PathError("injected failure")

    def no_refit(*a, **k):
        raise RefitError("injected refit failure")

    monkeypatch.setattr(solver.MaintainedSVDD, "_sweep", boom)
    monkeypatch.setattr(forget_mod, "refit", no_refit)  # the deletion's verification oracle
    monkeypatch.setattr(gate_exact_mod, "refit", no_refit)  # the exact fallback's oracle
    active = g.partition()["margin"][0]
    with pytest.raises(PathError, match="exact fallback failed"):
        g.forget(active)
    assert _fingerprint(g) == before
    with pytest.raises(PathError):
        g.admit(np.random.default_rng(5).normal(size=(1, 4)) * 0.01)
    assert _fingerprint(g) == before


def test_forget_many_is_all_or_nothing():
    g = _gate()
    before = _fingerprint(g)
    with pytest.raises(UnknownTokenError):
        g.forget_many([4, 5, 999])
    with pytest.raises(UnknownTokenError):
        g.forget_many([4, 4])
    assert _fingerprint(g) == before


def test_refit_errors():
    with pytest.raises(InfeasibleError):
        refit(np.zeros((3, 2)), C=0.1, sigma=1.0)
    with pytest.raises(InvalidKeysError):
        refit(np.array([[np.nan, 1.0]] * 20), C=0.1, sigma=1.0)
    assert issubclass(InfeasibleError, GateError)
