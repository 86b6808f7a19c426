"""The log speaks C2SP (issue 33, items 1 and 5): verifier keys, checkpoints, tlog-proofs and
witness request bodies written by ``forgetful receipts`` are checked by the independent verifier
of ``tests/c2sp_verifier.py`` (written from the specification texts; it imports nothing of the
project), and a flipped byte anywhere in a proof is refused by it and by ``receipts verify-proof``.
"""
from __future__ import annotations

import base64
import json
import random
from pathlib import Path

import c2sp_verifier as ref
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pipelines.cli import main
from pipelines.receipts import c2sp
from pipelines.receipts.checkpoints import Checkpoints
from pipelines.receipts.ledger import Ledger
from pipelines.store.keys import Keys

N = 7


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    """A 7-receipt log in its own config folder, its vkey, and every receipt line."""
    base = tmp_path_factory.mktemp("c2sp")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FORGETFUL_CONFIG_DIR", str(base / "config"))
        keys = Keys.load()
        led = Ledger(base / "ledger", keys)
        for i in range(N):
            led.append("forget_subject", keys.subject_hash(500 + i), {"n_stays": i + 1, "certified": True,
                                                                   "rows_deleted": {"vitals_hourly": 40 + i}})
        yield {"base": base, "dir": base / "ledger", "config": str(base / "config"),
               "lines": (base / "ledger" / "receipts.jsonl").read_bytes().split(b"\n")[:-1]}


def cli(log, monkeypatch, *argv, expect=0):
    monkeypatch.setenv("FORGETFUL_CONFIG_DIR", log["config"])
    where = [] if argv[1] == "verify-proof" else ["--ledger", str(log["dir"]), "--warehouse",
                                                   str(log["base"] / "absent.duckdb")]
    rc = main([*argv, *where])
    assert rc == expect, (argv, rc)


def vkey(log, monkeypatch) -> str:
    out = log["base"] / "log.vkey"
    if not out.exists():
        cli(log, monkeypatch, "receipts", "public-key", "--format", "vkey", "--out", str(out))
    return out.read_text().strip()


def test_note_signatures_match_a_published_vector():
    """signed-note's Ed25519 vector (Go's sumdb/note example, also in the signed_note crate's
    README): key "PeterNeumann", key ID c74f20a3, and its exact signature line."""
    seed = base64.b64decode("AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz")[1:]
    key = Ed25519PrivateKey.from_private_bytes(seed)
    v = c2sp.Vkey.of("PeterNeumann", key)
    assert v.text().startswith("PeterNeumann+c74f20a3+") and ref.parse_vkey(v.text())["id"].hex() == "c74f20a3"
    text = "If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n"
    line = c2sp.sign_note(text, "PeterNeumann", key).line()
    assert line == ("\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZ"
                    "b6KE6RyyBwJnAM=\n")
    assert ref.open_note(text + "\n" + line, [ref.parse_vkey(v.text())])[0] == text


def test_vkeys_and_cosignatures_agree_with_the_independent_verifier():
    for _ in range(20):  # base64 key material often holds '+' (the separator): parsed by position
        k = Ed25519PrivateKey.generate()
        for typ in (c2sp.ED25519, c2sp.COSIGNATURE):
            v = c2sp.Vkey.of("w.example/x", k, typ)
            r = ref.parse_vkey(v.text())
            assert (r["name"], r["id"], r["type"]) == ("w.example/x", v.key_id, typ)
            assert c2sp.Vkey.parse(v.text()) == v
    body = c2sp.checkpoint_body("log.example/a", 5, bytes(range(32)))
    cos = c2sp.cosign(body, "w.example/x", k, 1_700_000_000)
    _, ok = ref.open_note(c2sp.join_note(body, [cos]), [ref.parse_vkey(v.text())])
    assert ok == {"w.example/x": 1_700_000_000}
    assert c2sp.cosignature_time(body, [cos], v) == 1_700_000_000
    bad = c2sp.Signature(cos.name, cos.key_id, cos.sig[:7] + bytes([cos.sig[7] ^ 1]) + cos.sig[8:])  # the time
    assert c2sp.cosignature_time(body, [bad], v) is None
    with pytest.raises(ref.Rejected):
        ref.open_note(c2sp.join_note(body, [bad]), [ref.parse_vkey(v.text())])
    with pytest.raises(c2sp.NoteError):  # a key ID that does not match the key
        c2sp.Vkey.parse(v.text().replace(f"+{v.key_id.hex()}+", "+00000000+"))


def test_checkpoint_verifies_independently_and_names_this_log(log, monkeypatch):
    vk = vkey(log, monkeypatch)
    out = log["base"] / "checkpoint"
    cli(log, monkeypatch, "receipts", "head", "--format", "checkpoint", "--out", str(out))
    text, ok = ref.open_note(out.read_text(), [ref.parse_vkey(vk)])
    origin, size, root = ref.checkpoint(text)
    assert origin == ref.parse_vkey(vk)["name"] == Checkpoints(log["dir"]).origin() and size == N
    assert root == ref.mth(log["lines"])
    # the auditor's head --format checkpoint (public key only) gives the same stored note
    aud = log["base"] / "checkpoint.auditor"
    cli(log, monkeypatch, "receipts", "head", "--format", "checkpoint", "--out", str(aud), "--public-key",
        str(log["base"] / "log.vkey"))
    assert aud.read_text() == out.read_text()
    # an unknown key's signature is ignored; a known key's bad signature rejects the note
    other = Ed25519PrivateKey.generate()
    extra = c2sp.sign_note(text, ref.parse_vkey(vk)["name"], other).line()
    assert ref.open_note(out.read_text() + extra, [ref.parse_vkey(vk)])[0] == text
    note_text = out.read_text()
    head, sig_line = note_text.rsplit("\u2014 ", 1)
    name, blob = sig_line.split(" ")
    raw = bytearray(base64.b64decode(blob))
    raw[10] ^= 1  # the Ed25519 signature of the log's own (name, key ID)
    with pytest.raises(ref.Rejected):
        ref.open_note(f"{head}\u2014 {name} {base64.b64encode(bytes(raw)).decode()}\n", [ref.parse_vkey(vk)])


def test_every_entry_has_a_tlog_proof_that_verifies_with_the_vkey_alone(log, monkeypatch):
    vk = vkey(log, monkeypatch)
    for i in range(N):
        f = log["base"] / f"entry{i}.tlog-proof"
        cli(log, monkeypatch, "receipts", "prove", "--index", str(i), "--format", "tlog-proof", "--out", str(f))
        r = ref.verify_tlog_proof(f.read_text(), vk)
        assert (r["index"], r["size"]) == (i, N)
        assert r["entry"] == log["lines"][i]  # exactly the bytes hashed into the leaf: the receipt line
        assert json.loads(r["entry"])["seq"] == i + 1
        cli(log, monkeypatch, "receipts", "verify-proof", "--public-key", str(log["base"] / "log.vkey"), str(f))
    # --seq N with --format tlog-proof is the same proof as --index N-1
    g = log["base"] / "seq3.tlog-proof"
    cli(log, monkeypatch, "receipts", "prove", "--seq", "3", "--format", "tlog-proof", "--out", str(g))
    assert g.read_text() == (log["base"] / "entry2.tlog-proof").read_text()
    cli(log, monkeypatch, "receipts", "prove", "--index", str(N), "--format", "tlog-proof", "--out",
        str(log["base"] / "x"), expect=2)
    cli(log, monkeypatch, "receipts", "prove", "--index", "1", "--out", str(log["base"] / "x"), expect=2)


def test_a_flipped_byte_anywhere_is_refused(log, monkeypatch, capsys):
    vk = vkey(log, monkeypatch)
    f = log["base"] / "flip.tlog-proof"
    cli(log, monkeypatch, "receipts", "prove", "--index", "4", "--format", "tlog-proof", "--out", str(f))
    good = f.read_bytes()
    assert ref.verify_tlog_proof(good.decode(), vk)["index"] == 4
    sample = set(random.Random(0).sample(range(len(good)), 40)) | {0, len(good) - 2}
    for pos in range(len(good)):
        bad = bytearray(good)
        bad[pos] ^= 0x01
        try:
            ref.verify_tlog_proof(bad.decode("utf-8"), vk)
            accepted = True
        except (ref.Rejected, ValueError, IndexError, UnicodeDecodeError, TypeError):
            accepted = False
        assert not accepted, f"independent verifier accepted a flip at byte {pos}"
        if pos in sample:  # the production check agrees (exit 1, one line, no traceback)
            f.write_bytes(bytes(bad))
            monkeypatch.setenv("FORGETFUL_CONFIG_DIR", log["config"])
            rc = main(["receipts", "verify-proof", "--public-key", str(log["base"] / "log.vkey"), str(f)])
            err = capsys.readouterr().err
            assert rc == 1 and "Traceback" not in err, (pos, rc, err[-300:])
    f.write_bytes(good)


def test_witness_request_body_from_a_kept_checkpoint(log, monkeypatch, tmp_path):
    """``prove --since CHECKPOINT --format tlog-witness``: ``old N``, the RFC 6962 consistency
    proof (compared with the recursive definition), a blank line, the newest checkpoint."""
    monkeypatch.setenv("FORGETFUL_CONFIG_DIR", log["config"])
    vk = vkey(log, monkeypatch)
    small = tmp_path / "ledger"
    small.mkdir()
    (small / "receipts.jsonl").write_bytes(b"".join(x + b"\n" for x in log["lines"][:3]))
    heads = (log["dir"] / "heads.jsonl").read_bytes().split(b"\n")[:3]
    (small / "heads.jsonl").write_bytes(b"".join(x + b"\n" for x in heads))
    (small / "origin").write_bytes((log["dir"] / "origin").read_bytes())
    kept = tmp_path / "kept.checkpoint"
    assert main(["receipts", "head", "--format", "checkpoint", "--out", str(kept), "--ledger", str(small),
                 "--warehouse", str(tmp_path / "absent.duckdb")]) == 0
    body = tmp_path / "add-checkpoint.txt"
    cli(log, monkeypatch, "receipts", "prove", "--since", str(kept), "--format", "tlog-witness", "--out", str(body))
    text = body.read_text()
    lines = text.split("\n")
    assert lines[0] == "old 3"
    blank = lines.index("", 1)
    assert [base64.b64decode(x) for x in lines[1:blank]] == ref.consistency(3, log["lines"])
    cp, _ = ref.open_note("\n".join(lines[blank + 1:]), [ref.parse_vkey(vk)])
    assert ref.checkpoint(cp)[1:] == (N, ref.mth(log["lines"]))
    # a checkpoint of another log (another key) is refused: exit 1
    forged = kept.read_text().replace(kept.read_text().split("\n")[2], base64.b64encode(b"\1" * 32).decode())
    (tmp_path / "forged").write_text(forged)
    cli(log, monkeypatch, "receipts", "prove", "--since", str(tmp_path / "forged"), "--format", "tlog-witness",
        "--out", str(tmp_path / "x"), expect=1)


def test_parsers_refuse_malformed_text_without_crashing():
    note = c2sp.join_note(c2sp.checkpoint_body("a.example/l", 3, b"\2" * 32),
                          [c2sp.sign_note("x\n", "a.example/l", Ed25519PrivateKey.generate())])
    proof = c2sp.tlog_proof_text(1, [b"\3" * 32, b"\4" * 32], note, extra=b'{"seq":2}')
    req = c2sp.add_checkpoint_body(2, [b"\5" * 32], note)
    assert c2sp.parse_tlog_proof(proof).note == note and c2sp.parse_add_checkpoint(req)[0] == 2
    rnd = random.Random(1)
    for text, parse in ((proof, c2sp.parse_tlog_proof), (req, c2sp.parse_add_checkpoint), (note, c2sp.split_note)):
        for _ in range(300):
            t = list(text)
            for _ in range(rnd.randint(1, 3)):
                t[rnd.randrange(len(t))] = rnd.choice(["\n", " ", "+", "A", "\u2014", "0", "\x00", ""])
            try:
                parse("".join(t))
            except c2sp.NoteError:
                pass
    with pytest.raises(c2sp.NoteError):
        c2sp.parse_checkpoint("a.example/l\n03\nAAAA\n")  # a leading zero
    with pytest.raises(c2sp.NoteError):
        c2sp.parse_add_checkpoint("old 1\n" + "".join(base64.b64encode(b"\0" * 32).decode() + "\n"
                                                     for _ in range(64)) + "\n" + note)


def test_missing_or_mistyped_ledger_is_one_line_exit_3(log, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("FORGETFUL_CONFIG_DIR", str(tmp_path / "auditor-config"))
    pub = log["base"] / "log.vkey"
    vkey(log, monkeypatch)
    monkeypatch.setenv("FORGETFUL_CONFIG_DIR", str(tmp_path / "auditor-config"))
    (tmp_path / "empty").mkdir()
    for folder in ("does-not-exist", "empty"):
        rc = main(["receipts", "verify", "--public-key", str(pub), "--ledger", str(tmp_path / folder),
                   "--warehouse", str(tmp_path / "absent.duckdb")])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 3 and len(err) == 1 and err[0].startswith("error: EmptyLedgerError"), (folder, err)
    rc = main(["receipts", "verify", "--public-key", str(pub), "--ledger", str(tmp_path / "empty"), "--allow-empty",
               "--warehouse", str(tmp_path / "absent.duckdb")])
    assert rc == 0 and json.loads(capsys.readouterr().out)["n_rows"] == 0
    assert not any(Path(tmp_path / "auditor-config").rglob("*.key"))
    rc = main(["receipts", "verify", "--public-key", str(pub), "--ledger", str(log["dir"]),
               "--warehouse", str(tmp_path / "absent.duckdb")])
    assert rc == 0 and json.loads(capsys.readouterr().out)["n_rows"] == N
