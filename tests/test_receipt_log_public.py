"""The receipt log verified with the public key only (issue 19, items 1-2): no HMAC key and no
signing key exist where the auditor runs ``receipts verify --public-key``.

Each tampering runs in its own temporary folder on a copy of a 5-receipt log whose every
checkpoint a witness cosigned (issue 33), and is verified with one more recorded state each time:

* ``log``: the public key and the log alone;
* ``anchor``: + the signed anchor in the (key-less) config folder;
* ``warehouse``: + the size and root a warehouse recorded;
* ``kept``: + a signed tree head the auditor kept (at size 5);

and once more in a column of its own, **without** a kept head:

* ``witness``: the ``warehouse`` level + the auditor requires one witness cosignature on the
  newest checkpoint (``--witness WVKEY --quorum 1``) and asks that witness (``--witness-url``,
  a real witness on 127.0.0.1) whether it cosigned a larger or another tree.

The test states, for every tampering, the first of the four levels at which it is detected, and
checks that every later one detects it too and that every earlier one passes (exit 0); the
``witness`` column detects every one. Detected means exit 1, or exit 3 with one
``EmptyLedgerError`` line (the ledger folder or its receipt log is gone: never "verified: 0
receipts") — nothing else, no traceback. ``FORGETFUL_TAMPER_TABLE=PATH`` writes the table as JSON.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from witness_site import Served

from pipelines.cli import main
from pipelines.receipts import logaudit, signing, translog, witness, witness_client
from pipelines.receipts.c2sp import Vkey
from pipelines.receipts.checkpoints import Checkpoints, Witness
from pipelines.receipts.ledger import Ledger
from pipelines.receipts.logaudit import Row, canonical_json
from pipelines.store.keys import Keys

ROOT = Path(__file__).resolve().parents[1]
LEVELS = ("log", "anchor", "warehouse", "kept")
COLUMNS = (*LEVELS, "witness")
N = 5
#: the log folder's C2SP files (a copy or restore of the folder carries them)
C2SP_FILES = ("checkpoints.jsonl", "origin", "witnesses.json")


def _anchor_file(cfg: Path, ledger_dir: Path) -> Path:
    h = hashlib.sha256(str((ledger_dir / logaudit.FILE).resolve()).encode()).hexdigest()[:32]
    return cfg / "anchors" / f"{h}.json"


def _snapshot(led: Ledger) -> dict:
    return {"receipts": led.path.read_bytes(), "heads": led.heads_path.read_bytes(),
            "anchor": logaudit.anchor_path(led.path).read_bytes(), "record": led.record(),
            "c2sp": {f: (led.dir / f).read_bytes() for f in C2SP_FILES if (led.dir / f).is_file()}}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Five genuine receipts (snapshots after each), each checkpoint cosigned by a witness that
    keeps running on 127.0.0.1 for the module; a fork the operator signed after receipt 2 (its
    checkpoints refused by the witness); a second log under the same key; the public key; the
    head kept at size 5."""
    base = tmp_path_factory.mktemp("publog")
    keys = Keys.load()
    led = Ledger(base / "ledger", keys)
    wv = witness.init(base / "witness", "witness.example/tamper")
    origin = Checkpoints(led.dir).ensure_origin(signing.log_id(led.signer(create=True)))
    served = Served(base / "witness", [Vkey.of(origin, led.signer())])
    url = f"http://127.0.0.1:{served.port}"
    Checkpoints(led.dir).set_witnesses([Witness(url, wv)])
    snaps = {}
    try:
        for i in range(1, N + 1):
            led.append("forget_subject", keys.subject_hash(1000 + i),
                       {"n_stays": i, "certified": True, "rows_deleted": {"cohort_stays": i, "vitals_hourly": 48 * i},
                        "max_abs_score_dev": 1.2e-15 * i})
            assert [o["status"] for o in witness_client.ask(led)] == ["cosigned"]
            snaps[i] = _snapshot(led)
        fork = Ledger(base / "fork", keys)  # the operator's own keys sign another history after receipt 2
        fork.dir.mkdir()
        fork.path.write_bytes(snaps[2]["receipts"])
        fork.heads_path.write_bytes(snaps[2]["heads"])
        for f, data in snaps[2]["c2sp"].items():
            (fork.dir / f).write_bytes(data)
        for i in range(3, N + 1):
            fork.append("forget_subject", keys.subject_hash(2000 + i), {"n_stays": 0, "certified": True})
            assert witness_client.ask(fork, refuse=False)[0]["status"] in ("ahead", "forked")
        other = Ledger(base / "other", keys)
        for i in range(N):
            other.append("forget_subject", keys.subject_hash(3000 + i), {"n_stays": 1, "certified": True})
        pub = base / "log.pub"
        pub.write_text(signing.public_key_text(led.signer(), "pem"))
        kept = base / "kept.json"
        kept.write_text(json.dumps(signing.TreeHead.from_json(json.loads(snaps[N]["heads"].splitlines()[-1])).to_json()))
        yield {"snaps": snaps, "fork": _snapshot(fork), "other": _snapshot(other), "pub": pub, "kept": kept,
               "keys": keys, "signer": led.signer(), "wvkey": wv.text(), "url": url}
    finally:
        served.stop()


class Case:
    """One tampering's temporary folder: the log, a key-less config folder with the anchor, a
    warehouse that recorded size 5."""

    def __init__(self, tmp: Path, w: dict):
        self.w = w
        self.dir = tmp / "forget-registry"
        self.dir.mkdir()
        s = w["snaps"][N]
        self.receipts, self.heads = self.dir / logaudit.FILE, self.dir / logaudit.HEADS
        self.receipts.write_bytes(s["receipts"])
        self.heads.write_bytes(s["heads"])
        self.put_c2sp(s)
        self.cfg, self.empty_cfg = tmp / "cfg", tmp / "cfg-empty"
        self.empty_cfg.mkdir()
        self.anchor = _anchor_file(self.cfg, self.dir)
        self.anchor.parent.mkdir(parents=True)
        self.anchor.write_bytes(s["anchor"])
        self.wh = tmp / "warehouse.duckdb"
        self.record(s["record"])

    def record(self, rec: dict) -> None:
        con = duckdb.connect(str(self.wh))
        con.execute("CREATE TABLE IF NOT EXISTS forgetful_meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
        for k, v in rec.items():
            con.execute("INSERT OR REPLACE INTO forgetful_meta VALUES (?, ?)", [k, v])
        con.close()

    def put_c2sp(self, snap: dict) -> None:
        for f, data in snap["c2sp"].items():
            (self.dir / f).write_bytes(data)

    def restore(self, snap: dict, anchor: bool = False, warehouse: bool = False) -> None:
        self.receipts.write_bytes(snap["receipts"])
        self.heads.write_bytes(snap["heads"])
        self.put_c2sp(snap)
        if anchor:
            self.anchor.write_bytes(snap["anchor"])
        if warehouse:
            self.record(snap["record"])

    def rows(self) -> list[dict]:
        return [json.loads(x) for x in self.receipts.read_text().splitlines()]

    def put_rows(self, rows) -> None:
        self.receipts.write_text("".join(canonical_json(r) + "\n" for r in rows))

    def head_list(self) -> list[dict]:
        return [json.loads(x) for x in self.heads.read_text().splitlines()]

    def put_heads(self, heads) -> None:
        self.heads.write_text("".join(canonical_json(h) + "\n" for h in heads))

    def resign(self, key, rows=None) -> None:
        """Recompute every root and sign every head with ``key`` (a forger's or the operator's)."""
        rows = self.rows() if rows is None else rows
        leaves = [translog.leaf_hash(canonical_json(r).encode()) for r in rows]
        prev, heads = signing.ZERO, []
        for i, r in enumerate(translog.prefix_roots(leaves), start=1):
            h = signing.sign_head(key, i, r, prev, timestamp_ms=1_700_000_000_000 + i)
            heads.append(h.to_json())
            prev = h.digest()
        self.put_heads(heads)


def _edit_row(i, field, value):
    def go(c: Case):
        rows = c.rows()
        rows[i][field] = value
        c.put_rows(rows)
    return go


def _edit_head(i, field, value):
    def go(c: Case):
        hs = c.head_list()
        hs[i][field] = value(hs[i][field]) if callable(value) else value
        c.put_heads(hs)
    return go


def _flip(hexstr: str) -> str:
    return ("1" if hexstr[0] != "1" else "2") + hexstr[1:]


def _forged_row(c: Case) -> dict:
    last = c.rows()[-1]
    return {**last, "seq": last["seq"] + 1, "prev": last["mac"], "mac": "ab" * 32, "subject_id_hash": "cd" * 32}


def _rekeyed_rows(c: Case, hmac_key: bytes) -> list[dict]:
    """Every row's MAC recomputed under another HMAC key (with one payload changed)."""
    from pipelines.receipts.logaudit import GENESIS

    keys, prev, out = Keys(hmac_key), GENESIS, []
    for d in c.rows():
        d = {**d, "payload": {**d["payload"], "certified": False}, "key_fp": keys.fingerprint, "prev": prev}
        r = Row(**{**d, "mac": ""})
        d["mac"] = keys.mac("ledger", r.body())
        out.append(d)
        prev = d["mac"]
    return out


def _operator_fork(anchor: bool, warehouse: bool):
    def go(c: Case):
        c.restore(c.w["fork"], anchor=False, warehouse=warehouse)
        if anchor:
            c.anchor.write_bytes(c.w["fork"]["anchor"])
    return go


def _edit_and_rehash(c: Case):
    """Edit a row and write the recomputed roots into the heads (the signatures cannot follow)."""
    _edit_row(1, "payload", {})(c)
    roots = translog.prefix_roots([translog.leaf_hash(canonical_json(x).encode()) for x in c.rows()])
    c.put_heads([{**h, "root_hash": r.hex()} for h, r in zip(c.head_list(), roots)])


ATTACKER = Ed25519PrivateKey.generate()

#: name -> (tampering, first level that detects it)
TAMPERINGS = {
    "edit a payload": (_edit_row(1, "payload", {"certified": False}), "log"),
    "edit a timestamp": (_edit_row(1, "ts", "2000-01-01T00:00:00Z"), "log"),
    "edit a kind": (_edit_row(1, "kind", "noop"), "log"),
    "edit a subject hash": (_edit_row(1, "subject_id_hash", "00" * 32), "log"),
    "edit a key fingerprint": (_edit_row(1, "key_fp", "0" * 16), "log"),
    "edit a prev link": (_edit_row(1, "prev", "11" * 32), "log"),
    "edit a mac": (_edit_row(1, "mac", "22" * 32), "log"),
    "edit a seq": (_edit_row(2, "seq", 7), "log"),
    "edit the last row": (_edit_row(-1, "payload", {"certified": True, "n_stays": 0}), "log"),
    "delete a middle row": (lambda c: c.put_rows(c.rows()[:2] + c.rows()[3:]), "log"),
    "delete the last row": (lambda c: c.put_rows(c.rows()[:-1]), "log"),
    "delete the last row and its head": (lambda c: (c.put_rows(c.rows()[:-1]), c.put_heads(c.head_list()[:-1])),
                                         "anchor"),
    "delete every row": (lambda c: c.receipts.write_text(""), "log"),
    "delete both log files": (lambda c: (c.receipts.unlink(), c.heads.unlink()), "log"),
    "delete the ledger folder and the anchor": (lambda c: (shutil.rmtree(c.dir), c.anchor.unlink()), "log"),
    "reorder two rows": (lambda c: c.put_rows([c.rows()[1], c.rows()[0], *c.rows()[2:]]), "log"),
    "duplicate a row": (lambda c: c.put_rows(c.rows() + [c.rows()[-1]]), "log"),
    "append a forged row": (lambda c: c.put_rows(c.rows() + [_forged_row(c)]), "log"),
    "append a replayed row": (lambda c: c.put_rows(c.rows() + [{**c.rows()[0], "seq": N + 1}]), "log"),
    "append a forged row and a forged head": (
        lambda c: (c.put_rows(c.rows() + [_forged_row(c)]),
                   c.put_heads(c.head_list() + [signing.sign_head(ATTACKER, N + 1, b"\0" * 32,
                                                                  c.head_list()[-1]["prev"]).to_json()])), "log"),
    "truncate mid-line": (lambda c: c.receipts.write_bytes(c.receipts.read_bytes()[:-9]), "log"),
    "trailing garbage": (lambda c: c.receipts.write_bytes(c.receipts.read_bytes() + b"junk"), "log"),
    "trailing empty line": (lambda c: c.receipts.write_bytes(c.receipts.read_bytes() + b"\n"), "log"),
    "CRLF line endings": (lambda c: c.receipts.write_bytes(c.receipts.read_bytes().replace(b"\n", b"\r\n")), "log"),
    "CRLF line endings in the heads": (lambda c: c.heads.write_bytes(c.heads.read_bytes().replace(b"\n", b"\r\n")),
                                       "log"),
    "whitespace-only edit": (lambda c: c.receipts.write_text(c.receipts.read_text().replace(",", ", ", 1)), "log"),
    "forged head signature (newest)": (_edit_head(-1, "signature", _flip), "log"),
    "forged head signature (oldest)": (_edit_head(0, "signature", _flip), "log"),
    "changed tree size in a head": (_edit_head(2, "tree_size", 4), "log"),
    "changed root in the newest head": (_edit_head(-1, "root_hash", "33" * 32), "log"),
    "changed timestamp in a head": (_edit_head(1, "timestamp", 1), "log"),
    "delete a middle head": (lambda c: c.put_heads(c.head_list()[:1] + c.head_list()[2:]), "log"),
    "swap two heads": (lambda c: c.put_heads([c.head_list()[1], c.head_list()[0], *c.head_list()[2:]]), "log"),
    "every head re-signed by another key": (lambda c: c.resign(ATTACKER), "log"),
    "rows re-MACed with another key, heads re-signed by another key":
        (lambda c: (c.put_rows(_rekeyed_rows(c, b"x" * 40)), c.resign(ATTACKER)), "log"),
    "edit a row and recompute the roots (no key to sign)": (_edit_and_rehash, "log"),
    "older copy of the log": (lambda c: c.restore(c.w["snaps"][3]), "anchor"),
    "older copy of the log and the anchor (backup restore)": (lambda c: c.restore(c.w["snaps"][3], anchor=True),
                                                              "warehouse"),
    "older log, anchor and warehouse (full restore)": (
        lambda c: c.restore(c.w["snaps"][3], anchor=True, warehouse=True), "kept"),
    "swapped anchor (another log's, same key)": (lambda c: c.anchor.write_bytes(c.w["other"]["anchor"]), "anchor"),
    "unsigned plain-JSON anchor": (lambda c: c.anchor.write_text(json.dumps({"seq": N, "head": c.rows()[-1]["mac"]})),
                                   "anchor"),
    "anchor with an edited tree size": (
        lambda c: c.anchor.write_text(c.anchor.read_text().replace(f'"tree_size":{N}', '"tree_size":2')), "anchor"),
    "forked by the operator's keys": (_operator_fork(anchor=False, warehouse=False), "anchor"),
    "forked by the operator's keys, anchor rewritten": (_operator_fork(anchor=True, warehouse=False), "warehouse"),
    "forked by the operator's keys, anchor and warehouse rewritten": (_operator_fork(anchor=True, warehouse=True),
                                                                      "kept"),
}


def _verify(c: Case, level: str, capsys, monkeypatch) -> int:
    """1 when the auditor's check at ``level`` detects the tampering, 0 when it passes."""
    monkeypatch.setenv("FORGETFUL_CONFIG_DIR", str(c.empty_cfg if level == "log" else c.cfg))
    args = ["receipts", "verify", "--public-key", str(c.w["pub"]), "--ledger", str(c.dir),
            "--warehouse", str(c.wh if level in ("warehouse", "kept", "witness") else c.dir.parent / "absent.duckdb")]
    if level == "kept":
        args += ["--head", str(c.w["kept"])]
    if level == "witness":
        args += ["--witness", c.w["wvkey"], "--quorum", "1", "--witness-url", c.w["url"]]
    rc = main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if rc == 3:  # the log is gone: one line, never "verified: 0 receipts"
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: EmptyLedgerError"), err[-400:]
        return 1
    assert rc in (0, 1), (rc, err[-400:])
    return rc


def _no_secret(monkeypatch):
    for k in ("FORGETFUL_LEDGER_KEY", "FORGETFUL_KEY_FILE", "FORGETFUL_SIGNING_KEY_FILE"):
        monkeypatch.delenv(k, raising=False)


TABLE: dict[str, dict] = {}


def test_untouched_log_verifies_with_the_public_key_only(world, tmp_path, capsys, monkeypatch):
    c = Case(tmp_path, world)
    _no_secret(monkeypatch)
    for level in COLUMNS:
        assert _verify(c, level, capsys, monkeypatch) == 0, level
    assert sorted(p.name for p in c.cfg.iterdir()) == ["anchors"]  # no key was read, none created
    assert list(c.empty_cfg.iterdir()) == []


@pytest.mark.parametrize("name", list(TAMPERINGS))
def test_tampering_is_detected_with_the_public_key(name, world, tmp_path, capsys, monkeypatch):
    fn, first = TAMPERINGS[name]
    c = Case(tmp_path, world)
    fn(c)
    _no_secret(monkeypatch)
    rcs = {level: _verify(c, level, capsys, monkeypatch) for level in COLUMNS}
    want = {level: 1 if LEVELS.index(level) >= LEVELS.index(first) else 0 for level in LEVELS}
    want["witness"] = 1  # one witness cosignature, asked for, catches every tampering without a kept head
    TABLE[name] = {level: rcs[level] == 1 for level in COLUMNS}
    assert rcs == want, (name, rcs)
    assert not (c.cfg / "ledger.key").exists() and not (c.cfg / "signing.key").exists()
    if os.environ.get("FORGETFUL_TAMPER_TABLE"):
        Path(os.environ["FORGETFUL_TAMPER_TABLE"]).write_text(json.dumps(TABLE, indent=1))


def test_at_least_thirty_tamperings_and_every_one_caught_with_a_kept_head():
    """(and, by the ``witness`` column of every tampering above, with one witness instead)"""
    assert len(TAMPERINGS) >= 30
    assert all(first in LEVELS for _, first in TAMPERINGS.values())


def test_cli_end_to_end_without_any_secret(world, tmp_path):
    """The real command in a child process whose environment holds no key at all."""
    c = Case(tmp_path, world)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGETFUL_")}
    env.update(FORGETFUL_CONFIG_DIR=str(c.cfg), PYTHONPATH=str(ROOT), HOME=str(tmp_path))
    cmd = [sys.executable, "-m", "pipelines.cli", "receipts", "verify", "--public-key", str(world["pub"]),
           "--ledger", str(c.dir), "--warehouse", str(c.wh), "--head", str(world["kept"])]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-600:]
    d = json.loads(out.stdout)
    assert d["chain_verified"] and d["n_rows"] == N and d["kept_head"]["consistent"] and d["recorded"]["size"] == N
    other = tmp_path / "other.pub"  # a swapped public key is a verification failure (exit 1)
    other.write_text(signing.public_key_text(ATTACKER, "hex"))
    bad = subprocess.run(cmd[:6] + [str(other)] + cmd[7:], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert bad.returncode == 1 and "another key" in bad.stderr, bad.stderr[-600:]
    _edit_row(2, "payload", {})(c)
    bad = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert sorted(p.name for p in c.cfg.iterdir()) == ["anchors"]


def test_all_signatures_path_agrees_with_the_chained_path(world, tmp_path, monkeypatch):
    """The fast path (newest signature + chain) and the slow reference (every signature) agree."""
    c = Case(tmp_path, world)
    pub = signing.load_public_key(world["pub"])
    monkeypatch.setenv("FORGETFUL_CONFIG_DIR", str(c.cfg))
    fast = logaudit.audit(c.dir, pub)
    slow = logaudit.audit(c.dir, pub, all_signatures=True)
    assert fast["root"] == slow["root"] and slow["signatures_checked"] == N and fast["signatures_checked"] == 1
    # a head whose own signature is bad but whose successors chain to it: both paths refuse
    _edit_head(1, "signature", _flip)(c)
    for every in (False, True):
        with pytest.raises(logaudit.LedgerTamperedError):
            logaudit.audit(c.dir, pub, all_signatures=every)


def test_the_documented_tamper_table_is_this_one():
    """docs/RECEIPTS.md's table says, per tampering, the first level that catches it and that one
    witness cosignature catches it; its counts are the table's (the ``witness`` column is
    asserted for every tampering by the test above)."""
    text = (ROOT / "docs" / "RECEIPTS.md").read_text()
    block = text.split("<!-- tamper-table:begin -->")[1].split("<!-- tamper-table:end -->")[0]
    rows = {}
    for line in block.strip().splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    assert rows == {name: [first, "caught"] for name, (_, first) in TAMPERINGS.items()}
    labels = ("the public key and the log alone", "+ the signed anchor", "+ the warehouse's record",
              "+ a head the auditor kept")
    for level, label in zip(LEVELS, labels):
        n = sum(LEVELS.index(level) >= LEVELS.index(first) for _, first in TAMPERINGS.values())
        assert f"| {label} | {n} |" in text, label
    assert f"| **the auditor requires one witness cosignature** (no kept head) | **{len(TAMPERINGS)}** |" in text
