"""StreamingGate: bounded hot tier + cold tier with a full-history (future-safe) certificate."""
from __future__ import annotations

import io

import numpy as np
import pytest

from sv_core import Gate, calibrate_C, rbf_kernel, refit
from sv_core.errors import GateError, InfeasibleError, InvalidKeysError, PathError, UnknownTokenError
from sv_core.gate import WarmupError
from sv_core.streaming import ColdStore, InvalidStateError, StreamingGate
from sv_core.streaming.reference import ReferenceStream

EX_X = np.array([[-1.0, 0.0], [1.0, 0.0], [0.0, 0.9]])


def _drift_stream(seed, n=240, d=4, step=0.08):
    rng = np.random.default_rng(seed)
    drift = np.cumsum(rng.normal(scale=step, size=(n, d)), axis=0)
    return drift + rng.normal(size=(n, d))


def _assert_full_history(sg, C, sigma, tol=1e-9, probes=None):
    """alpha (cold = 0) and scores equal a from-scratch refit over every live token."""
    X = sg.keys
    a_ref, rho_ref = refit(X, C=C, sigma=sigma)
    assert np.abs(sg.alpha - a_ref).max() <= tol
    assert abs(sg.rho - rho_ref) <= tol
    P = X if probes is None else np.vstack([X, probes])
    s_ref = 2.0 * rbf_kernel(P, X, sigma) @ a_ref - rho_ref
    assert np.abs(sg.score(P) - s_ref).max() <= tol


def _state_equal(a: dict, b: dict) -> bool:
    if set(a) != set(b):
        return False
    for k in a:
        x, y = np.asarray(a[k]), np.asarray(b[k])
        if x.dtype != y.dtype or x.shape != y.shape or not np.array_equal(x, y):
            return False
    return True


# ---------------------------------------------------------------------- acceptance: Example 3.1
def test_example_3_1_evicted_key_is_readmitted_and_matches_full_history():
    q = np.array([0.25, 0.1])
    sg = StreamingGate(C=1.0, sigma=5.0)
    ids = sg.admit(EX_X)
    assert ids.tolist() == [0, 1, 2]
    np.testing.assert_allclose(sg.alpha, [0.5, 0.5, 0.0], atol=1e-15)
    o_before = sg.readout(q, [1.0, 2.0, 9.0])
    cert = sg.evict_reserve()
    assert cert["issued"] and cert["future_safe"] and cert["evicted"] == [2]
    assert sg.cold_ids.tolist() == [2] and sg.hot_ids.tolist() == [0, 1]
    assert sg.ids.tolist() == [0, 1, 2] and sg.alpha[2] == 0.0
    assert abs(sg.readout(q, [1.0, 2.0, 9.0])[0] - o_before[0]) == 0.0  # V aligned with ids
    new = sg.admit([0.0, -10.0])
    assert new.tolist() == [3]
    assert sg.cold_ids.tolist() == [] and sg.hot_ids.tolist() == [0, 1, 2, 3]
    assert sg.alpha[2] == pytest.approx(0.03327001, abs=5e-9)
    full = Gate(C=1.0, sigma=5.0)
    full.admit(EX_X)
    full.admit([0.0, -10.0])
    pruned = Gate(C=1.0, sigma=5.0)
    pruned.admit(EX_X)
    pruned.evict_reserve()
    pruned.admit([0.0, -10.0])
    P = np.vstack([EX_X, [[0.0, -10.0]]])
    assert np.abs(sg.score(P) - full.score(P)).max() <= 1e-12
    assert np.abs(pruned.score(P) - full.score(P)).max() == pytest.approx(4.07857e-3, abs=5e-9)
    c = sg.certificate()
    assert c["future_safe"] and c["readmissions"] == 1 and c["kkt_residual"]["max"] <= 1e-12
    _assert_full_history(sg, 1.0, 5.0, tol=1e-12)


# ---------------------------------------------------------------------- long streams vs refit
@pytest.mark.parametrize("seed", range(3))
def test_long_stream_with_eviction_and_deletions_matches_refit(seed):
    C, sigma = calibrate_C(0.3, 60), 1.5
    X = _drift_stream(seed)
    rng = np.random.default_rng(50 + seed)
    sg = StreamingGate(C=C, sigma=sigma)
    n_hot_forgets = n_cold_forgets = 0
    probes = _drift_stream(99 + seed, n=20)
    for b, lo in enumerate(range(0, X.shape[0], 12)):
        sg.admit(X[lo:lo + 12])
        cert = sg.evict_reserve()
        if sg.gated:
            assert cert["future_safe"], cert["reason"]
        if b % 3 == 2 and sg.n_cold:
            sg.forget(int(rng.choice(sg.cold_ids)))
            n_cold_forgets += 1
        if b % 3 == 1 and sg.gated:
            tid = int(rng.choice(sg.hot_ids))
            r = sg.forget(tid)
            assert r["tier"] == "hot" and r["hot_receipt"]["token_id"] == tid
            n_hot_forgets += 1
        if b % 5 == 4:
            _assert_full_history(sg, C, sigma, probes=probes)
    _assert_full_history(sg, C, sigma, probes=probes)
    c = sg.certificate()
    assert c["future_safe"] and c["kkt_residual"]["max"] <= 1e-10
    assert c["readmissions"] > 0 and n_hot_forgets > 0 and n_cold_forgets > 0
    assert 0 < sg.n_hot < 0.6 * sg.n and sg.n_cold > 0
    assert sorted(sg.hot_ids.tolist() + sg.cold_ids.tolist()) == sg.ids.tolist()


def test_fast_path_matches_slow_reference_after_every_operation():
    C, sigma = calibrate_C(0.4, 25), 1.5
    X = _drift_stream(7, n=110, d=3, step=0.15)
    rng = np.random.default_rng(3)
    sg, ref = StreamingGate(C=C, sigma=sigma), ReferenceStream(C=C, sigma=sigma)
    pos, steps, kinds = 0, 0, set()
    while pos < X.shape[0]:
        u = rng.random()
        if u < 0.55 or not sg.gated:
            k = int(rng.integers(1, 5))
            a, b = sg.admit(X[pos:pos + k]), ref.admit(X[pos:pos + k])
            assert a.tolist() == b.tolist()
            pos += k
            kinds.add("admit")
        elif u < 0.75:
            sg.evict_reserve()
            kinds.add("evict")
        elif (sg.n - 1) * C >= 1:
            tier = "cold" if (u < 0.87 and sg.n_cold) else "hot"
            tid = int(rng.choice(sg.cold_ids if tier == "cold" else sg.hot_ids))
            sg.forget(tid)
            ref.forget(tid)
            kinds.add("forget_" + tier)
        if sg.gated:
            steps += 1
            assert sg.ids.tolist() == ref.ids.tolist()
            assert np.abs(sg.alpha - ref.alpha).max() <= 1e-9
            assert np.abs(sg.score(X[:pos]) - ref.score(X[:pos])).max() <= 1e-9
    assert steps > 40 and kinds == {"admit", "evict", "forget_hot", "forget_cold"}
    assert sg.certificate()["readmissions"] > 0


# ---------------------------------------------------------------------- screening
def _exact_cold_g(sg, keys):
    """g_j = rho - 1 + 2 sum_hot alpha_i k(x_j, x_i), from the public hot-gate view."""
    hot = sg.hot_gate
    return hot.rho - 1.0 + 2.0 * rbf_kernel(keys, hot.keys, sg.sigma) @ hot.alpha


def test_screening_bound_is_safe_and_skips_most_cold_keys():
    C, sigma = calibrate_C(0.3, 60), 1.5
    X = _drift_stream(11, n=300)
    fast, exact = StreamingGate(C=C, sigma=sigma), StreamingGate(C=C, sigma=sigma, screen=False)
    for lo in range(0, X.shape[0], 10):
        for sg in (fast, exact):
            sg.admit(X[lo:lo + 10])
            sg.evict_reserve()
        # the stored screening bound is a lower bound on every free cold key's exact gradient
        st = fast.to_state()
        if st["cold_ids"].size:
            g = _exact_cold_g(fast, st["cold_keys"])
            drift = np.minimum(st["A"] - st["cold_A0"], st["B"] - st["cold_B0"])
            bound = st["cold_g0"] + (fast.rho - st["cold_rho0"]) - 2.0 * drift
            assert np.all(bound <= g + 1e-12)
        # screening never changes a decision: identical states
        assert fast.ids.tolist() == exact.ids.tolist()
        assert fast.hot_ids.tolist() == exact.hot_ids.tolist()
        np.testing.assert_array_equal(fast.alpha, exact.alpha)
    s = fast.certificate()["screening"]
    assert s["fraction_screened"] > 0.3 and exact.certificate()["screening"]["fraction_screened"] == 0.0
    assert fast.certificate()["readmissions"] == exact.certificate()["readmissions"] > 0


# ---------------------------------------------------------------------- state
def _small_stream_gate(store=None):
    C, sigma = calibrate_C(0.3, 40), 1.5
    sg = StreamingGate(C=C, sigma=sigma, store=store)
    X = _drift_stream(5, n=120, d=3)
    for lo in range(0, 120, 15):
        sg.admit(X[lo:lo + 15])
        sg.evict_reserve()
    sg.forget(int(sg.cold_ids[0]))
    sg.forget(int(sg.hot_ids[-1]))
    return sg, X


def test_state_roundtrip_through_npz_keeps_both_tiers_and_future_behaviour():
    sg, X = _small_stream_gate()
    assert sg.n_cold > 0
    buf = io.BytesIO()
    np.savez(buf, **sg.to_state())
    buf.seek(0)
    loaded = dict(np.load(buf, allow_pickle=False))
    sg2 = StreamingGate.from_state(loaded)
    assert sg2.ids.tolist() == sg.ids.tolist() and sg2.cold_ids.tolist() == sg.cold_ids.tolist()
    np.testing.assert_array_equal(sg2.alpha, sg.alpha)
    np.testing.assert_array_equal(sg2.keys, sg.keys)
    assert sg2.rho == sg.rho and sg2.certificate()["screening"] == sg.certificate()["screening"]
    extra = _drift_stream(6, n=30, d=3) + 2.0
    for g in (sg, sg2):
        g.admit(extra)
        g.evict_reserve()
        g.forget(int(g.cold_ids[1]))
    # the reloaded hot gate refactorises its bordered inverse: equal up to rounding afterwards
    assert np.abs(sg2.alpha - sg.alpha).max() <= 1e-12
    assert sg2.ids.tolist() == sg.ids.tolist() and sg2.cold_ids.tolist() == sg.cold_ids.tolist()


@pytest.mark.parametrize("tamper", ["missing", "format", "overlap", "cold_key_moved", "bad_bound",
                                    "nan_key", "shape"])
def test_from_state_rejects_malformed_states(tamper):
    sg, _ = _small_stream_gate()
    st = sg.to_state()
    if tamper == "missing":
        del st["cold_keys"]
    elif tamper == "format":
        st["format"] = "something/else"
    elif tamper == "overlap":
        st["cold_ids"] = st["cold_ids"].copy()
        st["cold_ids"][0] = st["hot_stream_ids"][0]
        st["cold_ids"].sort()
    elif tamper == "cold_key_moved":  # a cold key far outside: its g < 0, KKT over history fails
        st["cold_keys"] = st["cold_keys"].copy()
        st["cold_keys"][0] += 25.0
    elif tamper == "bad_bound":  # a screening record claiming more slack than there is
        st["cold_g0"] = st["cold_g0"].copy() + 10.0
    elif tamper == "nan_key":
        st["cold_keys"] = st["cold_keys"].copy()
        st["cold_keys"][1, 0] = np.nan
    elif tamper == "shape":
        st["cold_g0"] = st["cold_g0"][:-1]
    with pytest.raises(InvalidStateError) as e:
        StreamingGate.from_state(st)
    assert isinstance(e.value, GateError)
    StreamingGate.from_state(sg.to_state())  # the untampered state loads


# ---------------------------------------------------------------------- bad input, rollback
@pytest.mark.parametrize("case", ["nan", "dim", "unknown", "forgotten", "bool_id", "str_id", "infeasible"])
def test_bad_input_is_typed_and_leaves_state_bit_identical(case):
    sg, _ = _small_stream_gate()
    if case == "infeasible":
        sg = StreamingGate(C=0.5, sigma=2.0)
        sg.admit(np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
        sg.evict_reserve()
        sg.forget(int(sg.ids[0]))
        sg.forget(int(sg.ids[0]))  # two keys left, C = 0.5: one more would be infeasible
    forgotten = sorted(set(range(int(sg.to_state()["next_id"]))) - set(sg.ids.tolist()))
    before = sg.to_state()
    err, call = {
        "nan": (InvalidKeysError, lambda: sg.admit([[np.nan, 0.0, 0.0], [0.0, 0.0, 0.0]])),
        "dim": (InvalidKeysError, lambda: sg.admit(np.zeros((2, 5)))),
        "unknown": (UnknownTokenError, lambda: sg.forget(10_000)),
        "forgotten": (UnknownTokenError, lambda: sg.forget(forgotten[0] if forgotten else -1)),
        "bool_id": (UnknownTokenError, lambda: sg.forget(True)),
        "str_id": (UnknownTokenError, lambda: sg.forget("3")),
        "infeasible": (InfeasibleError, lambda: sg.forget(int(sg.ids[0]))),
    }[case]
    with pytest.raises(err):
        call()
    assert _state_equal(before, sg.to_state())


def test_failure_during_readmission_rolls_back_both_tiers(monkeypatch):
    sg = StreamingGate(C=1.0, sigma=5.0)
    sg.admit(EX_X)
    sg.evict_reserve()
    before = sg.to_state()
    hot = sg.hot_gate
    real_admit = Gate.admit
    calls = []

    def flaky(self, X):
        calls.append(1)
        if self is hot and len(calls) == 2:  # the re-admission of the cold key
            raise PathError("injected failure")
        return real_admit(self, X)

    monkeypatch.setattr(Gate, "admit", flaky)
    with pytest.raises(PathError):
        sg.admit([0.0, -10.0])
    monkeypatch.setattr(Gate, "admit", real_admit)
    assert len(calls) == 2
    assert _state_equal(before, sg.to_state())
    assert sg.cold_ids.tolist() == [2] and len(sg.cold_store) == 1
    sg.admit([0.0, -10.0])  # and the gate still works: key 2 comes back
    assert sg.alpha[2] == pytest.approx(0.03327001, abs=5e-9)


# ---------------------------------------------------------------------- warm-up, budget, padding
def test_warmup_evicts_nothing_and_has_no_certificate():
    sg = StreamingGate(C=0.25, sigma=2.0)  # warm-up size ceil(4) + 2 = 6
    X = np.random.default_rng(0).normal(size=(6, 2))
    sg.admit(X[:5])
    assert not sg.gated
    cert = sg.evict_reserve()
    assert not cert["issued"] and not cert["future_safe"] and cert["evicted"] == []
    assert sg.n_cold == 0 and not sg.certificate()["future_safe"]
    with pytest.raises(WarmupError):
        sg.score(X)
    k = rbf_kernel(X[:1], X[:5], 2.0)[0]
    assert sg.readout(X[0], np.arange(5.0))[0] == pytest.approx(k @ np.arange(5.0) / k.sum(), abs=1e-14)
    sg.forget(4)  # warm-up deletion: no solve, no padding
    sg.admit(X[4:6])
    assert sg.gated and sg.certificate()["future_safe"]


def test_hot_budget_is_an_uncertified_policy_and_says_so():
    C, sigma = calibrate_C(0.3, 40), 1.5
    X = _drift_stream(2, n=200, d=3, step=0.2)
    budget = StreamingGate(C=C, sigma=sigma).warmup_size + 3
    sg = StreamingGate(C=C, sigma=sigma, hot_budget=budget)
    for lo in range(0, 200, 20):
        sg.admit(X[lo:lo + 20])
        cert = sg.evict_reserve()
        assert sg.n_hot <= budget
    assert cert["budget_evicted"] or sg.certificate()["n_pinned"] > 0
    c = sg.certificate()
    assert not c["future_safe"] and "UNCERTIFIED" in c["reason"] and c["uncertified_evictions"] > 0
    assert c["kkt_residual"]["pinned"] > 1e-6  # the policy really departs from the full history
    a_ref, _ = refit(sg.keys, C=C, sigma=sigma)
    assert np.abs(a_ref - sg.alpha).max() > 1e-6
    pinned = [int(i) for i in sg.cold_ids if sg.tier_of(int(i)) == "pinned"]
    for i in pinned:
        sg.forget(i)
    c = sg.certificate()
    assert c["n_pinned"] == 0 and c["future_safe"]  # certified again over the remaining tokens
    _assert_full_history(sg, C, sigma)


@pytest.mark.parametrize("bad", [3, 2.5, "40", True])
def test_bad_hot_budget_is_typed(bad):
    from sv_core.errors import InvalidParameterError

    with pytest.raises(InvalidParameterError):
        StreamingGate(C=calibrate_C(0.3, 40), sigma=1.5, hot_budget=bad)


@pytest.mark.parametrize("bad", [-1, 2.5, "40", True, None])
def test_bad_cache_entries_is_typed(bad):
    from sv_core.errors import InvalidParameterError

    with pytest.raises(InvalidParameterError):
        StreamingGate(C=calibrate_C(0.3, 40), sigma=1.5, cache_entries=bad)


def test_forget_hot_key_pads_from_cold_when_the_hot_gate_would_be_infeasible():
    rng = np.random.default_rng(16)
    sg = StreamingGate(C=0.3, sigma=10.0)
    sg.admit(rng.uniform(size=(20, 1)))
    sg.evict_reserve()
    assert sg.n_hot == 4  # (4 - 1) * 0.3 < 1: the hot gate alone cannot lose a key
    r = sg.forget(int(sg.hot_ids[0]))
    assert r["tier"] == "hot" and len(r["padded_from_cold"]) >= 1
    _assert_full_history(sg, 0.3, 10.0, tol=1e-12)
    assert sg.certificate()["future_safe"]


# ---------------------------------------------------------------------- store, readout
class DictStore(ColdStore):
    def __init__(self):
        self.d = {}

    def add(self, ids, keys):
        for i, k in zip(np.asarray(ids).tolist(), np.asarray(keys)):
            assert i not in self.d
            self.d[i] = k.copy()

    def remove(self, ids):
        return np.asarray([self.d.pop(int(i)) for i in ids])

    def get(self, ids):
        try:
            return np.asarray([self.d[int(i)] for i in ids]).reshape(len(ids), -1)
        except KeyError as exc:
            raise UnknownTokenError(str(exc)) from exc

    def ids(self):
        return np.asarray(sorted(self.d), dtype=np.int64)


def test_pluggable_store_gives_identical_results():
    a, _ = _small_stream_gate()
    store = DictStore()
    b, _ = _small_stream_gate(store=store)
    np.testing.assert_array_equal(a.alpha, b.alpha)
    assert sorted(store.d) == b.cold_ids.tolist() == a.cold_ids.tolist()
    np.testing.assert_array_equal(store.get(b.cold_ids), a.cold_store.get(a.cold_ids))


def test_readout_from_hot_tier_equals_full_history_readout():
    sg, X = _small_stream_gate()
    Q = _drift_stream(8, n=7, d=3)
    keys = sg.keys
    V = np.random.default_rng(1).normal(size=(sg.n, 2))
    a_ref, _ = refit(keys, C=sg.C, sigma=sg.sigma)
    W = rbf_kernel(Q, keys, sg.sigma) * a_ref
    o_ref = (W @ V) / W.sum(axis=1, keepdims=True)
    assert np.abs(sg.readout(Q, V) - o_ref).max() <= 1e-9
    hot_rows = np.searchsorted(sg.ids, sg.hot_ids)
    assert np.abs(sg.readout(Q, V[hot_rows]) - o_ref).max() <= 1e-9  # V aligned with hot_ids
    assert np.abs(sg.weights(Q) - W / W.sum(axis=1, keepdims=True)).max() <= 1e-9
    with pytest.raises(InvalidKeysError):
        sg.readout(Q, V[:3])


def test_state_roundtrip_with_hot_tier_below_warmup_size():
    """Example 3.1 after eviction: 2 hot keys < ceil(1/C)+2 = 3; the state still round-trips."""
    sg = StreamingGate(C=1.0, sigma=5.0)
    sg.admit(EX_X)
    sg.evict_reserve()
    sg2 = StreamingGate.from_state(sg.to_state())
    assert sg2.hot_ids.tolist() == [0, 1] and sg2.cold_ids.tolist() == [2]
    assert np.abs(sg2.alpha - sg.alpha).max() <= 1e-15 and abs(sg2.rho - sg.rho) <= 1e-15
    sg2.admit([0.0, -10.0])
    assert sg2.alpha[2] == pytest.approx(0.03327001, abs=5e-9)


def test_repeated_keys_stream_matches_refit_scores():
    """Identical hourly vitals are common: bit-equal duplicates across hot and cold tiers."""
    C, sigma = calibrate_C(0.3, 40), 1.5
    base = _drift_stream(4, n=60, d=3)
    rng = np.random.default_rng(0)
    X = base[np.sort(rng.integers(0, 60, size=150))]  # every key repeated ~2.5 times, in order
    sg = StreamingGate(C=C, sigma=sigma)
    for lo in range(0, 150, 10):
        sg.admit(X[lo:lo + 10])
        sg.evict_reserve()
        if lo == 70:
            sg.forget(int(sg.cold_ids[0]))
            sg.forget(int(sg.hot_ids[0]))
    keys = sg.keys
    a_ref, rho_ref = refit(keys, C=C, sigma=sigma)  # alpha is not unique with duplicates; scores are
    P = np.vstack([keys, base + 0.05])
    s_ref = 2.0 * rbf_kernel(P, keys, sigma) @ a_ref - rho_ref
    assert np.abs(sg.score(P) - s_ref).max() <= 1e-9
    c = sg.certificate()
    assert c["future_safe"] and c["kkt_residual"]["max"] <= 1e-10 and sg.n_cold > 0
