"""Pipelines without Prefect: ledger, gate store, atomic forget, and the study computations."""
from __future__ import annotations

import duckdb
import numpy as np
import pytest

from cohort.synthetic import make_small_warehouse
from pipelines import gate_store, ledger
from pipelines import patient_deletion as pdel
from pipelines import retention as ret
from pipelines import warehouse as wh
from pipelines.deterioration import future_event_labels, future_event_labels_reference
from pipelines.errors import AlreadyForgottenError, LedgerTamperedError, UnknownSubjectError
from pipelines.forget import forget_subject


@pytest.fixture(scope="module")
def base_wh(tmp_path_factory):
    return make_small_warehouse(tmp_path_factory.mktemp("wh"), stays=40, seed=0)


@pytest.fixture
def wh_with_gates(base_wh, tmp_path, monkeypatch):
    """A copy of the small warehouse with one patient-deletion context and per-stay retention gates."""
    import shutil

    monkeypatch.delenv(ledger.KEY_ENV, raising=False)
    p = tmp_path / "warehouse.duckdb"
    shutil.copy(base_wh, p)
    stays = wh.stays(p)
    group = pdel.plan_contexts(stays, 5, seed=0)[0]
    r = pdel.context_task(str(p), group, 0)
    from sv_core import Gate

    ctxs = [gate_store.StoredContext(Gate.from_state(r["gate_state"]), r["token_subject"], r["token_stay"],
                                     r["token_hour"])]
    rows = ret.retention_for_stays(str(p), group[:3], build_gate=True)
    ret_ctx = [gate_store.StoredContext(Gate.from_state(x["gate_state"]), np.full(x["n"], x["subject_id"]),
                                        np.full(x["n"], x["stay_id"]), x["hours"]) for x in rows if x["included"]]
    con = duckdb.connect(str(p))
    gate_store.replace_study(con, "patient_deletion", ctxs)
    gate_store.replace_study(con, "icu_retention", ret_ctx)
    con.close()
    subj = {s: sub for s, sub, _, _ in stays}
    return p, [subj[s] for s in group], len(ret_ctx)


def snapshot(path) -> dict:
    """Every table's full contents, ordered (blobs as bytes)."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        names = sorted(r[0] for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()").fetchall())
        return {t: sorted(con.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in names}
    finally:
        con.close()


# ---------------------------------------------------------------------------------------- ledger
def test_ledger_chain_and_tamper_detection(tmp_path):
    con = duckdb.connect(str(tmp_path / "l.duckdb"))
    key = b"k"
    for i in range(3):
        ledger.append(con, "forget_subject", ledger.subject_hash(100 + i, key), {"n": i, "x": [1, 2]}, ts=f"t{i}")
    rs = ledger.rows(con)
    assert [r.seq for r in rs] == [1, 2, 3]
    assert rs[0].prev_sha256 == ledger.GENESIS and rs[1].prev_sha256 == rs[0].sha256
    # hand-computed digest of row 1
    import hashlib
    import json

    content = json.dumps([1, "t0", "forget_subject", rs[0].subject_id_hash, '{"n":0,"x":[1,2]}', "0" * 64],
                         separators=(",", ":"))
    assert rs[0].sha256 == hashlib.sha256(content.encode()).hexdigest()
    assert ledger.verify(con)["head_sha256"] == rs[2].sha256
    assert ledger.verify_rows_reference(rs) is None
    # the salted hash is not the plain hash of the id and differs per key
    assert rs[0].subject_id_hash != hashlib.sha256(b"100").hexdigest()
    assert ledger.subject_hash(100, b"other") != rs[0].subject_id_hash
    # edit one row's payload -> verification fails at that row
    con.execute("UPDATE deletion_receipts SET payload_json = '{\"n\":5,\"x\":[1,2]}' WHERE seq = 2")
    with pytest.raises(LedgerTamperedError) as ei:
        ledger.verify(con)
    assert ei.value.seq == 2
    assert ledger.verify_rows_reference(ledger.rows(con)) == 2
    assert ledger.summary(con)["chain_verified"] is False


def test_ledger_deleted_row_detected(tmp_path):
    con = duckdb.connect(str(tmp_path / "l.duckdb"))
    for i in range(3):
        ledger.append(con, "k", "h", {"i": i})
    con.execute("DELETE FROM deletion_receipts WHERE seq = 2")
    with pytest.raises(LedgerTamperedError) as ei:
        ledger.verify(con)
    assert ei.value.seq == 3 and ledger.verify_rows_reference(ledger.rows(con)) == 3


# ---------------------------------------------------------------------------------------- gate store
def test_gate_store_roundtrip_is_exact(tmp_path):
    from sv_core import Gate, calibrate_C

    X = np.random.default_rng(0).normal(size=(30, 4))
    g = Gate(calibrate_C(0.4, 30), 2.0)
    g.admit(X)
    g2 = gate_store.blob_to_gate(gate_store.gate_to_blob(g))
    assert np.array_equal(g.ids, g2.ids) and np.array_equal(g.alpha, g2.alpha) and g.rho == g2.rho
    P = X + 0.1
    assert np.array_equal(g.score(P), g2.score(P))


# ---------------------------------------------------------------------------------------- forget
def test_forget_subject_removes_everything_with_one_receipt(wh_with_gates):
    p, subjects, _ = wh_with_gates
    target = subjects[1]
    r = forget_subject(p, subject_id=target)
    con = duckdb.connect(str(p), read_only=True)
    assert con.execute("SELECT count(*) FROM cohort_stays WHERE subject_id = ?", [target]).fetchone()[0] == 0
    assert con.execute("SELECT count(*) FROM gate_tokens WHERE subject_id = ?", [target]).fetchone()[0] == 0
    rs = ledger.rows(con)
    assert len(rs) == 1 and rs[0].kind == "forget_subject"
    assert str(target) not in rs[0].payload_json  # no raw id in the receipt
    pd_ctx = [c for c in r.contexts if c["study"] == "patient_deletion"][0]
    assert pd_ctx["action"] == "decrement" and pd_ctx["forgotten_tokens_live_after"] == 0
    assert pd_ctx["max_abs_score_dev"] < 1e-8 and pd_ctx["kkt_residual"] < 1e-9
    # the stored gate now holds exactly the other patients' tokens
    cid = pd_ctx["context_id"]
    g = gate_store.load_gate(con, cid)
    tok = con.execute("SELECT token_id FROM gate_tokens WHERE context_id = ? ORDER BY token_id", [cid]).fetchall()
    assert sorted(int(i) for i in g.ids) == [t[0] for t in tok]
    # warehouse content hash was refreshed
    from cohort.build import content_hash

    assert con.execute("SELECT value FROM build_info WHERE key='content_hash'").fetchone()[0] == content_hash(con)
    con.close()
    with pytest.raises(AlreadyForgottenError):
        forget_subject(p, subject_id=target)


def test_forget_by_stay_and_per_stay_context_dropped(wh_with_gates):
    p, subjects, n_ret = wh_with_gates
    con = duckdb.connect(str(p), read_only=True)
    stay, subj = con.execute("SELECT t.stay_id, t.subject_id FROM gate_tokens t JOIN gate_states s USING (context_id) "
                             "WHERE s.study = 'icu_retention' LIMIT 1").fetchone()
    con.close()
    r = forget_subject(p, stay_id=stay)
    acts = {c["study"]: c["action"] for c in r.contexts}
    assert acts["icu_retention"] == "dropped"  # a per-stay gate holds only that patient
    with pytest.raises(AlreadyForgottenError):
        forget_subject(p, stay_id=stay)
    with pytest.raises(AlreadyForgottenError):
        forget_subject(p, subject_id=subj)


def test_forget_unknown_changes_nothing(wh_with_gates):
    p, _, _ = wh_with_gates
    before = snapshot(p)
    with pytest.raises(UnknownSubjectError):
        forget_subject(p, subject_id=-12345)
    assert snapshot(p) == before


@pytest.mark.parametrize("where", ["purge", "ledger"])
def test_forget_is_atomic(wh_with_gates, monkeypatch, where):
    import pipelines.forget as fg

    p, subjects, _ = wh_with_gates
    before = snapshot(p)
    if where == "purge":
        real = fg.purge_subject

        def boom(con, sid):
            real(con, sid)  # the deletions happen, then the crash
            raise RuntimeError("crash after purge")
        monkeypatch.setattr(fg, "purge_subject", boom)
    else:
        def boom(*a, **k):
            raise RuntimeError("crash while writing the receipt")
        monkeypatch.setattr(fg.ledger, "append", boom)
    with pytest.raises(RuntimeError):
        forget_subject(p, subject_id=subjects[0])
    after = snapshot(p)
    assert after == before  # warehouse tables, gate states (blobs) and ledger unchanged


# ---------------------------------------------------------------------------------------- studies
def test_planted_retention_sv_beats_recency():
    rng = np.random.default_rng(0)
    n = 80
    X = 0.05 * rng.standard_normal((n, 6))
    events = np.zeros(n, bool)
    events[[3, 10, 17]] = True  # early, atypical hours
    X[events] += np.array([[4, 0, 0, 0, 0, 0], [0, -4, 0, 0, 0, 0], [0, 0, 0, 4, 0, 0]])
    r = ret.stay_retention(X, events, nu=0.3, sigma=3.0, rng=np.random.default_rng(1))
    assert 0 < r["k"] < n
    assert r["retention"]["sv"] == 1.0  # outliers are support vectors
    assert r["retention"]["recency"] == 0.0  # the last k hours hold no event
    assert r["retention"]["density"] == 0.0  # density keeps the dense cluster
    assert all(0.0 <= v <= 1.0 for v in r["retention"].values())


def test_aggregate_matches_serial_reference(base_wh):
    from cohort.streams import iter_stays
    from evaluation.retention import compare_retention

    ids = [s[0] for s in wh.stays(base_wh)][:10]
    pols = ("sv", "density", "recency")
    rows = []
    for batch in (ids[5:], ids[:5]):  # out of order, as tasks may finish
        rows += ret.retention_for_stays(str(base_wh), batch, policies=pols)
    mine = ret.aggregate(rows, policies=pols, nu=0.3, sigma=3.0, n_boot=500)
    ss = list(iter_stays(base_wh, stay_ids=ids))
    ref = compare_retention([s.z for s in ss], [s.event_composite for s in ss], policies=pols, n_boot=500,
                            progress=False)
    for p in pols:
        assert mine.means[p] == pytest.approx(ref.means[p], abs=1e-12)
    for p in ("density", "recency"):
        assert (mine.diffs[p].low, mine.diffs[p].high) == pytest.approx((ref.diffs[p].low, ref.diffs[p].high))
    assert mine.n_included == ref.n_included


def test_heldout_keys_are_5d(base_wh):
    ids = [s[0] for s in wh.stays(base_wh)][:4]
    rows = ret.retention_for_stays(str(base_wh), ids, label="event_spo2", drop=["spo2"])
    assert {r["d"] for r in rows} == {5}


def test_patient_deletion_zero_leakage_and_decay_positive(base_wh):
    group = pdel.plan_contexts(wh.stays(base_wh), 5, seed=0)[0]
    r = pdel.context_task(str(base_wh), group, 2)
    assert r["leakage_after"] == 0.0 and r["forgotten_tokens_live_after"] == 0
    assert r["leakage_before"] > 0
    assert r["decay_leakage"]["gamma_0.1"] > r["decay_leakage"]["gamma_0.01"] > 0
    assert r["kkt_residual"] < 1e-9 and r["refit_score_dev_max"] < 1e-8
    assert r["n"] <= 5 * 48


def test_dedupe_indices_match_dedupe():
    from sv_core.audit import dedupe

    X = np.repeat(np.random.default_rng(0).normal(size=(6, 3)), 3, axis=0)
    X[1] += 0.05
    idx = pdel.dedupe_indices(X, 0.1)
    assert np.array_equal(X[idx], dedupe(X, 0.1))
    assert idx.tolist() == [0, 3, 6, 9, 12, 15]


def test_future_event_labels():
    ev = np.array([0, 0, 1, 0, 0, 0, 0, 0, 0, 1], bool)
    y, m = future_event_labels(ev, 6)
    y2, m2 = future_event_labels_reference(ev, 6)
    assert np.array_equal(y, y2) and np.array_equal(m, m2)
    assert y.tolist() == [1, 1, 0, 1, 1, 1, 1, 1, 1, 0]
    assert m.tolist() == [True, True, True, True, False, False, False, False, False, False]
