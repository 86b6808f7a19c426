"""StreamingGate internals that make it cheap: the per-operation drift bound, the kernel-row
cache, direct-cold admission, ``from_solution``, the amortised cold store, old saved states and
the module layout (no import cycles, no cross-module private imports)."""
from __future__ import annotations

import ast
import math
import os

import numpy as np
import pytest

from sv_core import Gate, calibrate_C, rbf_kernel, refit
from sv_core.errors import InvalidKeysError, PathError, UnknownTokenError
from sv_core.streaming import StreamingGate
from sv_core.streaming import cache as streaming_cache
from sv_core.streaming.cache import KernelCache
from sv_core.streaming.screen import HotView, alpha_change, step_bound
from sv_core.streaming.store import ArrayColdStore

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "streaming")
SV_CORE = os.path.join(os.path.dirname(__file__), os.pardir, "sv_core")


def _drift(seed, n, d=3, step=0.08):
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.normal(scale=step, size=(n, d)), axis=0) + rng.normal(size=(n, d))


def _refit_scores(sg, P):
    X = sg.keys
    a, rho = refit(X, C=sg.C, sigma=sg.sigma)
    return 2.0 * rbf_kernel(P, X, sg.sigma) @ a - rho


# ---------------------------------------------------------------------- the drift bound
def test_step_bound_is_an_upper_bound_on_dw_and_tight():
    """The margin-identity ||dw|| (few kernel rows) against the direct quadratic form over every
    changed key (alpha_change, the slow reference), after admissions and deletions."""
    C, sigma = calibrate_C(0.3, 40), 1.5
    X = _drift(1, 160)
    g = Gate(C, sigma)
    g.admit(X[:40])
    rng = np.random.default_rng(0)
    checked = 0
    for i in range(40, 160):
        before = HotView(g)
        if i % 7 == 0:
            g.forget(int(rng.choice(g.ids)))
        else:
            g.admit(X[i])
        after = HotView(g)
        neg, dw = step_bound(before, after, C, sigma)
        neg_ref, dw_ref = alpha_change(before.ids, before.alpha, before.keys, after.ids, after.alpha,
                                       after.keys, sigma)
        assert neg == pytest.approx(neg_ref, abs=1e-15)
        if neg > 1e-12:  # (below, the L1 term is used and dw is not computed)
            assert dw >= dw_ref - 1e-9  # a valid bound (dw_ref carries its own 1e-12 inflation)
            assert dw <= dw_ref + 1e-3 * dw_ref + 2e-4  # and not loose: inflation only
            checked += 1
    assert checked > 15


def test_budget_lower_bound_holds_for_every_cold_key_along_a_stream():
    """g_j >= tau_j + rho - 2 b for every free cold key, checked against a fresh kernel row after
    every operation (admit, evict, forget of hot and cold keys)."""
    C, sigma = calibrate_C(0.3, 60), 1.5
    X = _drift(3, 320, d=4)
    sg = StreamingGate(C=C, sigma=sigma)
    rng = np.random.default_rng(1)
    n_checked = 0
    for i in range(320):
        sg.admit(X[i])
        if i % 12 == 11:
            sg.evict_reserve()
        if i % 40 == 39 and sg.n_cold:
            sg.forget(int(rng.choice(sg.cold_ids)))
            sg.forget(int(rng.choice(sg.hot_ids)))
        st = sg.to_state()  # cold_g0 = each key's current lower bound
        free = ~st["cold_pinned"].astype(bool)
        if sg.gated and free.any():
            hot = sg.hot_gate
            g = hot.rho - 1.0 + 2.0 * rbf_kernel(st["cold_keys"][free], hot.keys, sigma) @ hot.alpha
            assert np.all(st["cold_g0"][free] <= g + 1e-12)
            assert np.all(g >= -1e-12)  # and the invariant itself
            n_checked += int(free.sum())
    assert n_checked > 10_000 and sg.stats["readmissions"] > 0 and sg.stats["admitted_cold"] > 100


def test_inert_admissions_do_no_cold_work():
    """Keys inside the hot boundary go straight to the cold tier: no hot-gate call, no exact
    re-check of other cold keys (the budget did not move)."""
    C, sigma = calibrate_C(0.3, 40), 2.0
    rng = np.random.default_rng(4)
    sg = StreamingGate(C=C, sigma=sigma)
    sg.admit(rng.normal(size=(300, 2)))
    sg.evict_reserve()
    n_hot, checks, b = sg.n_hot, sg.stats["exact_checks"], sg.to_state()["A"]
    inner = rng.normal(scale=0.05, size=(50, 2))  # the densest region: g well above 0
    for x in inner:
        sg.admit(x)
    assert sg.n_hot == n_hot and sg.stats["exact_checks"] == checks and sg.to_state()["A"] == b
    assert sg.stats["admitted_cold"] >= 50 and sg.tier_of(int(sg.ids[-1])) == "cold"
    P = np.vstack([sg.keys[-60:], inner + 0.1])
    assert np.abs(sg.score(P) - _refit_scores(sg, P)).max() <= 1e-9


# ---------------------------------------------------------------------- reference paths agree
def test_direct_cold_and_cache_agree_with_the_reference_paths():
    """direct_cold (vs every key through the hot gate), the kernel cache (vs fresh kernel rows,
    screen=False) and a tiny cache cap (rows dropped and recomputed) give the same scores."""
    C, sigma = calibrate_C(0.3, 50), 1.5
    X = _drift(8, 260, d=4)
    gates = {"fast": StreamingGate(C=C, sigma=sigma),
             "no_direct": StreamingGate(C=C, sigma=sigma, direct_cold=False),
             "no_screen": StreamingGate(C=C, sigma=sigma, screen=False),
             "tiny_cache": StreamingGate(C=C, sigma=sigma, cache_entries=500),
             "no_cache": StreamingGate(C=C, sigma=sigma, cache_entries=0)}
    P = _drift(9, 30, d=4)
    for lo in range(0, 260, 13):
        for sg in gates.values():
            sg.admit(X[lo:lo + 13])
            sg.evict_reserve()
        if lo == 130:
            for sg in gates.values():
                sg.forget(40)
        if lo % 52 == 0 and gates["fast"].gated:
            ref = gates["fast"].score(P)
            for name, sg in gates.items():
                assert np.abs(sg.score(P) - ref).max() <= 1e-10, name
    assert gates["fast"].n_hot < gates["no_direct"].n_hot + 20
    assert gates["fast"].stats["admitted_cold"] > 0 == gates["no_direct"].stats["admitted_cold"]
    assert np.abs(gates["fast"].score(P) - _refit_scores(gates["fast"], P)).max() <= 1e-9
    for sg in gates.values():
        assert sg.certificate()["future_safe"]


@pytest.mark.parametrize("full_pass", [0.0, 2.0])  # always one pass over the buffer / always a gather
def test_kernel_cache_rows_equal_fresh_kernel_rows_through_support_changes(monkeypatch, full_pass):
    monkeypatch.setattr(streaming_cache, "FULL_PASS_FRACTION", full_pass)
    C, sigma = calibrate_C(0.3, 30), 1.5
    X = _drift(11, 200)
    g = Gate(C, sigma)
    g.admit(X[:40])
    cold = _drift(12, 80) + 0.2
    cache = KernelCache(sigma, max_entries=5_000)  # small: forces column compaction and row limits
    sids = np.arange(80)
    rng = np.random.default_rng(2)
    worst = 0.0
    for i in range(40, 200):
        g.admit(X[i])
        if i % 9 == 0:
            g.forget(int(rng.choice(g.ids)))
        view = HotView(g)
        pick = np.sort(rng.choice(80, 30, replace=False))
        got = cache.g(view, sids[pick], lambda ids: cold[ids])
        worst = max(worst, float(np.abs(got - view.exact_g(cold[pick])).max()))
        if i % 25 == 0:
            cache.drop(sids[pick[:5]])
    assert worst <= 1e-14 and 0 < cache.n_rows <= 80


# ---------------------------------------------------------------------- from_solution
def test_from_solution_equals_the_streamed_gate_and_repairs_an_approximate_solution():
    C, sigma = calibrate_C(0.3, 60), 1.5
    X = _drift(21, 400, d=4)
    a, rho = refit(X, C=C, sigma=sigma)
    sg = StreamingGate.from_solution(X, a, C, sigma)
    assert sg.ids.tolist() == list(range(400)) and sg.n_cold > 0 and sg.certificate()["future_safe"]
    P = np.vstack([X, _drift(22, 20, d=4)])
    s_ref = 2.0 * rbf_kernel(P, X, sigma) @ a - rho
    assert np.abs(sg.score(P) - s_ref).max() <= 1e-12
    bad = a.copy()
    bad[np.flatnonzero(a > 0)[:6]] = 0.0  # six support keys dropped: they violate KKT when cold
    bad /= bad.sum()
    sg2 = StreamingGate.from_solution(X, bad, C, sigma)
    assert sg2.stats["readmissions"] >= 1 and sg2.certificate()["future_safe"]
    assert np.abs(sg2.score(P) - s_ref).max() <= 1e-12
    nxt = _drift(23, 30, d=4)
    for g_ in (sg, sg2):
        g_.admit(nxt)
    assert np.abs(sg2.score(P) - sg.score(P)).max() <= 1e-12
    with pytest.raises(InvalidKeysError):
        StreamingGate.from_solution(X, a[:-1], C, sigma)
    small = StreamingGate.from_solution(X[:3], np.full(3, 1 / 3), C, sigma)  # warm-up: just admitted
    assert not small.gated and small.n == 3


# ---------------------------------------------------------------------- cold store
def test_array_cold_store_semantics_and_compaction():
    st = ArrayColdStore()
    rng = np.random.default_rng(0)
    keys = {}
    nxt = 0
    for _ in range(60):
        ids = np.arange(nxt, nxt + 7)
        nxt += 7
        K = rng.normal(size=(7, 3))
        st.add(ids, K)
        keys.update(zip(ids.tolist(), K))
        live = sorted(keys)
        drop = rng.choice(live, 5, replace=False)
        out = st.remove(drop)
        for i, row in zip(drop.tolist(), out):
            np.testing.assert_array_equal(row, keys.pop(i))
    assert st.ids().tolist() == sorted(keys) and len(st) == len(keys)
    some = np.asarray(sorted(keys)[::3])
    np.testing.assert_array_equal(st.get(some), np.asarray([keys[i] for i in some.tolist()]))
    with pytest.raises(UnknownTokenError):
        st.get([10_000])
    with pytest.raises(InvalidKeysError):
        st.add([int(some[0])], np.zeros((1, 3)))  # already stored
    with pytest.raises(UnknownTokenError):
        st.remove([int(some[0]), int(some[0])])
    assert st.ids().tolist() == sorted(keys)  # nothing changed by the refused calls


# ---------------------------------------------------------------------- rollback clears the cache
def test_failed_readmission_rolls_back_and_the_next_operation_is_exact(monkeypatch):
    C, sigma = calibrate_C(0.3, 40), 1.5
    X = _drift(31, 200)
    sg = StreamingGate(C=C, sigma=sigma)
    for lo in range(0, 180, 12):
        sg.admit(X[lo:lo + 12])
        sg.evict_reserve()
    before = sg.to_state()
    real = Gate.admit
    calls = []

    def flaky(self, Xn):
        calls.append(1)
        raise PathError("injected failure")

    monkeypatch.setattr(Gate, "admit", flaky)
    far = np.full((1, 3), 6.0)  # outside the boundary: must enter the hot gate -> fails
    with pytest.raises(PathError):
        sg.admit(far)
    monkeypatch.setattr(Gate, "admit", real)
    assert calls and all(np.array_equal(np.asarray(before[k]), np.asarray(v)) for k, v in sg.to_state().items())
    sg.admit(np.vstack([far, X[180:200]]))
    P = np.vstack([sg.keys, far])
    assert np.abs(sg.score(P) - _refit_scores(sg, P)).max() <= 1e-9


# ---------------------------------------------------------------------- states of the first release
@pytest.mark.parametrize("name", ["stream", "example_3_1", "budget"])
def test_states_saved_by_the_first_release_load_and_continue(name):
    with np.load(os.path.join(FIX, f"v1_{name}.npz"), allow_pickle=False) as z:
        data = {k: z[k] for k in z.files}
    exp = {k[7:]: data.pop(k) for k in list(data) if k.startswith("expect/")}
    sg = StreamingGate.from_state(data)
    assert sg.ids.tolist() == exp["ids"].tolist()
    assert sg.hot_ids.tolist() == exp["hot_ids"].tolist() and sg.cold_ids.tolist() == exp["cold_ids"].tolist()
    assert np.abs(sg.alpha - exp["alpha"]).max() <= 1e-15 and abs(sg.rho - float(exp["rho"])) <= 1e-15
    assert np.abs(sg.score(exp["probes"]) - exp["scores"]).max() <= 1e-14
    cert = sg.certificate()
    assert cert["future_safe"] == (name != "budget")
    # what the current code saves loads again, with the same tiers and bit-identical coefficients
    sg2 = StreamingGate.from_state(sg.to_state())
    assert sg2.cold_ids.tolist() == sg.cold_ids.tolist() and np.array_equal(sg2.alpha, sg.alpha)
    # and the stream continues exactly
    nxt = exp["probes"] + 0.05
    sg.admit(nxt)
    if name == "budget":
        assert not sg.certificate()["future_safe"]
    else:
        P = np.vstack([sg.keys, nxt + 0.1])
        assert np.abs(sg.score(P) - _refit_scores(sg, P)).max() <= 1e-9
        assert sg.certificate()["future_safe"]


# ---------------------------------------------------------------------- module layout
def _streaming_modules():
    """The streaming room's modules: ``__init__`` (the StreamingGate) and its satellites."""
    folder = os.path.join(SV_CORE, "streaming")
    return sorted(f[:-3] for f in os.listdir(folder) if f.endswith(".py"))


def test_streaming_modules_have_no_import_cycles_and_no_private_imports():
    mods = _streaming_modules()
    graph = {}
    for m in mods:
        with open(os.path.join(SV_CORE, "streaming", m + ".py")) as f:
            tree = ast.parse(f.read())
        deps = set()
        for node in ast.walk(tree):  # module level and inside functions alike
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sv_core.streaming."):
                deps.add(node.module.rsplit(".", 1)[1])
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{m} imports private names {private} from {node.module}"
        graph[m] = deps & set(mods)
        with open(os.path.join(SV_CORE, "streaming", m + ".py")) as f:
            assert sum(1 for _ in f) <= 420, f"{m} is longer than ~400 lines"

    state = {}

    def visit(m, path):
        if state.get(m) == 1:
            raise AssertionError(f"import cycle: {' -> '.join(path + [m])}")
        if state.get(m) == 2:
            return
        state[m] = 1
        for d in graph[m]:
            visit(d, path + [m])
        state[m] = 2

    for m in mods:
        visit(m, [])
    assert "ops" in graph["__init__"] and math.isfinite(len(mods))


def test_budget_rebase_and_cold_tier_compaction_keep_the_gate_exact(monkeypatch):
    """Rebasing the budget (every tau shifted) and compacting the cold tier's records (after
    many removals) keep the gate exact: the same scores as a gate admitting the same keys and
    forgetting the same tokens (afterwards) and as an independent refit."""
    import sv_core.streaming.cold as sc
    import sv_core.streaming.ops as so

    C, sigma = calibrate_C(0.3, 40), 1.5
    X = _drift(41, 700)
    plain = StreamingGate(C=C, sigma=sigma)
    for lo in range(0, 700, 25):
        plain.admit(X[lo:lo + 25])
        plain.evict_reserve()
    monkeypatch.setattr(so, "REBASE_AT", 1e-6)
    compactions = []
    real_compact = sc.ColdTier.maybe_compact

    def compact(self):
        n_used = self._used
        real_compact(self)
        if self._used < n_used:
            compactions.append(n_used - self._used)

    monkeypatch.setattr(sc.ColdTier, "maybe_compact", compact)
    monkeypatch.setattr(sc, "COMPACT_MIN", 64)
    sg = StreamingGate(C=C, sigma=sigma)
    rng = np.random.default_rng(5)
    for lo in range(0, 700, 25):
        sg.admit(X[lo:lo + 25])
        sg.evict_reserve()
        if lo >= 300 and sg.n_cold > 60:
            for t in rng.choice(sg.cold_ids, 20, replace=False):
                sg.forget(int(t))
                plain.forget(int(t))
    assert compactions and sg.to_state()["A"] < 1e-3  # rebased: the budget stays tiny
    P = np.vstack([sg.keys, X[:50] + 0.2])
    assert np.abs(sg.score(P) - plain.score(P)).max() <= 1e-10
    assert np.abs(sg.score(P) - _refit_scores(sg, P)).max() <= 1e-9
    assert sg.ids.tolist() == plain.ids.tolist() and sg.certificate()["future_safe"]
