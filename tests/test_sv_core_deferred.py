"""The deferred maintained state (issue 36 item 2): a batch admission returns after the certified
solve; the kernel, bordered inverse and gradient are built by the first C&P step, and that step
ends exactly where the eagerly built state's would."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from sv_core import Gate, calibrate_C, solve
from sv_core.bench.solve import icu_like_keys
from sv_core.errors import PathError


def _keys(n: int, seed: int = 0) -> tuple[np.ndarray, float]:
    return icu_like_keys(n, np.random.default_rng(seed)), calibrate_C(0.3, n)


def _same(a: Gate, b: Gate) -> None:
    sa, sb = a.to_state(), b.to_state()
    assert sa.keys() == sb.keys()
    for k in sa:
        if isinstance(sa[k], np.ndarray):
            assert np.array_equal(sa[k], sb[k]), k
        else:
            assert sa[k] == sb[k], k


def test_a_batch_admission_builds_no_kernel_and_is_the_certified_solve():
    X, C = _keys(600)
    g = Gate(C, 3.0)
    g.admit(X)
    core = g._core
    assert core is not None and core.deferred and core.K.size == 0  # no n x n matrix, no inverse
    sol = solve(X, C, 3.0)
    assert np.array_equal(g.alpha, sol.alpha) and g.rho == sol.rho  # the same solve, bit for bit
    assert g.kkt_residual()["max"] <= 1e-12
    assert core.deferred and core.K.size == 0  # reading the residual built nothing either


def test_memory_of_a_batch_admission_stays_below_the_kernel():
    """The old admission built the n x n kernel (and the bordered inverse): its peak exceeded
    n^2 fp64 entries; the deferred one stays within a small fraction of it."""
    X, C = _keys(1500, 1)
    Gate(C, 3.0).admit(X)  # warm-up (imports, first-call allocations)
    tracemalloc.start()
    try:
        Gate(C, 3.0).admit(X)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 0.5 * X.shape[0] ** 2 * 8, peak


@pytest.mark.parametrize("step", ["forget", "admit", "forget_verified"])
def test_the_first_cp_step_ends_where_the_eager_state_would(step):
    """``from_state`` builds the maintained state eagerly from the same solution; the first C&P
    step on the deferred gate (which builds it there) gives the same state bit for bit."""
    X, C = _keys(200, 2)
    lazy = Gate(C, 3.0)
    lazy.admit(X)
    eager = Gate.from_state(lazy.to_state())
    assert not eager._core.deferred and lazy._core.deferred
    tid = int(lazy.support_ids()[0])
    new = X[:1] + 0.05
    for g in (lazy, eager):
        if step == "forget":
            g.forget(tid)
        elif step == "forget_verified":
            assert g.forget(tid, verify=True).verification["max_abs_score_dev"] <= 1e-9
        else:
            g.admit(new)
    assert not lazy._core.deferred
    _same(lazy, eager)
    assert np.array_equal(lazy._core.Rinv, eager._core.Rinv)
    assert np.array_equal(lazy._core.g[: lazy._core.n_slots], eager._core.g[: eager._core.n_slots])
    assert lazy.kkt_residual()["max"] <= 1e-12


def test_reserve_eviction_needs_no_kernel_and_the_state_carries_on():
    X, C = _keys(300, 3)
    g = Gate(C, 3.0)
    g.admit(X)
    cert = g.evict_reserve()
    assert cert.issued and cert.evicted and cert.max_abs_score_change == 0.0
    assert g._core.deferred and g._core.K.size == 0
    tid = int(g.support_ids()[0])
    r = g.forget(tid, verify=True)
    assert r.verification["max_abs_score_dev"] <= 1e-9 and g.kkt_residual()["max"] <= 1e-12


def test_a_failed_first_step_leaves_the_deferred_gate_as_it_was(monkeypatch):
    from sv_core import _gate_exact, solver
    from sv_core.errors import RefitError

    X, C = _keys(150, 4)
    g = Gate(C, 3.0)
    g.admit(X)
    before = g.to_state()

    def boom(self, c, mode, max_events=None):
        raise PathError("injected failure")

    def no_refit(*a, **k):
        raise RefitError("injected refit failure")

    monkeypatch.setattr(solver.MaintainedSVDD, "_sweep", boom)
    monkeypatch.setattr(_gate_exact, "refit", no_refit)
    with pytest.raises(PathError):
        g.forget(int(g.support_ids()[0]))
    with pytest.raises(PathError):
        g.admit(X[:2] - 0.3)
    monkeypatch.undo()
    after = g.to_state()
    for k in before:
        assert np.array_equal(np.asarray(before[k]), np.asarray(after[k])), k
    # (the maintained state built for the failed step may stay built: it holds the same solution)
    g.forget(int(g.support_ids()[0]))
    assert g.kkt_residual()["max"] <= 1e-12


def test_an_uncertain_certificate_is_judged_by_the_maintained_guard(monkeypatch):
    """A certificate above ``TIGHTEN_AT`` builds the maintained state at once and lets its guard
    decide (tightening or the exact fallback), as every maintained operation does."""
    from sv_core import certified_core

    real = certified_core.certified_solution

    def loose(at, **kw):
        sol = real(at, **kw)
        sol.certificate.kkt_violation = 5e-12
        return sol

    monkeypatch.setattr(certified_core, "certified_solution", loose)
    X, C = _keys(100, 5)
    g = Gate(C, 3.0)
    g.admit(X)
    assert g.cold_solve_log[-1]["method"] == "certified" and not g._core.deferred
    assert g.kkt_residual()["max"] <= 1e-12


def test_a_gate_from_a_given_solution_is_held_deferred_too():
    """``from_solution`` checks the solution on the kernel, then drops it (the retention study
    builds a gate per stay and only serialises it): nothing n x n stays behind."""
    X, C = _keys(400, 6)
    sol = solve(X, C, 3.0)
    g = Gate.from_solution(X, sol.alpha, C=C, sigma=3.0)
    assert g.gated and g._core.deferred and g._core.K.size == 0
    assert g.kkt_residual()["max"] <= 1e-12
    eager = Gate.from_state(g.to_state())
    tid = int(g.support_ids()[-1])
    g.forget(tid)
    eager.forget(tid)
    assert np.abs(g.score(X) - eager.score(X)).max() <= 1e-12 and g.kkt_residual()["max"] <= 1e-12


def test_first_solve_on_exact_repeats_never_leaves_twins_on_the_margin():
    """The redundant audit regime (exact repeats): a batch admit followed by two deletions
    completes on every trial, as before the state was deferred (the deferred load had left
    bit-identical twins on the margin: 'bordered KKT matrix is singular' in trials 12 and 39)."""
    from sv_core.audit import run_audit

    out = run_audit(trials=40, regimes=["redundant"], progress=False)
    r = out["regimes"]["redundant"]
    assert out["failures"] == [] and r["failed"] == 0 and r["completed_fallback"] == 0


def test_twins_on_the_margin_are_gathered_at_load():
    from sv_core import Gate, calibrate_C
    from sv_core.solver import MARGIN

    rng = np.random.default_rng(3)
    base = rng.standard_normal((30, 4))
    X = np.vstack([base, base[:10], base[:10]])  # every one of the first ten keys three times
    g = Gate(C=calibrate_C(nu=0.5, n0=len(X)), sigma=2.0)
    ids = g.admit(X)
    st = g.to_state()
    margin = np.asarray(st["status"]) == MARGIN
    keys = np.asarray(st["keys"])[margin]
    assert np.unique(keys, axis=0).shape[0] == keys.shape[0]  # at most one of each twin group
    for i in g.support_ids()[:3]:
        g.forget(int(i), verify=True)
    assert g.fallbacks == 0 and len(ids) == len(X)
