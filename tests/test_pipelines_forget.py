"""Durable deletion (issue 9): registry across rebuilds, physical erasure, keyed ledger and anchors,
authenticated gate states, certified outcomes, stale results, one writer at a time, clean messages.

No Prefect server: the build task's function (``build_task.fn``) and ``forget_subject`` are
called directly; the CLI is called through ``pipelines.cli.main``.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pytest

from cohort.build import build_warehouse
from cohort.streams import iter_stays
from cohort.synthetic import generate
from evaluation.clinical import patient_deletion as pdel
from pipelines.cli import main
from pipelines.errors import AlreadyForgottenError, GateStoreError, LedgerKeyError, UnknownSubjectError
from pipelines.receipts.ledger import Ledger, default_dir
from pipelines.store import gate_store
from pipelines.store import warehouse as wh
from pipelines.store.forget import forget_subject
from pipelines.store.keys import Keys
from pipelines.store.warehouse import Warehouse, cache_dir

ROOT = Path(__file__).resolve().parents[1]
FIX = Path(__file__).parent / "fixtures" / "cohort"


def _build(warehouse: Path, source: str = "mimic", root=None, min_hours: float = 48) -> dict:
    """The pipelines' build (registry applied), without a Prefect server."""
    from pipelines.flows.clinical_cohort import build_task
    from pipelines.settings import CohortSettings

    return build_task.fn(source, str(root) if root else None, str(warehouse),
                         CohortSettings(min_hours=min_hours, memory_limit="1GB"), runs_dir=str(warehouse.parent))


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    d = tmp_path_factory.mktemp("src")
    generate(d / "mimic", stays=30, seed=0, fmt="parquet")
    return d / "mimic"


@pytest.fixture(scope="module")
def base_site(src, tmp_path_factory):
    """runs/ with a warehouse built from ``src`` (outside runs/), gates of two studies stored."""
    runs = tmp_path_factory.mktemp("base") / "runs"
    runs.mkdir()
    p = runs / "warehouse.duckdb"
    _build(p, "mimic", src)
    stays = wh.stays(p)
    group = pdel.plan_contexts(stays, 5, seed=0)[0]
    by_id = {s.stay_id: s for s in iter_stays(str(p), stay_ids=group)}
    ctx = pdel.build_context([by_id[s] for s in group])
    r = pdel.forget_patient(ctx, 0, gammas=(0.1,))
    r.update(token_subject=ctx.subject, token_stay=ctx.stay, token_hour=ctx.hour)
    from sv_core import Gate

    ctxs = [gate_store.StoredContext(Gate.from_state(r["gate_state"]), r["token_subject"], r["token_stay"],
                                     r["token_hour"])]
    gates = _retention_batch(str(p), group[:3])["gates"]
    ret_ctx = [gate_store.StoredContext(g, np.full(g.n, x["subject_id"]), np.full(g.n, x["stay_id"]), x["hours"])
               for x in gates for g in [gate_store.blob_to_gate(np.asarray(x["staged"]["blob"]).tobytes())]]
    con = duckdb.connect(str(p))
    gate_store.replace_study(con, "patient_deletion", ctxs)
    gate_store.replace_study(con, "icu_retention", ret_ctx)
    con.close()
    subj = {s: sub for s, sub, _, _ in stays}
    return p, [subj[s] for s in group]


@pytest.fixture
def site(base_site, tmp_path):
    """A fresh copy of the base site (its own runs/, no ledger yet)."""
    p0, subjects = base_site
    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copy(p0, runs / p0.name)
    return runs / p0.name, subjects


def _count(p, sql, args=()):
    con = duckdb.connect(str(p), read_only=True)
    try:
        return con.execute(sql, list(args)).fetchone()[0]
    finally:
        con.close()


def encodings(i: int) -> dict[str, bytes]:
    return {"decimal": str(i).encode(), "int32": np.int32(i).tobytes(), "int64": np.int64(i).tobytes()}


def _retention_batch(warehouse: str, stay_ids) -> dict:
    """The retention study's map step over stays, with their gates (record-level)."""
    from evaluation.clinical.retention_spec import StaySpec
    from pipelines.flows.retention_chunks import batch_results

    return batch_results(warehouse, list(stay_ids), StaySpec(build_gate=True))


def byte_hits(folders, ids) -> list[tuple[str, int, str]]:
    out = []
    for folder in folders:
        for f in Path(folder).rglob("*"):
            if f.is_file():
                b = f.read_bytes()
                out += [(str(f), i, k) for i in ids for k, pat in encodings(i).items() if pat in b]
    return out


# ------------------------------------------------------------------------------ 1. registry + rebuild
def _clif_root(tmp: Path) -> Path:
    from test_cohort_build import materialise_clif  # the CLIF fixture as parquet (VARCHAR ids, TIMESTAMPTZ)

    return materialise_clif(tmp / "clif")


@pytest.mark.parametrize("adapter", ["mimic", "clif", "demo"])
def test_forget_survives_rebuild_from_every_adapter(adapter, src, tmp_path):
    if adapter == "mimic":
        root, min_h = src, 48
    elif adapter == "clif":
        root, min_h = _clif_root(tmp_path), 0
    else:
        from cohort.demo_data import DemoDataMissing, ensure_demo

        try:
            root, min_h = ensure_demo(None), 48
        except DemoDataMissing:
            pytest.skip("demo not fetched: python -m cohort.demo_data fetch")
        adapter = "demo"
    runs = tmp_path / "runs"
    p = runs / "warehouse.duckdb"
    s0 = _build(p, adapter, root if adapter != "demo" else None, min_h)
    n0 = s0["n_stays"]
    target, n_stays = (_count(p, "SELECT subject_id FROM cohort_stays ORDER BY stay_id LIMIT 1"), None)
    n_stays = _count(p, "SELECT count(*) FROM cohort_stays WHERE subject_id = ?", [target])
    r = forget_subject(p, subject_id=target)
    assert r.receipt_seq == 1 and _count(p, "SELECT count(*) FROM cohort_stays WHERE subject_id = ?", [target]) == 0
    s1 = _build(p, adapter, root if adapter != "demo" else None, min_h)  # a full rebuild from the source
    assert s1["n_stays"] == n0 - n_stays
    assert _count(p, "SELECT count(*) FROM cohort_stays WHERE subject_id = ?", [target]) == 0
    funnel = dict((s, a) for s, a, _ in s1["funnel"])
    assert funnel["icu_stays_in_source"] - funnel["not_in_forget_registry"] >= n_stays >= 1  # counts only
    assert main(["receipts", "verify", "--warehouse", str(p)]) == 0
    led = Ledger(default_dir(p), Keys.load())
    assert len(led.rows()) == 1 and led.verify()["n_rows"] == 1
    with pytest.raises(AlreadyForgottenError):
        forget_subject(p, subject_id=target)


# ------------------------------------------------------------------------------ 2. physical erasure
def test_no_byte_of_the_patient_remains(site, tmp_path):
    p, subjects = site
    target = subjects[1]
    stays = [r[0] for r in duckdb.connect(str(p), read_only=True).execute(
        "SELECT stay_id FROM cohort_stays WHERE subject_id = ?", [target]).fetchall()]
    # a cached per-stay task result (record-level JSON) beside the warehouse: the positive control
    from pipelines.runtime import task_cache

    @task_cache.cached
    def per_stay(warehouse, content_hash, stay_ids):
        return _retention_batch(warehouse, stay_ids)
    per_stay(str(p), "h", stays)
    assert byte_hits([cache_dir(p)], [target]), "the scan must see the id where it is present"
    header = p.read_bytes()[:3 * 4096]
    (p.parent / "icu_retention").mkdir()
    (p.parent / "icu_retention" / "result.json").write_text("{}")
    r = forget_subject(p, subject_id=target)
    assert r.certified
    ids = [target] + stays
    assert byte_hits([p.parent, os.environ["FORGETFUL_CONFIG_DIR"]], ids) == []
    assert not cache_dir(p).exists() and not Path(str(p) + ".wal").exists()
    # the attack that used to restore the patient: put the old header blocks back
    forged = tmp_path / "forged.duckdb"
    shutil.copy(p, forged)
    with open(forged, "r+b") as fh:
        fh.write(header)
    # in a child process: DuckDB may abort() on a corrupted file
    code = ("import duckdb, sys\ntry:\n    c = duckdb.connect(sys.argv[1], read_only=True)\n"
            "    print(c.execute('SELECT count(*) FROM cohort_stays WHERE subject_id = ?', "
            "[int(sys.argv[2])]).fetchone()[0])\n"
            "except Exception:\n    print(0)\n")
    out = subprocess.run([sys.executable, "-c", code, str(forged), str(target)], capture_output=True, text=True)
    assert out.stdout.strip() in ("0", ""), out.stdout  # "" = DuckDB aborted on the forged file


def test_pending_erasure_is_completed_by_the_next_command(site, monkeypatch):
    import pipelines.store.forget as fg

    p, subjects = site
    target = subjects[0]

    def crash(*a, **k):
        raise KeyboardInterrupt("killed after the receipt was committed")
    monkeypatch.setattr(fg, "apply_erasure", crash)
    with pytest.raises(KeyboardInterrupt):
        forget_subject(p, subject_id=target)
    monkeypatch.undo()
    assert _count(p, "SELECT count(*) FROM cohort_stays WHERE subject_id = ?", [target]) > 0  # not yet erased
    out = subprocess.run([sys.executable, "-m", "pipelines.cli", "receipts", "verify", "--warehouse", str(p)],
                         capture_output=True, text=True, cwd=ROOT, env=os.environ.copy())
    res = json.loads(out.stdout)  # a pending erasure is not a verified warehouse (issue 19)
    assert out.returncode == 1 and res["pending_erasures"] == 1 and res["warehouse_verified"] is False
    assert "NOT VERIFIED" in out.stderr
    r = forget_subject(p, subject_id=target)  # rerun: completes, does not refuse
    assert r.recovered and r.receipt_seq == 1
    assert _count(p, "SELECT count(*) FROM cohort_stays WHERE subject_id = ?", [target]) == 0
    assert len(Ledger(default_dir(p), Keys.load()).rows()) == 1  # no second receipt


def test_low_level_build_cannot_bring_a_patient_back(site, src):
    p, subjects = site
    target = subjects[2]
    forget_subject(p, subject_id=target)
    build_warehouse("mimic", src, p, progress=False, memory_limit="1GB")  # bypasses the registry
    assert _count(p, "SELECT count(*) FROM cohort_stays WHERE subject_id = ?", [target]) > 0
    with Warehouse.open(p) as w:  # what every command does first
        assert len(w.completed) == 1
    assert _count(p, "SELECT count(*) FROM cohort_stays WHERE subject_id = ?", [target]) == 0


def test_stale_temporaries_are_removed_by_the_next_command(site):
    p, _ = site
    dead = 2 ** 22 + 12345
    files = [p.parent / f".{p.name}.building-{dead}", p.parent / f".{p.name}.forget-{dead}",
             p.parent / f".{p.name}.building-{dead}.wal"]
    for f in files:
        f.write_bytes(b"record-level")
    (p.parent / f".{p.name}.building-{dead}.buckets").mkdir()
    # a live process's pid is no sign of an owner: under the writer lock no other command writes
    # this warehouse, so the file is a killed command's orphan whose pid was reused (issue 31)
    reused = p.parent / f".{p.name}.building-{os.getppid()}"
    reused.write_bytes(b"record-level")
    mine = p.parent / f".{p.name}.forget-{os.getpid()}"  # this process's own is never swept under it
    mine.write_bytes(b"in flight")
    with Warehouse.open(p):
        pass
    assert not any(f.exists() for f in files) and not (p.parent / f".{p.name}.building-{dead}.buckets").exists()
    assert not reused.exists() and mine.exists()
    mine.unlink()


# ------------------------------------------------------------------------------ 3. caches
def test_task_cache_is_authenticated_json(site):
    from pipelines.runtime import task_cache

    p, _ = site
    calls = []

    @task_cache.cached
    def body(warehouse, content_hash, x):
        calls.append(x)
        return {"a": np.arange(3, dtype=np.int64), "x": x}
    assert body(str(p), "h", 2)["x"] == 2 and body(str(p), "h", 2)["x"] == 2 and calls == [2]
    (f,) = cache_dir(p).glob("body-*.json")
    mac, text = f.read_text().split("\n", 1)
    f.write_text(mac + "\n" + text.replace('"x":2', '"x":3'))  # a forged result
    assert body(str(p), "h", 2)["x"] == 2 and calls == [2, 2]  # recomputed, never served
    with pytest.raises(TypeError):
        task_cache.dumps({"o": np.array([object()])})


def test_no_flow_task_persists_results_with_prefect():
    import importlib
    import pkgutil

    from prefect import Task

    import pipelines.flows as flows

    seen = 0
    for m in pkgutil.iter_modules(flows.__path__):
        mod = importlib.import_module(f"pipelines.flows.{m.name}")
        for obj in vars(mod).values():
            if isinstance(obj, Task):
                seen += 1
                assert obj.persist_result is not True, f"{m.name}.{obj.name} persists (pickled) results"
    assert seen >= 4


# ------------------------------------------------------------------------------ 4. ledger tamperings
@pytest.fixture(scope="module")
def base_ledger_site(base_site, tmp_path_factory):
    p0, subjects = base_site
    runs = tmp_path_factory.mktemp("ledger") / "runs"
    runs.mkdir()
    p = runs / p0.name
    shutil.copy(p0, p)
    for s in subjects[:3]:
        forget_subject(p, subject_id=s, verify=False)
    v = Ledger(default_dir(p), Keys.load()).verify()
    from pipelines.receipts.logaudit import FILE, anchor_path

    return p, v["head"], v["n_rows"], subjects[0], anchor_path(default_dir(p) / FILE).read_bytes()


@pytest.fixture
def ledger_site(base_ledger_site, tmp_path):
    """A copy of a warehouse after three forgets, its ledger, and its anchor (re-keyed to the copy's
    path); returns (warehouse, head, count, erased subject)."""
    from pipelines.receipts.logaudit import FILE, anchor_path

    p0, head, n, erased, anchor = base_ledger_site
    runs = tmp_path / "runs"
    shutil.copytree(p0.parent, runs)
    p = runs / p0.name
    a = anchor_path(default_dir(p) / FILE)  # the signed anchor, filed under the copy's path
    a.parent.mkdir(parents=True, exist_ok=True)
    a.write_bytes(anchor)
    return p, head, n, erased


def _lines(p):
    f = default_dir(p) / "receipts.jsonl"
    return f, f.read_text().splitlines()


def _write(f, lines):
    f.write_text("".join(line + "\n" for line in lines))


def _edit(field, value):
    def go(p, _s):
        f, ls = _lines(p)
        d = json.loads(ls[1])
        d[field] = value
        ls[1] = json.dumps(d, sort_keys=True, separators=(",", ":"))
        _write(f, ls)
    return go


def _rechain(key: bytes | None):
    """Recompute every row's link and MAC (unkeyed SHA-256 as the old ledger did, or another key)."""
    def go(p, _s):
        import hashlib

        from pipelines.receipts.ledger import GENESIS, Row, canonical_json

        f, ls = _lines(p)
        prev, out = GENESIS, []
        for line in ls:
            d = json.loads(line)
            d["payload"]["certified"] = False
            r = Row(**{**d, "prev": prev, "mac": ""})
            mac = (hashlib.sha256(r.body()).hexdigest() if key is None else Keys(key).mac("ledger", r.body()))
            out.append(canonical_json({**r.to_json(), "mac": mac}))
            prev = mac
        _write(f, out)
    return go


def _forge_append(p, _s):
    f, ls = _lines(p)
    d = json.loads(ls[-1])
    d.update(seq=d["seq"] + 1, prev=d["mac"], mac="ab" * 32, subject_id_hash="cd" * 32)
    _write(f, ls + [json.dumps(d, sort_keys=True, separators=(",", ":"))])


def _replay_append(p, _s):
    f, ls = _lines(p)
    d = json.loads(ls[0])
    d["seq"] = len(ls) + 1
    _write(f, ls + [json.dumps(d, sort_keys=True, separators=(",", ":"))])


def _rollback(p, _s):
    """Registry and config folder restored from a backup taken after receipt 2: the log, its heads
    and the signed anchor all agree on size 2; only the warehouse (and the auditor) recorded 3."""
    from pipelines.receipts.logaudit import FILE, HEADS, anchor_path
    from pipelines.receipts.logaudit import canonical_json as cj

    f, ls = _lines(p)
    _write(f, ls[:2])
    h = default_dir(p) / HEADS
    heads = h.read_text().splitlines()[:2]
    _write(h, heads)
    anchor_path(default_dir(p) / FILE).write_text(cj({"head": json.loads(heads[1]), "ledger": str(f)}))


def _reinsert(p, subject):
    con = duckdb.connect(str(p))
    con.execute("INSERT INTO cohort_stays SELECT 999999001, ?, NULL, intime, outtime, n_hours, split "
                "FROM cohort_stays LIMIT 1", [subject])
    con.close()


def _forge_head_signature(p, _s):
    h = default_dir(p) / "heads.jsonl"
    ls = h.read_text().splitlines()
    d = json.loads(ls[-1])
    d["signature"] = ("1" if d["signature"][0] != "1" else "2") + d["signature"][1:]
    _write(h, ls[:-1] + [json.dumps(d, sort_keys=True, separators=(",", ":"))])


def _plain_anchor(p, _s):
    from pipelines.receipts.logaudit import FILE, anchor_path

    f, ls = _lines(p)
    _write(f, ls[:2])
    anchor_path(default_dir(p) / FILE).write_text(json.dumps({"seq": 2, "head": json.loads(ls[1])["mac"]}))


def _drop_anchor_and_truncate(p, _s):
    f, ls = _lines(p)
    _write(f, ls[:-1])
    shutil.rmtree(Path(os.environ["FORGETFUL_CONFIG_DIR"]) / "anchors")


TAMPERINGS = {
    "edit payload": _edit("payload", {"certified": False}),
    "edit timestamp": _edit("ts", "2000-01-01T00:00:00Z"),
    "edit kind": _edit("kind", "noop"),
    "edit subject hash": _edit("subject_id_hash", "00" * 32),
    "edit key fingerprint": _edit("key_fp", "0" * 16),
    "edit prev link": _edit("prev", "11" * 32),
    "edit mac": _edit("mac", "22" * 32),
    "delete a middle row": lambda p, s: (lambda f, ls: _write(f, ls[:1] + ls[2:]))(*_lines(p)),
    "delete the last row": lambda p, s: (lambda f, ls: _write(f, ls[:-1]))(*_lines(p)),
    "delete every row": lambda p, s: _lines(p)[0].write_text(""),
    "delete the ledger file": lambda p, s: _lines(p)[0].unlink(),
    "delete the ledger folder": lambda p, s: shutil.rmtree(default_dir(p)),
    "swap two rows": lambda p, s: (lambda f, ls: _write(f, [ls[1], ls[0], ls[2]]))(*_lines(p)),
    "duplicate a row": lambda p, s: (lambda f, ls: _write(f, ls + [ls[-1]]))(*_lines(p)),
    "recompute the chain (unkeyed sha256)": _rechain(None),
    "recompute the chain (attacker's key)": _rechain(b"x" * 40),
    "append a forged receipt": _forge_append,
    "append a replayed receipt": _replay_append,
    "roll back ledger and anchor": _rollback,
    "whitespace-only edit": lambda p, s: (lambda f, ls: _write(f, [ls[0].replace(",", ", ", 1)] + ls[1:]))(*_lines(p)),
    "truncate mid-line": lambda p, s: (lambda f: f.write_bytes(f.read_bytes()[:-7]))(_lines(p)[0]),
    "drop the anchor and truncate": _drop_anchor_and_truncate,
    "re-insert deleted data": _reinsert,
    "CRLF line endings": lambda p, s: (lambda f: f.write_bytes(f.read_bytes().replace(b"\n", b"\r\n")))(_lines(p)[0]),
    "trailing garbage": lambda p, s: (lambda f: f.write_bytes(f.read_bytes() + b"x"))(_lines(p)[0]),
    "forged head signature": _forge_head_signature,
    "unsigned plain-JSON anchor": _plain_anchor,
}


@pytest.mark.parametrize("name", list(TAMPERINGS))
def test_every_tampering_is_detected(name, ledger_site, capsys):
    p, head, n, erased = ledger_site
    assert main(["receipts", "verify", "--warehouse", str(p), "--head", head, "--min-count", str(n)]) == 0
    TAMPERINGS[name](p, erased)
    rc = main(["receipts", "verify", "--warehouse", str(p), "--head", head, "--min-count", str(n)])
    assert rc == 1, f"{name}: not detected (exit {rc})"
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(erased) not in err


def test_tampered_ledger_stops_every_writer(ledger_site):
    p, *_ = ledger_site
    f, ls = _lines(p)
    _write(f, ls[:-1])  # truncation: the anchor in the config dir sees it
    from pipelines.errors import LedgerTamperedError

    with pytest.raises(LedgerTamperedError):
        with Warehouse.open(p):
            pass
    with pytest.raises(LedgerTamperedError):
        _build(p, "mimic", None)


# ------------------------------------------------------------------------------ 5. keys
def test_key_management(site, monkeypatch, tmp_path):
    p, subjects = site
    cfg = Path(os.environ["FORGETFUL_CONFIG_DIR"])
    kf = cfg / "ledger.key"
    assert kf.is_file() and (kf.stat().st_mode & 0o777) == 0o600
    assert not list(p.parent.glob("*key*"))  # nothing key-like beside the warehouse
    for bad in ("", "short"):
        monkeypatch.setenv("FORGETFUL_LEDGER_KEY", bad)
        with pytest.raises(LedgerKeyError):
            Keys.load()
    monkeypatch.delenv("FORGETFUL_LEDGER_KEY")
    loose = tmp_path / "loose.key"
    loose.write_text("k" * 64)
    loose.chmod(0o644)
    monkeypatch.setenv("FORGETFUL_KEY_FILE", str(loose))
    with pytest.raises(LedgerKeyError, match="chmod 600"):
        Keys.load()
    monkeypatch.delenv("FORGETFUL_KEY_FILE")
    forget_subject(p, subject_id=subjects[0], verify=False)
    monkeypatch.setenv("FORGETFUL_LEDGER_KEY", "z" * 64)  # a different key later
    with pytest.raises(LedgerKeyError, match="fingerprint"):
        forget_subject(p, subject_id=subjects[0], verify=False)  # no second receipt for the same patient
    monkeypatch.delenv("FORGETFUL_LEDGER_KEY")
    assert len(Ledger(default_dir(p), Keys.load()).rows()) == 1


# ------------------------------------------------------------------------------ 6. gate states
def test_corrupted_gate_blob_never_blocks_a_deletion(site, capsys):
    """Issue 19: an edited (or otherwise unusable) stored gate used to stop the forget with
    GateStoreError until a rebuild. It now fails toward erasure: the context is removed whole,
    the receipt says why, and the printed line says so."""
    import hashlib

    p, subjects = site
    con = duckdb.connect(str(p))
    cid, blob = con.execute("SELECT context_id, state_npz FROM gate_states WHERE study = 'patient_deletion'").fetchone()
    st = gate_store.npz_to_state(blob)
    st["alpha"] = st["alpha"] * 2
    forged = gate_store.state_to_npz(st)
    con.execute("UPDATE gate_states SET state_npz = ?, state_mac = ? WHERE context_id = ?",
                [forged, hashlib.sha256(forged).hexdigest(), cid])
    with pytest.raises(GateStoreError, match="MAC"):
        gate_store.load_gate(con, cid)  # the stored state is still refused as a gate
    con.close()
    r = forget_subject(p, subject_id=subjects[0])
    assert _count(p, "SELECT count(*) FROM cohort_stays WHERE subject_id = ?", [subjects[0]]) == 0
    assert _count(p, "SELECT count(*) FROM gate_tokens WHERE context_id = ?", [cid]) == 0
    assert _count(p, "SELECT count(*) FROM gate_states WHERE context_id = ?", [cid]) == 0
    (c,) = [x for x in r.contexts if x["context_id"] == cid]
    assert c["action"] == "removed" and c["reason"] == "stored state unusable" and c["certified"] is True
    assert "MAC" in c["detail"]
    row = Ledger(default_dir(p), Keys.load()).rows()[-1]  # what the receipt itself records
    assert [x["reason"] for x in row.payload["contexts"] if x["context_id"] == cid] == ["stored state unusable"]
    assert "stored state was unusable" in r.summary_line()
    assert "stored state unusable" in capsys.readouterr().err


def test_token_map_edited_to_hide_a_patient_never_keeps_them(site):
    """A token map edited to hide a patient's tokens fails its MAC: the forget removes that
    context whole (the hidden tokens with it) instead of skipping it."""
    p, subjects = site
    cids = [r[0] for r in duckdb.connect(str(p), read_only=True).execute(
        "SELECT DISTINCT context_id FROM gate_tokens WHERE subject_id = ?", [subjects[0]]).fetchall()]
    con = duckdb.connect(str(p))
    con.execute("UPDATE gate_tokens SET subject_id = 1 WHERE subject_id = ?", [subjects[0]])
    con.close()
    r = forget_subject(p, subject_id=subjects[0])
    assert cids and {c["context_id"] for c in r.contexts if c.get("reason") == "stored state unusable"} >= set(cids)
    assert _count(p, "SELECT count(*) FROM gate_tokens WHERE subject_id = 1") == 0
    assert _count(p, "SELECT count(*) FROM gate_tokens WHERE subject_id = ?", [subjects[0]]) == 0


# ------------------------------------------------------------------------------ 7. certified outcomes
def test_removing_a_whole_context_is_a_certified_deletion(site):
    p, _ = site
    sid = _count(p, "SELECT t.subject_id FROM gate_tokens t JOIN gate_states s USING (context_id) "
                    "WHERE s.study = 'icu_retention' LIMIT 1")
    r = forget_subject(p, subject_id=sid)
    acts = {c["study"]: c for c in r.contexts}
    assert acts["icu_retention"]["action"] == "removed" and acts["icu_retention"]["certified"] is True
    assert r.certified and "certified: true" in r.summary_line()


def test_unknown_subject_changes_nothing_and_allow_absent_registers(site, src, tmp_path):
    p, _ = site
    before = p.read_bytes()
    with pytest.raises(UnknownSubjectError):
        forget_subject(p, subject_id=123)
    with pytest.raises(UnknownSubjectError):
        forget_subject(p, subject_id=True)
    assert p.read_bytes() == before and not (default_dir(p) / "receipts.jsonl").exists()
    # a source subject the cohort never admitted (short stay): registered, so no future build admits it
    con = duckdb.connect()
    short = con.execute(f"SELECT subject_id FROM read_parquet('{src}/icu/icustays.parquet') "
                        "WHERE subject_id NOT IN (SELECT unnest(?::BIGINT[])) LIMIT 1",
                        [[s for _, s, _, _ in wh.stays(p)]]).fetchone()[0]
    r = forget_subject(p, subject_id=short, allow_absent=True)
    assert r.receipt_seq == 1
    s = _build(p, "mimic", src, min_hours=0)
    assert _count(p, "SELECT count(*) FROM cohort_stays WHERE subject_id = ?", [short]) == 0
    assert dict((a, b) for a, b, _ in s["funnel"])["not_in_forget_registry"] < s["funnel"][0][1]


# ------------------------------------------------------------------------------ 8. results follow
def test_results_are_marked_stale_and_the_ledger_card_written(site):
    p, subjects = site
    runs = p.parent
    with Warehouse.open(p) as w:
        w.register_runs_dir(runs)
    (runs / "icu_retention").mkdir()
    (runs / "icu_retention" / "result.json").write_text("{}")
    r = forget_subject(p, subject_id=subjects[0])
    st = json.loads((runs / "stale.json").read_text())
    assert st["receipt_seq"] == r.receipt_seq and "icu_retention/result.json" in st["files"]
    card = json.loads((runs / "ledger" / "result.json").read_text())
    assert card["metrics"]["receipts"] == 1 and card["metrics"]["chain_verified"] is True
    assert card["metrics"]["head"] == Ledger(default_dir(p), Keys.load()).verify()["head"]
    assert str(subjects[0]) not in (runs / "ledger" / "result.json").read_text()
    from pipelines.runtime.runner import write_study_result

    res = {"study": "icu_retention", "title": "t", "data": "synthetic", "runtime_s": 0.0, "seed_figure": {},
           "metrics": {}, "tables": [], "figures": []}
    write_study_result(res, runs)
    assert not (runs / "stale.json").exists()  # the rerun made it current


# ------------------------------------------------------------------------------ 9. one writer
def _cli(*args, wait=None):
    env = os.environ.copy()
    if wait is not None:
        env["FORGETFUL_LOCK_WAIT"] = str(wait)
    return subprocess.Popen([sys.executable, "-m", "pipelines.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_concurrent_forgets_all_succeed(site):
    p, subjects = site
    procs = [_cli("forget", "--subject-id", str(s), "--warehouse", str(p), "--no-verify") for s in subjects[:2]]
    outs = [pr.communicate(timeout=240) for pr in procs]
    assert [pr.returncode for pr in procs] == [0, 0], outs
    assert all("Traceback" not in e for _, e in outs)
    assert len(Ledger(default_dir(p), Keys.load()).rows()) == 2
    for s in subjects[:2]:
        assert _count(p, "SELECT count(*) FROM cohort_stays WHERE subject_id = ?", [s]) == 0


def test_busy_warehouse_is_one_typed_line(site):
    p, subjects = site
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pipelines.store import locking\n"
        f"with locking.hold({str(p)!r}):\n    print('held', flush=True); time.sleep(60)")],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        out = _cli("forget", "--subject-id", str(subjects[0]), "--warehouse", str(p), "--wait", "0.5")
        _, err = out.communicate(timeout=120)
        assert out.returncode == 3
        lines = [x for x in err.splitlines() if x.strip()]
        assert lines[-1].startswith("error: WarehouseBusyError") and "Traceback" not in err
    finally:
        holder.kill()
        holder.wait()
    assert _count(p, "SELECT count(*) FROM cohort_stays WHERE subject_id = ?", [subjects[0]]) > 0  # untouched


# ------------------------------------------------------------------------------ 10. messages
def test_headerless_csv_error_prints_no_data_row(tmp_path):
    from cohort.errors import MissingColumnsError

    root = tmp_path / "m"
    shutil.copytree(FIX / "mimic_small", root)
    f = root / "icu" / "icustays.csv"
    lines = f.read_text().splitlines()
    f.write_text("\n".join(lines[1:]) + "\n")  # header row missing
    first = lines[1].split(",")
    with pytest.raises(MissingColumnsError) as ei:
        build_warehouse("mimic", root, tmp_path / "w.duckdb", progress=False)
    msg = str(ei.value)
    assert "header" in msg and not any(v and v in msg for v in first if len(v) >= 3)


# ------------------------------------------------------------------------------ exports
def test_forget_reaches_exported_parquet_and_never_foreign_files(site, tmp_path, monkeypatch, capsys):
    import polars as pl

    import cohort
    import pipelines.store.exports as exports
    from pipelines.cli import main

    p, subjects = site
    target, other = subjects[0], subjects[1]
    exp = tmp_path / "elsewhere" / "export"  # outside the warehouse folder: reached by registration
    assert main(["export", "--warehouse", str(p), "--out", str(exp)]) == 0
    foreign = tmp_path / "mine"  # a user's own folder the export refused: never registered or touched
    foreign.mkdir()
    (foreign / "stays.parquet").write_bytes(b"the user's own file")
    assert main(["export", "--warehouse", str(p), "--out", str(foreign)]) == 3
    capsys.readouterr()
    stays = [r[0] for r in duckdb.connect(str(p), read_only=True).execute(
        "SELECT stay_id FROM cohort_stays WHERE subject_id = ?", [target]).fetchall()]
    assert pl.read_parquet(exp / "stays.parquet").filter(pl.col("subject_id") == target).height == len(stays) > 0

    # killed after hourly.parquet was rewritten, before stays.parquet: the next command completes it
    real, calls = exports._swap, []

    def swap_then_die(frame, target_path, recorded):
        calls.append(target_path.name)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed between the two export files")
        return real(frame, target_path, recorded)
    monkeypatch.setattr(exports, "_swap", swap_then_die)
    with pytest.raises(KeyboardInterrupt):
        forget_subject(p, subject_id=target)
    monkeypatch.undo()
    assert calls == ["hourly.parquet", "stays.parquet"]
    r = forget_subject(p, subject_id=target)
    assert r.recovered
    hourly, st = pl.read_parquet(exp / "hourly.parquet"), pl.read_parquet(exp / "stays.parquet")
    assert st.filter(pl.col("subject_id") == target).height == 0
    assert hourly.filter(pl.col("stay_id").is_in(stays)).height == 0
    # everyone else is exactly what the warehouse now holds
    assert st.equals(cohort.load_stays(str(p))) and hourly.equals(cohort.load_hourly(str(p)))
    assert st.filter(pl.col("subject_id") == other).height > 0
    assert [f.name for f in exp.iterdir()] and all(not f.name.startswith(".") for f in exp.iterdir())  # no temp
    for f in exp.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert (foreign / "stays.parquet").read_bytes() == b"the user's own file"

    # a file edited by hand is no longer the project's (issue 31): left byte for byte and reported;
    # the export's own hourly.parquet is still cleaned (by the stays the receipt names)
    exp2 = tmp_path / "export2"
    assert main(["export", "--warehouse", str(p), "--out", str(exp2)]) == 0
    other_stays = [r[0] for r in duckdb.connect(str(p), read_only=True).execute(
        "SELECT stay_id FROM cohort_stays WHERE subject_id = ?", [other]).fetchall()]
    (exp2 / "stays.parquet").write_bytes(b"edited by hand")
    capsys.readouterr()
    forget_subject(p, subject_id=other)
    assert "not the ones forgetful wrote" in capsys.readouterr().err
    assert (exp2 / "stays.parquet").read_bytes() == b"edited by hand"
    assert pl.read_parquet(exp2 / "hourly.parquet").filter(pl.col("stay_id").is_in(other_stays)).height == 0
    assert pl.read_parquet(exp / "stays.parquet").filter(pl.col("subject_id") == other).height == 0
