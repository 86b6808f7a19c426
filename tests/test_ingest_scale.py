"""The nightly ingest at scale (issue 21 item 4): what makes it cheap must not change a result.

* the flat gate-state blob round-trips exactly, refuses anything but plain arrays, and old npz
  blobs still load; the vectorised token digest is the reference digest;
* worker processes and batch sizes do not change a byte of the warehouse (gate blobs, MACs,
  tokens, hourly rows);
* a run with nothing new reads no part file (stat only); a touched file is hashed once, a
  same-size edit is refused;
* a warehouse written before (npz blobs, no mtime column) keeps ingesting, exactly;
* a stored gate failing its MAC stops the run (typed) before that stay is updated;
* the benchmark command writes its result file (figures are not asserted: benchmarks are commands).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import duckdb
import numpy as np
import pytest

from cohort.incremental.replay import make_replay
from pipelines.ingest import ingest
from pipelines.ingest import state as st
from pipelines.settings import IngestSettings


@pytest.fixture(scope="module")
def replay_parts(tmp_path_factory):
    from cohort.synthetic import generate

    d = tmp_path_factory.mktemp("scalesyn")
    generate(d / "mimic", stays=24, seed=11, fmt="parquet")
    root = d / "root"
    return root, make_replay("mimic", d / "mimic", root, d / "parts", 4, align=True, late_every=19)


def _copy_root(replay_parts, tmp: Path) -> tuple[Path, list[Path]]:
    src, parts = replay_parts
    root = tmp / "root"
    shutil.copytree(src, root, ignore=shutil.ignore_patterns("chartevents_part*"))
    return root, parts


def _dump(wh) -> dict:
    con = duckdb.connect(str(wh), read_only=True)
    try:
        out = {}
        for t, order in ((st.GATES, "stay_id"), (st.TOKENS, "stay_id, hour"), ("vitals_hourly", "stay_id, hour"),
                         ("cohort_stays", "stay_id")):
            cols = [r[0] for r in con.execute(f"DESCRIBE {t}").fetchall() if r[0] != "step"]
            out[t] = con.execute(f"SELECT {', '.join(cols)} FROM {t} ORDER BY {order}").fetchall()
        out["hash"] = con.execute("SELECT value FROM build_info WHERE key = 'content_hash'").fetchone()
        return out
    finally:
        con.close()


def test_state_codec_round_trip_and_refusals():
    from pipelines.store.gate_store import state_to_npz
    from sv_core import StreamingGate, calibrate_C

    rng = np.random.default_rng(3)
    g = StreamingGate(calibrate_C(nu=0.3, n0=48), 3.0)
    g.admit(rng.normal(scale=0.6, size=(70, 6)))
    g.evict_reserve()
    g.forget(int(g.cold_ids[0]))
    state = g.to_state()
    blob = st.encode_state(state)
    back = st.decode_state(blob)
    assert set(back) == set(state)
    for k, v in state.items():
        a = np.asarray(v)
        assert back[k].dtype == a.dtype and back[k].shape == a.shape and np.array_equal(back[k], a), k
    P = rng.normal(scale=0.6, size=(50, 6))
    for b in (blob, state_to_npz(state)):  # the flat blob and an older npz blob
        h = StreamingGate.from_state(st.decode_state(b))
        assert np.array_equal(h.score(P), g.score(P)) and np.array_equal(h.hot_ids, g.hot_ids)
    assert st.encode_state(st.decode_state(blob)) == blob
    with pytest.raises(st.IngestError):
        st.encode_state({"x": np.array([object()])})
    bad = blob.replace(b'"<f8"', b'"|O8"', 1)
    with pytest.raises(st.IngestError):
        st.decode_state(bad)
    with pytest.raises(st.IngestError):
        st.decode_state(blob[:40])
    small = st.encode_state({"x": np.arange(3.0)})
    assert b'[3],0]' in small
    for edit in (b'[-1],0]', b'[3],-8]', b'[4],0]', b'[1.5],0]', b'["3"],0]'):  # a count of -1 would read "all"
        with pytest.raises(st.IngestError):
            st.decode_state(small.replace(b'[3],0]', edit).replace(small[5:9], (len(small[9:small.index(b']]') + 2])
                                                                              + len(edit) - 6).to_bytes(4, "little")))


def test_token_digest_arrays_equals_the_reference():
    from pipelines.store.gate_store import token_digest

    rng = np.random.default_rng(0)
    for n in (0, 1, 57):
        tok = rng.permutation(10 * n + 1)[:n]
        hour = rng.permutation(n)
        rows = [(int(t), 7, 1234, int(h)) for t, h in zip(tok, hour)]
        assert st.token_digest_arrays(tok, 7, 1234, hour) == token_digest(rows)
    assert st.token_digest_arrays([1, 2], 7, 1234, [0, 1]) != st.token_digest_arrays([2, 1], 7, 1234, [0, 1])


def test_workers_and_batch_size_change_nothing(replay_parts, tmp_path, monkeypatch):
    import pipelines.ingest.gates as ig

    monkeypatch.setattr(ig, "PARALLEL_MIN_STAYS", 1)
    dumps = []
    for name, kw in (("inline", {"jobs": 1}), ("workers", {"jobs": 2, "batch_stays": 3})):
        root, parts = _copy_root(replay_parts, tmp_path / name)
        wh = tmp_path / name / "s.duckdb"
        shutil.copy(parts[0], root / "icu" / parts[0].name)
        ingest(wh, "mimic", root, init=True, settings=IngestSettings(**kw))
        steps = []
        for i, p in enumerate(parts[1:]):
            shutil.copy(p, root / "icu" / p.name)
            steps += ingest(wh, "mimic", root, final=i == len(parts) - 2, settings=IngestSettings(**kw))["steps"]
        assert max(s["stays_updated"] for s in steps) > 3 and sum(s["late_rows"] for s in steps) > 0
        assert sum(s["replaced_tokens"] for s in steps) > 0
        if name == "workers":
            assert steps[0]["batches"] > 1 and steps[0]["timing"]["worker_cpu_s"] > 0
        dumps.append(_dump(wh))
    assert dumps[0] == dumps[1]


def test_nothing_new_reads_no_file_and_changes_are_caught(replay_parts, tmp_path, monkeypatch):
    import cohort.incremental as inc
    from cohort.incremental import SourceChangedError

    root, parts = _copy_root(replay_parts, tmp_path)
    wh = tmp_path / "s.duckdb"
    for p in parts[:2]:
        shutil.copy(p, root / "icu" / p.name)
    ingest(wh, "mimic", root, init=True)
    h = _dump(wh)["hash"]

    def no_read(*a, **k):
        raise AssertionError("a recorded, unchanged file was read")

    with monkeypatch.context() as m:
        m.setattr(inc, "file_identity", no_read)
        r = ingest(wh, "mimic", root)
    assert r["steps"] == [] and r["files"] == {"known": 2, "new": 0, "hashed": 0}
    f = root / "icu" / parts[1].name
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))  # touched, same bytes
    assert ingest(wh, "mimic", root)["files"]["hashed"] == 1
    assert ingest(wh, "mimic", root)["files"]["hashed"] == 0  # its new mtime was recorded
    b = bytearray(f.read_bytes())
    b[len(b) // 2] ^= 0xFF  # same size, other bytes, new mtime
    f.write_bytes(bytes(b))
    with pytest.raises(SourceChangedError):
        ingest(wh, "mimic", root)
    assert _dump(wh)["hash"] == h


def test_older_warehouse_keeps_ingesting_exactly(replay_parts, tmp_path):
    from test_ingest import assert_equals_causal_batch

    from pipelines.store.gate_store import state_to_npz
    from pipelines.store.keys import Keys

    root, parts = _copy_root(replay_parts, tmp_path)
    wh = tmp_path / "s.duckdb"
    for i, p in enumerate(parts[:2]):
        shutil.copy(p, root / "icu" / p.name)
        ingest(wh, "mimic", root, init=i == 0)
    keys = Keys.load()
    con = duckdb.connect(str(wh))
    try:  # as written before: npz gate blobs (MAC'd the same way), no mtime column
        for s, subj, blob in con.execute(f"SELECT stay_id, subject_id, state_npz FROM {st.GATES}").fetchall():
            tok = con.execute(f"SELECT token_id, hour FROM {st.TOKENS} WHERE stay_id = ?", [s]).fetchnumpy()
            old = state_to_npz(st.decode_state(bytes(blob)))
            mac = st.gate_mac(keys, s, old, digest=st.token_digest_arrays(tok["token_id"], subj, s, tok["hour"]))
            con.execute(f"UPDATE {st.GATES} SET state_npz = ?::BLOB, state_mac = ? WHERE stay_id = ?", [old, mac, s])
        con.execute(f"ALTER TABLE {st.FILES} DROP COLUMN mtime_ns")
    finally:
        con.close()
    for p in parts[2:]:
        shutil.copy(p, root / "icu" / p.name)
    r = ingest(wh, "mimic", root, final=True)
    assert r["files"]["hashed"] == len(parts)  # recorded files without an mtime are hashed once
    assert_equals_causal_batch("mimic", wh, root, tmp_path)
    assert ingest(wh, "mimic", root)["files"]["hashed"] == 0


def test_edited_token_map_stops_the_run(replay_parts, tmp_path):
    root, parts = _copy_root(replay_parts, tmp_path)
    wh = tmp_path / "s.duckdb"
    shutil.copy(parts[0], root / "icu" / parts[0].name)
    ingest(wh, "mimic", root, init=True)
    con = duckdb.connect(str(wh))
    s = con.execute(f"SELECT min(stay_id) FROM {st.GATES}").fetchone()[0]
    con.execute(f"UPDATE {st.TOKENS} SET subject_id = subject_id + 1 WHERE stay_id = ? AND hour = 0", [s])
    before = con.execute(f"SELECT state_npz, step FROM {st.GATES} WHERE stay_id = ?", [s]).fetchone()
    con.close()
    shutil.copy(parts[1], root / "icu" / parts[1].name)
    with pytest.raises(st.IngestError, match="MAC"):
        ingest(wh, "mimic", root)
    con = duckdb.connect(str(wh), read_only=True)
    try:
        assert con.execute(f"SELECT state_npz, step FROM {st.GATES} WHERE stay_id = ?", [s]).fetchone() == before
    finally:
        con.close()


def test_benchmark_command_writes_its_result(tmp_path):
    from pipelines.bench.ingest import main

    assert main(["--stays", "30", "--days", "2", "--history-hours", "24", "--dir", str(tmp_path / "b"),
                 "--out", str(tmp_path / "out"), "--jobs", "1"]) == 0
    res = json.loads((tmp_path / "out" / "bench_ingest_30.json").read_text())
    ph = {p["phase"]: p for p in res["phases"]}
    assert list(ph) == ["init", "day1", "nothing_new", "day2", "nothing_new_end"]
    assert ph["nothing_new"]["steps"] == 0 and ph["nothing_new"]["stays_touched"] == 0
    for d in ("day1", "day2"):  # every stay is live: a day is 24 new hours of each of the 30 stays
        assert ph[d]["stays_touched"] == 30 and abs(ph[d]["new_tokens"] - 30 * 24) <= 30, ph[d]
        assert ph[d]["wall_s"] > 0 and ph[d]["peak_rss_mb"] > 0
    # the documented table is generated from this result file: one row per phase, its own counts
    assert main(["--table", str(tmp_path / "out" / "bench_ingest_30.json")]) == 0
    from pipelines.bench.ingest import table

    rows = [ln for ln in table(res).splitlines() if ln.startswith("| ") and not ln.startswith("| phase")]
    assert [r.split(" | ")[0][2:] for r in rows] == list(ph)
    for r, p in zip(rows, ph.values()):
        cells = [c.strip() for c in r.strip("|").split("|")]
        assert cells[5] == f"{p['new_tokens']:,}" and cells[4] == f"{p['stays_touched']:,}", (r, p)


def test_benchmark_cli_table_reads_both_summary_forms():
    from pipelines.bench.ingest import _own_seconds, table

    assert _own_seconds("ingest: nothing new (1 files known, 0 hashed); warehouse 3 stays; 3.8 s") == 3.8
    assert _own_seconds('{"steps": 0, "seconds": 5.71}') == 5.71
    assert _own_seconds("ingest: something else") is None
    runs = [{"side": s, "run": k, "repeat": i, "wall_s": w, "load_after": [1.0, 1.0, 1.0],
             "last_line": f"ingest: x; {w / 2:.1f} s"}
            for i, (s, k, w) in enumerate([("a", "first", 10.0), ("a", "nothing_new", 4.0), ("a", "first", 12.0),
                                           ("a", "nothing_new", 6.0)])]
    md = table({"kind": "cli", "stays": 5, "repeats": 2, "sides": {"a": "/x/main"}, "runs": runs})
    assert "| a (main) | 11.0 (10.0–12.0) | 5.0 (4.0–6.0) | 5.5 (5.0–6.0) / 2.5 (2.0–3.0) | 1.0–1.0 |" in md, md
