"""Exact maintained gate: KKT along streams, forget vs refit, admit∘forget, eviction, Example 3.1."""
from __future__ import annotations

import json

import numpy as np
import pytest

from sv_core import Gate, calibrate_C, rbf_kernel, refit


def _stream(seed, n=50, d=4):
    return np.random.default_rng(seed).normal(size=(n, d))


@pytest.mark.parametrize("seed", range(4))
def test_kkt_after_every_operation_on_random_stream(seed):
    rng = np.random.default_rng(100 + seed)
    X = _stream(seed)
    C = calibrate_C(0.4, 30)
    g = Gate(C=C, sigma=2.0)
    worst = 0.0
    for x in X:
        g.admit(x)
        if g.gated:
            worst = max(worst, g.kkt_residual()["max"])
            # occasionally delete a random live token
            if rng.random() < 0.3 and (g.n - 1) * C >= 1:
                g.forget(int(rng.choice(g.ids)))
                worst = max(worst, g.kkt_residual()["max"])
    assert g.gated
    assert worst < 1e-9, worst


@pytest.mark.parametrize("seed", range(6))
def test_forget_matches_independent_refit(seed):
    X = _stream(seed, n=40, d=6)
    C = calibrate_C(0.4, 40)
    g = Gate(C=C, sigma=2.0)
    g.admit(X)
    rng = np.random.default_rng(seed)
    for _ in range(2):
        tid = int(rng.choice(g.ids))
        r = g.forget(tid, verify=True)
        assert r.verification["max_abs_score_dev"] < 1e-8
        assert r.verification["kkt_residual"] < 1e-9
    a_ref, rho_ref = refit(g.keys, C=C, sigma=2.0)
    np.testing.assert_allclose(g.alpha, a_ref, atol=1e-8)
    assert abs(g.rho - rho_ref) < 1e-8


def test_gate_matches_refit_after_admission():
    X = _stream(7, n=60, d=3)
    C = calibrate_C(0.3, 60)
    g = Gate(C=C, sigma=1.5)
    g.admit(X[:30])
    g.admit(X[30:])
    a_ref, rho_ref = refit(X, C=C, sigma=1.5)
    np.testing.assert_allclose(g.alpha, a_ref, atol=1e-9)
    # gate score definition s(x) = 2 sum a k(x, x_i) - rho
    P = _stream(8, n=5, d=3)
    s = 2 * rbf_kernel(P, X, 1.5) @ a_ref - rho_ref
    np.testing.assert_allclose(g.score(P), s, atol=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_admit_then_forget_restores_prior_state(seed):
    X = _stream(seed, n=35, d=5)
    C = calibrate_C(0.4, 30)
    g = Gate(C=C, sigma=2.0)
    g.admit(X[:-1])
    a0, rho0, part0 = g.alpha.copy(), g.rho, g.partition()
    (new,) = g.admit(X[-1])
    g.forget(int(new))
    assert np.abs(g.alpha - a0).max() <= 1e-10
    assert abs(g.rho - rho0) <= 1e-10
    assert g.partition() == part0


def test_evict_reserve_leaves_readout_unchanged():
    X = _stream(3, n=80, d=4)
    V = np.random.default_rng(4).normal(size=(80, 3))
    g = Gate(C=calibrate_C(0.3, 80), sigma=2.0)
    ids = g.admit(X)
    Q = _stream(5, n=20, d=4)
    before = g.readout(Q, V)
    s_before = g.score(Q)
    cert = g.evict_reserve()
    assert cert.issued and len(cert.evicted) > 0
    keep = np.isin(ids, g.ids)
    after = g.readout(Q, V[keep])
    assert np.abs(after - before).max() <= 1e-12
    assert np.abs(g.score(Q) - s_before).max() <= 1e-12
    assert cert.max_abs_score_change <= 1e-12 and cert.max_abs_weight_change <= 1e-12
    assert set(cert.evicted).isdisjoint(set(g.ids.tolist()))


def test_example_3_1_published_numbers():
    """SPEC Example 3.1 (seed 001 Example 1)."""
    X = np.array([[-1.0, 0.0], [1.0, 0.0], [0.0, 0.9]])
    V = np.array([1.0, 2.0, 9.0])
    q = np.array([0.25, 0.1])
    full = Gate(C=1.0, sigma=5.0)
    pruned = Gate(C=1.0, sigma=5.0)
    full.admit(X)
    pruned.admit(X)
    np.testing.assert_allclose(full.alpha, [0.5, 0.5, 0.0], atol=1e-15)
    assert full.partition()["reserve"] == [2]
    o_before = pruned.readout(q, V)
    cert = pruned.evict_reserve()
    assert cert.evicted == [2]
    assert abs(pruned.readout(q, V[:2])[0] - o_before[0]) == 0.0
    full.admit([0.0, -10.0])
    pruned.admit([0.0, -10.0])
    assert full.alpha[2] == pytest.approx(0.03327001, abs=5e-9)
    P = np.vstack([X, [[0.0, -10.0]]])
    dev = np.abs(full.score(P) - pruned.score(P)).max()
    assert dev == pytest.approx(4.07857e-3, abs=5e-9)


def test_ids_are_stable_and_receipt_is_json():
    g = Gate(C=calibrate_C(0.5, 20), sigma=2.0)
    ids = g.admit(_stream(1, n=20, d=3))
    assert ids.tolist() == list(range(20))
    r = g.forget(5, verify=True)
    assert 5 not in g.ids.tolist() and g.ids.tolist() == [i for i in range(20) if i != 5]
    more = g.admit(_stream(2, n=2, d=3))
    assert more.tolist() == [20, 21]
    d = json.loads(r.to_json())
    for key in ("token_id", "C", "sigma", "n_before", "n_after", "partition_before",
                "partition_after", "path_events", "elapsed_s", "verification"):
        assert key in d
    assert d["n_before"] == 20 and d["n_after"] == 19 and d["token_id"] == 5
    assert d["verification"]["max_abs_score_dev"] < 1e-8


def test_warmup_is_ungated_and_issues_no_certificate():
    C = 0.25  # warm-up size ceil(4) + 2 = 6
    g = Gate(C=C, sigma=2.0)
    X = _stream(0, n=6, d=2)
    g.admit(X[:5])
    assert not g.gated and g.warmup_size == 6
    V = np.arange(5.0)
    q = X[0]
    k = rbf_kernel(q[None], X[:5], 2.0)[0]
    assert g.readout(q, V)[0] == pytest.approx((k @ V) / k.sum(), abs=1e-14)
    cert = g.evict_reserve()
    assert not cert.issued and cert.evicted == []
    g.admit(X[5])
    assert g.gated and g.kkt_residual()["max"] < 1e-10


def test_serialisation_roundtrip_preserves_state_and_forget():
    X = _stream(9, n=40, d=3)
    g = Gate(C=calibrate_C(0.4, 40), sigma=2.0)
    g.admit(X)
    g.forget(3)
    h = Gate.from_state(g.to_state())
    assert h.ids.tolist() == g.ids.tolist()
    np.testing.assert_array_equal(h.alpha, g.alpha)
    r1 = g.forget(10)
    r2 = h.forget(10)
    assert np.abs(g.alpha - h.alpha).max() < 1e-12
    assert r1.path_events == r2.path_events


def test_decrement_completes_when_margin_set_empties():
    """C = 1/5 makes all-error states (S empty, |E| C = 1) reachable; deletion must still complete."""
    rng = np.random.default_rng(11)
    completed = 0
    for _trial in range(25):
        X = rng.normal(size=(12, 2)) * rng.uniform(0.3, 3.0)
        g = Gate(C=0.2, sigma=1.0)
        g.admit(X)
        for tid in rng.choice(g.ids, size=3, replace=False):
            r = g.forget(int(tid), verify=True)
            assert r.verification["max_abs_score_dev"] < 1e-8
        completed += 1
    assert completed == 25


def test_duplicate_keys_score_agreement():
    base = np.random.default_rng(2).normal(size=(10, 3))
    X = np.vstack([base, base[:5] + 1e-9, base[:5]])
    g = Gate(C=calibrate_C(0.4, 20), sigma=2.0)
    g.admit(X)
    r = g.forget(0, verify=True)
    assert r.verification["max_abs_score_dev"] < 1e-7


@pytest.mark.parametrize("draw", range(8))
def test_many_exact_duplicates_reach_the_refit_optimum(draw):
    """Regression: repeated hourly keys (exact duplicates) used to leave a non-optimal state."""
    rng = np.random.default_rng(0)
    for _ in range(draw + 1):
        X = np.repeat(rng.normal(size=(40, 6)), 3, 0)[:100]
    C = calibrate_C(0.3, 100)
    g = Gate(C, 3.0)
    g.admit(X)
    assert g.kkt_residual()["max"] < 1e-9
    a, rho = refit(X, C=C, sigma=3.0)
    assert np.abs(g.score(X) - (2 * rbf_kernel(X, X, 3.0) @ a - rho)).max() < 1e-9
    # memory order of the input must not matter
    h = Gate(C, 3.0)
    h.admit(np.asfortranarray(X))
    assert np.abs(h.score(X) - g.score(X)).max() < 1e-12
    for tid in rng.choice(g.ids, size=3, replace=False):
        assert g.forget(int(tid), verify=True).verification["max_abs_score_dev"] < 1e-9


def test_near_duplicate_regime_deletions_match_refit(monkeypatch):
    """Near-twins (1e-6 jitter) reaching the margin set beside a twin swap in instead of making
    the bordered system near-singular; before, 1 in 3 such audit trials raised PathError or drifted
    from the refit by up to 2e-2."""
    import sv_core.gate
    from sv_core.audit import run_audit
    from sv_core.solver import MaintainedSVDD

    calls = []
    orig = MaintainedSVDD._swap_near_twin
    monkeypatch.setattr(MaintainedSVDD, "_swap_near_twin",
                        lambda self, *a: (calls.append(a), orig(self, *a))[1])
    # the first solve of each trial's batch by the certified solve (the default), then settling
    # its keys one by one on the C&P path, where the near-twin swap is exercised
    for min_keys in (sv_core.gate.CERTIFIED_MIN_KEYS, 10**9):
        monkeypatch.setattr(sv_core.gate, "CERTIFIED_MIN_KEYS", min_keys)
        res = run_audit(trials=25, regimes=["duplicates"], progress=False)
        s = res["regimes"]["duplicates"]
        assert res["failures"] == []
        assert s["completed"] == 25
        assert s["score_dev_worst"] <= 1e-12
        assert s["kkt_residual_worst"] <= 1e-12
    assert calls  # the near-twin swap was exercised


def test_exact_duplicate_keys_are_recognised_by_equality():
    """Bit-equal keys take the exact-twin path (pinned gradient / mass transfer); a key 1e-7 away
    is a near-twin, not a duplicate, even though its feature distance^2 (2.5e-15) < DUPLICATE_TOL."""
    from sv_core.solver import MARGIN, Degenerate, MaintainedSVDD

    core = MaintainedSVDD(C=0.5, sigma=2.0, dim=2)
    core.append(np.array([[0.0, 0.0], [3.0, 0.0], [0.0, 0.0], [1e-7, 0.0]]))
    core.S = [0]
    core.status[0] = MARGIN
    core.refactor()
    with pytest.raises(Degenerate) as exact:
        core._border_add(2, near_tol=1e-9)
    assert exact.value.args == (2, 0)
    with pytest.raises(Degenerate) as near:
        core._border_add(3, near_tol=1e-9)
    assert near.value.args == (3, 0, "near")
    core._border_add(1, near_tol=1e-9)  # a distinct key joins normally
    assert core.S == [0, 1]


# ---------------------------------------------------------------------------------------- from_solution
@pytest.mark.parametrize("dup", [False, True])
def test_from_solution_matches_the_maintained_path_and_keeps_working(dup):
    """A gate built from the independent refit's solution is the maintained path's gate (scores,
    partition), is KKT-exact, and supports verified deletions and admissions afterwards."""
    rng = np.random.default_rng(7)
    X = rng.normal(size=(60, 5))
    if dup:
        X[10:14] = X[3]  # exact repeats: their mass is consolidated
    C = calibrate_C(0.4, 60)
    a_ref, _ = refit(X, C=C, sigma=2.0)
    g = Gate.from_solution(X, a_ref, C=C, sigma=2.0)
    h = Gate(C=C, sigma=2.0)
    h.admit(X)
    assert g.gated and g.fallbacks == 0
    assert np.array_equal(g.ids, np.arange(60))
    assert g.kkt_residual()["max"] <= 1e-9
    P = np.vstack([X, X + 0.1 * rng.normal(size=X.shape)])
    assert np.abs(g.score(P) - h.score(P)).max() <= 1e-9
    if not dup:
        assert g.partition() == h.partition()
    for tid in rng.choice(g.support_ids(), size=3, replace=False):
        assert g.forget(int(tid), verify=True).verification["max_abs_score_dev"] <= 1e-9
    g.admit(rng.normal(size=(3, 5)))
    assert g.kkt_residual()["max"] <= 1e-9


def test_from_solution_with_a_wrong_alpha_solves_by_the_path():
    """A feasible but non-optimal alpha does not pass the KKT guard: the gate is solved by the
    maintained path instead (still exact); malformed alpha is a typed error."""
    from sv_core.errors import InvalidKeysError

    X = np.random.default_rng(8).normal(size=(40, 4))
    C = calibrate_C(0.4, 40)
    g = Gate.from_solution(X, np.full(40, 1.0 / 40), C=C, sigma=2.0)
    a_ref, _ = refit(X, C=C, sigma=2.0)
    assert g.kkt_residual()["max"] <= 1e-9
    assert np.abs(g.alpha - a_ref).max() <= 1e-8
    with pytest.raises(InvalidKeysError):
        Gate.from_solution(X, np.ones(39), C=C, sigma=2.0)
    with pytest.raises(InvalidKeysError):
        Gate.from_solution(X, np.full(40, np.nan), C=C, sigma=2.0)


def test_retention_solves_each_stay_once(monkeypatch):
    """The retention study builds the persisted gate from the retention solve: one solve per stay
    (one certified solve, no refit, no maintained-path initialisation), and the gate matches it."""
    import sv_core
    from evaluation.clinical.retention import DEFAULT_POLICIES, build_policies, stay_retention
    from sv_core.solver import MaintainedSVDD

    calls = {"solve": 0, "refit": 0, "initialise": 0}
    real_solve, real_refit, real_init = sv_core.solve, sv_core.refit, MaintainedSVDD.initialise

    def counting(name, real):
        def f(*a, **k):
            calls[name] += 1
            return real(*a, **k)
        return f

    monkeypatch.setattr(sv_core, "solve", counting("solve", real_solve))
    monkeypatch.setattr(sv_core, "refit", counting("refit", real_refit))
    monkeypatch.setattr(MaintainedSVDD, "initialise", counting("initialise", real_init))
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 6))
    events = np.zeros(50, bool)
    events[[2, 9]] = True
    r = stay_retention(X, events, build_policies(DEFAULT_POLICIES, nu=0.3, sigma=3.0), build_gate=True)
    assert calls == {"solve": 1, "refit": 0, "initialise": 0}
    assert r["gate_score_dev"] <= 1e-9 and r["gate_alpha_dev"] <= 1e-9
    assert r["gate"].kkt_residual()["max"] <= 1e-9
