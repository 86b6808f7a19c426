"""Incremental ingest (pipelines/ingest/__init__.py): replay equality with the causal batch build, gate
scores vs a full-history refit, late rows, idempotence, changed files, the deletion queue."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import numpy as np
import pytest

from cohort.build import build_warehouse
from cohort.constants import VITALS
from cohort.incremental.replay import make_replay
from pipelines.ingest import ingest
from pipelines.ingest import state as st
from pipelines.store.keys import Keys

Z = [f"{v}_z" for v in VITALS]


def _frozen(wh) -> dict:
    con = duckdb.connect(str(wh), read_only=True)
    try:
        return {v: {"mean": m, "sd": s, "median": md}
                for v, m, s, md in con.execute("SELECT vital, mean, sd, median FROM standardisation").fetchall()}
    finally:
        con.close()


def _hash(wh) -> str:
    con = duckdb.connect(str(wh), read_only=True)
    try:
        return con.execute("SELECT value FROM build_info WHERE key = 'content_hash'").fetchone()[0]
    finally:
        con.close()


def replay(source, src_root, tmp: Path, k: int, align=False, late_every=0, final=True, name="s.duckdb"):
    """Init with part 0, then one ingest run per further part (the last one final)."""
    root, parts_dir = tmp / "root", tmp / "parts"
    parts = make_replay(source, src_root, root, parts_dir, k, align=align, late_every=late_every)
    sub = root / ("icu" if source == "mimic" else ".")
    wh = tmp / name
    shutil.copy(parts[0], sub / parts[0].name)
    runs = [ingest(wh, source, root, init=True, final=final and k == 1)]
    for i, p in enumerate(parts[1:]):
        shutil.copy(p, sub / p.name)
        runs.append(ingest(wh, source, root, final=final and i == k - 2))
    return wh, root, runs


def batch_root(source, root: Path, tmp: Path) -> Path:
    """The replay's full data in the batch layout (stays tables + every part concatenated)."""
    out = tmp / "batch_root"
    sub = "icu" if source == "mimic" else "."
    stem = "chartevents" if source == "mimic" else "clif_vitals"
    shutil.copytree(root, out, ignore=shutil.ignore_patterns(f"{stem}_part*"))
    parts = sorted((root / sub).glob(f"{stem}_part*.parquet"))
    lst = ", ".join(f"'{p}'" for p in parts)
    dest = out / sub / (stem + ".parquet")
    duckdb.execute(f"COPY (SELECT * FROM read_parquet([{lst}], union_by_name=true)) TO '{dest}' (FORMAT parquet)")
    return out


def frames_equal(a, b) -> float:
    """Exact equality of vitals_hourly and cohort_stays; returns the max |float diff| (0.0)."""
    ca, cb = duckdb.connect(str(a), read_only=True), duckdb.connect(str(b), read_only=True)
    try:
        for t, order in (("cohort_stays", "stay_id"), ("vitals_hourly", "stay_id, hour")):
            cols = [r[0] for r in cb.execute(f"DESCRIBE {t}").fetchall()]
            A = ca.execute(f"SELECT {', '.join(cols)} FROM {t} ORDER BY {order}").fetchnumpy()
            B = cb.execute(f"SELECT {', '.join(cols)} FROM {t} ORDER BY {order}").fetchnumpy()
            for c in cols:
                assert len(A[c]) == len(B[c]), (t, c)
                assert np.array_equal(np.asarray(A[c]), np.asarray(B[c])), (t, c)
        return 0.0
    finally:
        ca.close()
        cb.close()


def gate_deviation(wh) -> tuple[float, int]:
    """Max |score - full-history refit score| over every stay's keys; number of stays checked."""
    from sv_core import rbf_kernel, refit

    keys = Keys.load()
    con = duckdb.connect(str(wh), read_only=True)
    worst, n = 0.0, 0
    try:
        C, sig = st.get_state(con, "C"), st.get_state(con, "sigma")
        q = "SELECT stay_id, subject_id, n_hours FROM cohort_stays ORDER BY stay_id"
        for s, subj, nh in con.execute(q).fetchall():
            toks = st.load_tokens(con, [s])[s]
            sg = st.load_gate(con, keys, s, subj, {h: t for h, (t, _) in toks.items()})
            X = np.column_stack([con.execute(f"SELECT {c} FROM vitals_hourly WHERE stay_id = ? ORDER BY hour", [s]
                                             ).fetchnumpy()[c] for c in Z])
            assert sg.n == X.shape[0] == len(toks) == nh
            a, rho = refit(X, C, sig)
            ref = 2.0 * rbf_kernel(X, X, sig) @ a - rho
            worst = max(worst, float(np.abs(sg.score(X) - ref).max()))
            cert = sg.certificate(exact=True)
            assert cert["future_safe"], cert["reason"]
            n += 1
    finally:
        con.close()
    return worst, n


@pytest.fixture(scope="module")
def synthetic_root(tmp_path_factory):
    from cohort.synthetic import generate

    d = tmp_path_factory.mktemp("syn")
    generate(d / "mimic", stays=30, seed=5, fmt="parquet")
    return d / "mimic"


def test_causal_fill_no_backfill():
    from cohort._hourly import fill_within_stays

    vals = np.array([[np.nan], [5.0], [np.nan]])
    f_b, _ = fill_within_stays(np.array([0, 1, 2]), vals, np.array([3]))
    f_c, obs = fill_within_stays(np.array([0, 1, 2]), vals, np.array([3]), fill="causal")
    assert f_b[:, 0].tolist() == [5.0, 5.0, 5.0]
    assert np.isnan(f_c[0, 0]) and f_c[1:, 0].tolist() == [5.0, 5.0] and obs[:, 0].tolist() == [False, True, False]


def assert_equals_causal_batch(adapter, wh, root, tmp_path):
    """The streamed warehouse equals the causal batch build with the same frozen standardisation
    (content hash and frames), and every stay's gate equals a full-history solve; returns
    (batch summary, frozen table, number of stays checked)."""
    fz = _frozen(wh)
    batch = build_warehouse(adapter, batch_root(adapter, root, tmp_path), tmp_path / "b.duckdb", fill="causal",
                            frozen=fz, progress=False)
    assert batch.content_hash == _hash(wh)
    assert frames_equal(wh, tmp_path / "b.duckdb") == 0.0
    dev, n = gate_deviation(wh)
    assert n == batch.n_stays and dev <= 1e-9
    return batch, fz, n


def test_replay_synthetic_equals_causal_batch(synthetic_root, tmp_path):
    wh, root, runs = replay("mimic", synthetic_root, tmp_path, k=6, align=True, late_every=23)
    steps = [s for r in runs for s in r["steps"]]
    assert len(steps) == 6
    late = sum(s["late_rows"] for s in steps)
    assert late > 0 and sum(s["reopened_hours"] for s in steps) > 0
    # every stay streams through several increments (aligned clock)
    assert max(s["stays_updated"] for s in steps) >= 10
    batch, fz, n = assert_equals_causal_batch("mimic", wh, root, tmp_path)
    # frozen standardisation never recomputed; idempotent rerun; aggregates only in the result
    assert _frozen(wh) == fz
    again = ingest(wh, "mimic", root)
    assert again["steps"] == [] and _hash(wh) == batch.content_hash
    assert runs[-1]["future_safe_stays"] == runs[-1]["gated_stays"] == n


def test_changed_file_refused(synthetic_root, tmp_path):
    from cohort.incremental import SourceChangedError

    wh, root, _ = replay("mimic", synthetic_root, tmp_path, k=2, final=False)
    p = sorted((root / "icu").glob("chartevents_part*"))[0]
    p.write_bytes(p.read_bytes() + b"\0")
    h = _hash(wh)
    with pytest.raises(SourceChangedError):
        ingest(wh, "mimic", root)
    assert _hash(wh) == h


def test_replay_demo_equals_causal_batch(tmp_path):
    from cohort.demo_data import ensure_demo

    try:
        demo = Path(ensure_demo(None))
    except Exception as exc:  # pragma: no cover - depends on the cache
        pytest.skip(f"MIMIC-IV demo not cached: {exc}")
    wh, root, runs = replay("clif", demo, tmp_path, k=5)
    assert_equals_causal_batch("clif", wh, root, tmp_path)


def test_deletion_queue(synthetic_root, tmp_path):
    from pipelines.receipts.ledger import Ledger, default_dir

    root, parts_dir = tmp_path / "root", tmp_path / "parts"
    parts = make_replay("mimic", synthetic_root, root, parts_dir, 3, align=True)
    wh = tmp_path / "s.duckdb"
    shutil.copy(parts[0], root / "icu" / parts[0].name)
    ingest(wh, "mimic", root, init=True)
    keys = Keys.load()
    con = duckdb.connect(str(wh))
    subj, stay = con.execute("SELECT subject_id, stay_id FROM cohort_stays ORDER BY stay_id LIMIT 1").fetchone()
    st.request_deletion(con, "subject", keys.subject_hash(subj))
    st.request_deletion(con, "subject", keys.subject_hash(subj))  # idempotent
    st.request_deletion(con, "stay", keys.stay_hash(987654321))  # unknown: stays pending
    con.close()
    drop = st.drop_folder(wh)
    drop.mkdir()
    other = duckdb.connect(str(wh), read_only=True).execute(
        "SELECT stay_id FROM cohort_stays WHERE subject_id <> ? ORDER BY stay_id LIMIT 1", [subj]).fetchone()[0]
    (drop / "r1.json").write_text(json.dumps({"stay_hash": keys.stay_hash(other)}))
    shutil.copy(parts[1], root / "icu" / parts[1].name)
    r = ingest(wh, "mimic", root)
    assert r["deletions"] == {"imported": 1, "processed": 2, "unknown_pending": 1}
    led = Ledger(default_dir(wh), keys)
    assert len(led.registry()) == 2 and keys.subject_hash(subj) in led.registry()
    shutil.copy(parts[2], root / "icu" / parts[2].name)
    r = ingest(wh, "mimic", root, final=True)
    assert r["deletions"]["unknown_pending"] == 1 and len(led.registry()) == 2
    con = duckdb.connect(str(wh), read_only=True)
    try:
        for t in ("cohort_stays", st.TOKENS, st.GATES):
            assert con.execute(f"SELECT count(*) FROM {t} WHERE subject_id = ?", [subj]).fetchone()[0] == 0
        assert con.execute(f"SELECT count(*) FROM {st.ROWS} WHERE stay_id = ?", [stay]).fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM vitals_hourly WHERE stay_id = ?", [stay]).fetchone()[0] == 0
        done = con.execute(f"SELECT status, count(*) FROM {st.REQUESTS} GROUP BY status ORDER BY status").fetchall()
    finally:
        con.close()
    assert done == [("done", 2), ("pending", 1)]
