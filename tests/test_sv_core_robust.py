"""Error contract everywhere (issue 10, item 3): typed one-line errors, bit-identical state."""
from __future__ import annotations

import io

import numpy as np
import pytest

from sv_core import Gate, calibrate_C, refit
from sv_core.errors import (
    GateError,
    InvalidKeysError,
    InvalidParameterError,
    InvalidStateError,
    InvalidTokenIdError,
    RefitError,
    UnknownTokenError,
    VerificationError,
)


def _gate(n=25, d=4, seed=0):
    g = Gate(C=calibrate_C(0.4, n), sigma=2.0)
    g.admit(np.random.default_rng(seed).normal(size=(n, d)))
    g.forget(3)
    return g


def _fingerprint(g):
    st = g.to_state()
    return {k: (v.tobytes() if isinstance(v, np.ndarray) else v) for k, v in st.items()}


@pytest.mark.parametrize("bad", [3.7, 4.0, True, False, np.bool_(True), "5", b"5", None, 5 + 0j,
                                 float("inf"), float("nan"), np.float64(4.0), [4], (4,)])
def test_non_integer_ids_are_typed_errors_and_change_nothing(bad):
    g = _gate()
    before = _fingerprint(g)
    with pytest.raises(InvalidTokenIdError) as ei:
        g.forget(bad)
    assert isinstance(ei.value, UnknownTokenError) and "\n" not in str(ei.value)
    with pytest.raises(InvalidTokenIdError):
        g.forget_many([5, bad])
    with pytest.raises(InvalidTokenIdError):
        g.status_of(bad)
    assert _fingerprint(g) == before


@pytest.mark.parametrize("kind", [int, np.int64, np.int32, np.uint16])
def test_integer_ids_of_any_integer_type_are_accepted(kind):
    g = _gate()
    r = g.forget(kind(4))
    assert r.token_id == 4 and 4 not in set(g.ids.tolist())


def test_empty_batch_admits_nothing():
    g = _gate()
    before = _fingerprint(g)
    assert g.admit(np.zeros((0, 4))).size == 0
    assert _fingerprint(g) == before
    assert Gate(C=0.1, sigma=1.0).admit(np.zeros((0, 2))).size == 0


def test_huge_integer_id_is_unknown_not_overflow():
    g = _gate()
    with pytest.raises(UnknownTokenError, match="not in the gate"):
        g.forget(10**40)


def test_forget_many_empty_on_empty_and_on_solved_gate():
    assert Gate(C=0.1, sigma=1.0).forget_many([]) == []
    g = _gate()
    before = _fingerprint(g)
    assert g.forget_many([]) == []
    assert _fingerprint(g) == before
    with pytest.raises(UnknownTokenError):
        Gate(C=0.1, sigma=1.0).forget_many([0])


def test_verification_failure_rolls_the_deletion_back(monkeypatch):
    from sv_core import _gate_forget as forget_mod

    g = _gate()
    before = _fingerprint(g)
    tid = g.partition()["margin"][0]

    def no_refit(*a, **k):
        raise RefitError("injected")

    monkeypatch.setattr(forget_mod, "refit", no_refit)  # the deletion's verification oracle
    with pytest.raises(VerificationError, match="gate restored"):
        g.forget(tid, verify=True)
    assert _fingerprint(g) == before
    with pytest.raises(VerificationError):
        g.forget_many([tid, 7], verify=True)
    assert _fingerprint(g) == before
    monkeypatch.undo()
    r = g.forget(tid, verify=True)
    assert r.verification["max_abs_score_dev"] < 1e-9


def test_verification_mismatch_takes_the_fallback(monkeypatch):
    """A wrong maintained state that passes the KKT guard is caught by verify and repaired."""
    g = _gate()
    tid = g.partition()["margin"][0]
    from sv_core import gate as gate_mod

    real = gate_mod.Gate._forget_slot

    def corrupt(self, t, s):
        r = real(self, t, s)
        self._core.rho += 1e-3  # invisible to nothing but the independent refit / KKT
        self._core.recompute_g()
        return r

    monkeypatch.setattr(gate_mod.Gate, "_forget_slot", corrupt)
    r = g.forget(tid, verify=True)
    assert r.fallback and r.fallback_reason.startswith("verification")
    assert r.verification["max_abs_score_dev"] < 1e-9 and g.fallbacks == 1


@pytest.mark.parametrize("sigma", [1e-320, 1e-200, 1e200, 1e300, np.float64(1e-310), True])
def test_degenerate_bandwidths_are_rejected(sigma):
    with pytest.raises(InvalidParameterError) as ei:
        Gate(C=0.1, sigma=sigma)
    assert "\n" not in str(ei.value)
    with pytest.raises(InvalidParameterError):
        refit(np.random.default_rng(0).normal(size=(20, 2)), C=0.1, sigma=sigma)


@pytest.mark.parametrize("scale", [1e151, 1e200, 1e300])
def test_enormous_keys_are_rejected_before_any_change(scale):
    g = _gate()
    before = _fingerprint(g)
    with pytest.raises(InvalidKeysError, match="magnitude"):
        g.admit(np.full((2, 4), scale))
    assert _fingerprint(g) == before
    fresh = Gate(C=calibrate_C(0.4, 20), sigma=2.0)
    with pytest.raises(InvalidKeysError):
        fresh.admit(np.random.default_rng(0).normal(size=(20, 3)) * scale)
    assert fresh.n == 0 and fresh.dim is None


def test_keys_far_from_the_origin_are_solved_exactly():
    """Large offsets are handled (kernel distances are computed relative to a data point)."""
    X = np.random.default_rng(1).normal(size=(30, 3))
    g0 = Gate(C=calibrate_C(0.4, 30), sigma=2.0)
    g0.admit(X)
    g1 = Gate(C=calibrate_C(0.4, 30), sigma=2.0)
    g1.admit(X + 1e7)
    assert g1.kkt_residual()["max"] < 1e-9
    assert np.abs(g1.score(X[:5] + 1e7) - g0.score(X[:5])).max() < 1e-6


# ------------------------------------------------------------------ from_state
def _corruptions(st):
    n = st["ids"].size
    m = np.flatnonzero(st["status"] == 1)
    e = np.flatnonzero(st["status"] == 2)
    r = np.flatnonzero(st["status"] == 0)

    def put(**kw):
        d = dict(st)
        d.update(kw)
        return d

    def drop(k):
        d = dict(st)
        del d[k]
        return d

    a = st["alpha"]
    nan_keys = st["keys"].copy(); nan_keys[2, 1] = np.nan
    inf_keys = st["keys"].copy(); inf_keys[0, 0] = np.inf
    dup = st["ids"].copy(); dup[1] = dup[0]
    neg = st["ids"].copy(); neg[0] = -1
    nonmargin = st["status"].copy(); nonmargin[r[0]] = 1
    a_sh = a.copy(); a_sh[m[0]] += 1e-4; a_sh[m[1]] -= 1e-4
    a_neg = a.copy(); a_neg[m[0]] = -1e-3; a_neg[r[0]] = a[m[0]] + 1e-3
    st_sw = st["status"].copy(); st_sw[e[0]], st_sw[r[0]] = 0, 2
    a_sw = a.copy(); a_sw[e[0]], a_sw[r[0]] = 0.0, st["C"]
    moved = st["keys"].copy(); moved[m[0]] += 0.3  # (a common shift would be a valid state)
    return {
        "alpha*2": put(alpha=a * 2),
        "alpha nan": put(alpha=np.where(np.arange(n) == 0, np.nan, a)),
        "alpha shifted within margin": put(alpha=a_sh),
        "alpha negative": put(alpha=a_neg),
        "alpha wrong length": put(alpha=a[:-1]),
        "alpha int dtype": put(alpha=(a > 0).astype(np.int64)),
        "nan keys": put(keys=nan_keys),
        "inf keys": put(keys=inf_keys),
        "keys 1-d": put(keys=st["keys"][:, 0]),
        "keys wrong rows": put(keys=st["keys"][:-1]),
        "keys str": put(keys=st["keys"].astype(str)),
        "margin key moved": put(keys=moved),
        "C changed": put(C=st["C"] * 1.5),
        "C zero": put(C=0.0),
        "C > 1": put(C=2.0),
        "C nan": put(C=float("nan")),
        "sigma changed": put(sigma=st["sigma"] * 2),
        "sigma negative": put(sigma=-1.0),
        "sigma tiny": put(sigma=1e-320),
        "sigma huge": put(sigma=1e200),
        "duplicate ids": put(ids=dup),
        "negative id": put(ids=neg),
        "ids float": put(ids=st["ids"].astype(float)),
        "id >= next_id": put(next_id=int(st["ids"].max())),
        "live id forgotten": put(forgotten=np.append(st["forgotten"], st["ids"][0])),
        "status out of range": put(status=np.where(np.arange(n) == 0, 7, st["status"]).astype(np.int8)),
        "status not margin": put(status=nonmargin),
        "error/reserve swapped": put(status=st_sw, alpha=a_sw),
        "margin_ids missing one": put(margin_ids=st["margin_ids"][1:]),
        "margin_ids unknown": put(margin_ids=np.append(st["margin_ids"][1:], 10**6)),
        "margin_ids repeated": put(margin_ids=np.append(st["margin_ids"], st["margin_ids"][0])),
        "rho nan": put(rho=float("nan")),
        "rho shifted": put(rho=st["rho"] + 1e-3),
        "solved flag str": put(solved="yes"),
        "unsolved but large": put(solved=False),
        "missing field": drop("alpha"),
        "not a mapping": 5,
    }


def test_from_state_rejects_every_corrupted_state_with_a_typed_error():
    g = _gate(n=40)
    st = g.to_state()
    Gate.from_state(st)  # the original is accepted
    cases = _corruptions(st)
    assert len(cases) >= 35
    accepted = []
    for name, bad in cases.items():
        try:
            Gate.from_state(bad)
        except InvalidStateError as exc:
            assert "\n" not in str(exc), name
        except Exception as exc:  # noqa: BLE001 - any other type is a contract violation
            raise AssertionError(f"{name}: untyped {type(exc).__name__}: {exc}") from exc
        else:
            accepted.append(name)
    assert accepted == []


def test_from_state_accepts_npz_roundtrip_and_warmup_and_empty_states():
    g = _gate(n=30)
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in g.to_state().items()})
    buf.seek(0)
    with np.load(buf, allow_pickle=False) as z:
        st = {k: z[k] for k in z.files}
    h = Gate.from_state(st)
    assert np.array_equal(h.alpha, g.alpha) and h.rho == g.rho
    w = Gate(C=0.1, sigma=1.0)
    w.admit(np.zeros((3, 2)) + np.arange(3)[:, None])
    assert Gate.from_state(w.to_state()).n == 3
    assert Gate.from_state(Gate(C=0.1, sigma=1.0).to_state()).n == 0
    assert issubclass(InvalidStateError, GateError)
