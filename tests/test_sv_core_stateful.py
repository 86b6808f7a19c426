"""Stateful fuzz of the gate's contract (issue 10, item 3): a hypothesis rule-based state machine
mixes valid and invalid admit / forget / forget_many / evict / to_state-from_state. After every
valid step the state is KKT (<= 1e-9, recomputed from scratch) and agrees with an independent
refit (max |score difference| <= 1e-6 on keys and jittered probes); after every invalid step the
state is bit-identical. Short in CI; ``-m slow`` runs the long version."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sv_core import Gate, calibrate_C, rbf_kernel, refit
from sv_core.errors import (
    GateError,
    InfeasibleError,
    InvalidKeysError,
    InvalidStateError,
    InvalidTokenIdError,
    UnknownTokenError,
)

D = 3
SIGMA = 1.5
KKT_TOL = 1e-9
SCORE_TOL = 1e-6
#: steps run by the machine in this process (printed with -s), for the fuzz counts in reports
COUNTS = {"valid": 0, "invalid": 0, "checked": 0}


def fingerprint(g: Gate) -> dict:
    st_ = g.to_state()
    return {k: (v.tobytes() if isinstance(v, np.ndarray) else v) for k, v in st_.items()}


def rho_is_unique(g: Gate, tol: float = 1e-12) -> bool:
    """Whether the gate's offset is pinned: some coefficient lies strictly inside (0, C). A margin
    token whose coefficient sits exactly at 0 or C (a tie the C&P walk stopped on) pins nothing."""
    a = np.asarray(g.alpha, dtype=float)
    return bool(g.partition()["margin"]) and bool(np.any((a > tol) & (a < g.C - tol)))


class GateMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.g = Gate(C=calibrate_C(0.4, 10), sigma=SIGMA)  # warm-up size 5
        self.valid_steps = 0
        self.invalid_steps = 0
        self.checked = False

    # ---------------------------------------------------------------- helpers
    def _keys(self, seed: int, m: int, dup: float | None) -> np.ndarray:
        rng = np.random.default_rng(seed)
        X = rng.normal(size=(m, D))
        if dup is not None and self.g.n:
            base = self.g.keys[rng.integers(self.g.n, size=m)]
            X = base + dup * rng.normal(size=(m, D))
        return X

    def _invalid(self, fn, exc):
        before = fingerprint(self.g)
        with pytest.raises(exc):
            fn()
        assert fingerprint(self.g) == before
        self.invalid_steps += 1

    def teardown(self):
        COUNTS["valid"] += self.valid_steps
        COUNTS["invalid"] += self.invalid_steps

    def _feasible_after(self, k: int) -> bool:
        return not self.g.gated or (self.g.n - k) * self.g.C >= 1.0 - 1e-12

    # ---------------------------------------------------------------- valid rules
    @rule(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 3),
          dup=st.sampled_from([None, None, 0.0, 1e-7, 1e-5, 1e-3]))
    @precondition(lambda self: self.g.n < 24)
    def admit(self, seed, m, dup):
        n = self.g.n
        ids = self.g.admit(self._keys(seed, m, dup))
        assert ids.size == m and self.g.n == n + m
        self.valid_steps += 1
        self.checked = False

    @rule(pick=st.integers(0, 10**6), verify=st.booleans())
    @precondition(lambda self: self.g.n > 0)
    def forget(self, pick, verify):
        tid = int(self.g.ids[pick % self.g.n])
        if not self._feasible_after(1):
            self._invalid(lambda: self.g.forget(tid), InfeasibleError)
            return
        r = self.g.forget(tid, verify=verify)
        assert r.token_id == tid and tid not in set(self.g.ids.tolist())
        if verify and self.g.gated:
            assert r.verification["max_abs_score_dev"] <= SCORE_TOL
        self.valid_steps += 1
        self.checked = False

    @rule(picks=st.lists(st.integers(0, 10**6), min_size=0, max_size=3))
    def forget_many(self, picks):
        ids = self.g.ids
        chosen = sorted({int(ids[p % ids.size]) for p in picks}) if ids.size else []
        if not self._feasible_after(len(chosen)):
            self._invalid(lambda: self.g.forget_many(chosen), InfeasibleError)
            return
        out = self.g.forget_many(chosen)
        assert [r.token_id for r in out] == chosen
        self.valid_steps += 1
        self.checked = False

    @rule()
    def evict(self):
        if not self.g.gated:
            assert not self.g.evict_reserve().issued
            return
        P = self.g.keys
        s0 = self.g.score(P)
        cert = self.g.evict_reserve()
        assert cert.issued
        assert np.abs(self.g.score(P) - s0).max() <= 1e-12
        self.valid_steps += 1
        self.checked = False

    @rule()
    def roundtrip(self):
        before = fingerprint(self.g)
        self.g = Gate.from_state(self.g.to_state())
        assert fingerprint(self.g) == before
        self.valid_steps += 1

    # ---------------------------------------------------------------- invalid rules
    @rule(kind=st.sampled_from(["nan", "inf", "dim", "huge", "str", "rank"]))
    def admit_invalid(self, kind):
        bad = {"nan": np.full((2, D), np.nan), "inf": np.array([[np.inf] * D]),
               "dim": np.zeros((1, D + 1)), "huge": np.full((1, D), 1e200),
               "str": [["a"] * D], "rank": np.zeros((1, 1, D))}[kind]
        if kind == "dim" and self.g.dim is None:
            return  # a first admission fixes the dimension; not invalid
        self._invalid(lambda: self.g.admit(bad), InvalidKeysError)

    @rule(bad=st.sampled_from([1.0, 2.5, True, False, "0", None, float("inf"), float("nan"),
                               np.float64(1.0), np.bool_(False)]))
    def forget_bad_id(self, bad):
        self._invalid(lambda: self.g.forget(bad), InvalidTokenIdError)
        self._invalid(lambda: self.g.forget_many([bad]), InvalidTokenIdError)

    @rule(offset=st.integers(1, 1000))
    def forget_unknown_or_forgotten(self, offset):
        forgotten = self.g.to_state()["forgotten"].tolist()
        tid = forgotten[offset % len(forgotten)] if forgotten and offset % 2 else 10**6 + offset
        self._invalid(lambda: self.g.forget(tid), UnknownTokenError)

    @rule()
    @precondition(lambda self: self.g.n >= 1)
    def forget_many_repeat(self):
        tid = int(self.g.ids[0])
        self._invalid(lambda: self.g.forget_many([tid, tid]), UnknownTokenError)

    @rule(kind=st.sampled_from(["alpha", "rho", "C", "ids", "keys"]))
    @precondition(lambda self: self.g.gated)
    def from_state_corrupt(self, kind):
        s = self.g.to_state()
        if kind == "alpha":
            s["alpha"] = s["alpha"] * 2
        elif kind == "rho":
            s["rho"] = float("nan")
        elif kind == "C":
            s["C"] = 0.0
        elif kind == "ids":
            s["ids"] = np.zeros_like(s["ids"])
        else:
            s["keys"] = s["keys"].copy()
            s["keys"][0, 0] = np.nan
        self._invalid(lambda: Gate.from_state(s), InvalidStateError)

    # ---------------------------------------------------------------- invariants
    @invariant()
    def exact_after_every_valid_step(self):
        if self.checked or not self.g.gated:
            return
        self.checked = True
        COUNTS["checked"] += 1
        assert self.g.kkt_residual()["max"] <= KKT_TOL
        X = self.g.keys
        a, rho = refit(X, C=self.g.C, sigma=SIGMA)
        P = np.vstack([X, X + 0.1 * np.random.default_rng(0).normal(size=X.shape)])
        s_ref = 2.0 * rbf_kernel(P, X, SIGMA) @ a - rho
        s = self.g.score(P)
        if not rho_is_unique(self.g):
            # no coefficient strictly inside (0, C): rho is not unique (any point of its KKT
            # interval is optimal; the KKT check above holds the gate's rho inside it, and reserve
            # eviction keeps it where it was), so compare the kernel part of the score
            s, s_ref = s + self.g.rho, s_ref + rho
        assert np.abs(s - s_ref).max() <= SCORE_TOL

    @invariant()
    def ids_and_alpha_consistent(self):
        assert self.g.ids.size == self.g.n == self.g.alpha.size
        if self.g.gated:
            assert abs(self.g.alpha.sum() - 1.0) <= 1e-9


def _run(examples: int, steps: int, derandomize: bool = False):
    s = settings(max_examples=examples, stateful_step_count=steps, deadline=None, derandomize=derandomize,
                 database=None if derandomize else settings.default.database,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    GateMachine.TestCase.settings = s
    GateMachine.TestCase().runTest()
    print(f"state machine: {examples} examples x <= {steps} steps: {COUNTS}")


def test_gate_state_machine_short():
    # the default suite runs the same examples on every machine and every run (same seed, same
    # result); -m slow explores new ones
    _run(examples=40, steps=20, derandomize=True)


def test_all_coefficients_at_a_bound_leave_rho_in_its_interval():
    """A case the fuzz found: after these admissions every coefficient is 0 or C = 0.25, one of the
    C-valued ones still in the margin set (a tie). The gate's coefficients equal the refit's and its
    KKT residual is 0; its rho differs from the refit's by 4e-5 - both inside the interval of optimal
    offsets - so the kernel part of the score agrees and rho is not compared."""
    D_, g = 3, Gate(C=calibrate_C(0.4, 10), sigma=SIGMA)

    def keys(seed, m, dup):
        rng = np.random.default_rng(seed)
        X = rng.normal(size=(m, D_))
        if dup is not None and g.n:
            X = g.keys[rng.integers(g.n, size=m)] + dup * rng.normal(size=(m, D_))
        return X

    g.admit(keys(50, 1, None))
    g.admit(keys(0, 1, 0.0))
    g.admit(keys(0, 2, 0.001))
    g.forget(int(g.ids[0]), verify=False)
    g.admit(keys(0, 3, 0.001))
    g.admit(keys(0, 1, None))
    a_ref, rho_ref = refit(g.keys, C=g.C, sigma=SIGMA)
    assert g.kkt_residual()["max"] <= KKT_TOL
    assert np.abs(g.alpha - a_ref).max() <= 1e-9
    assert g.partition()["margin"] and not rho_is_unique(g)
    kern, kern_ref = g.score(g.keys) + g.rho, 2.0 * rbf_kernel(g.keys, g.keys, SIGMA) @ a_ref
    assert np.abs(kern - kern_ref).max() <= SCORE_TOL


@pytest.mark.slow
def test_gate_state_machine_long():
    _run(examples=300, steps=40)


def test_machine_errors_are_typed():
    assert issubclass(InvalidStateError, GateError) and issubclass(InvalidTokenIdError, GateError)
