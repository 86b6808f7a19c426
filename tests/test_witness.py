"""The witness (issue 33, items 2 and 5): every status code of c2sp.org/tlog-witness by real HTTP
requests on 127.0.0.1, its cosignatures checked by the independent verifier
(``tests/c2sp_verifier.py``), its state persisted and never rolled back by concurrent requests,
the ``forgetful witness`` command as a process, and HTTPS. Request bodies are written here by
hand from the specification; every server a test starts, it stops.
"""
from __future__ import annotations

import base64
import http.client
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import c2sp_verifier as ref
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from witness_site import Served

from pipelines.cli import main
from pipelines.receipts import witness
from pipelines.receipts.c2sp import Vkey
from pipelines.receipts.signing import load_signing_key

ROOT = Path(__file__).resolve().parents[1]
ORIGIN = "log.example/receipts"


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def signed(size: int, root: bytes, key, name: str = ORIGIN, origin: str = ORIGIN) -> str:
    """A checkpoint note signed by ``key`` (type 0x01), written from tlog-checkpoint/signed-note."""
    text = f"{origin}\n{size}\n{b64(root)}\n"
    raw = key.public_key().public_bytes_raw()
    kid = ref.sha(name.encode() + b"\n\x01" + raw)[:4]
    return f"{text}\n\u2014 {name} {b64(kid + key.sign(text.encode()))}\n"


def body(old: int, proof: list[bytes], note: str) -> str:
    return f"old {old}\n" + "".join(b64(h) + "\n" for h in proof) + "\n" + note


@pytest.fixture
def leaves():
    return [f"entry {i}".encode() for i in range(12)]


@pytest.fixture
def wdir(tmp_path):
    d = tmp_path / "witness"
    v = witness.init(d, "witness.example/w1")
    return d, v


@pytest.fixture
def logkey():
    return Ed25519PrivateKey.generate()


@pytest.fixture
def served(wdir, logkey):
    s = Served(wdir[0], [Vkey.of(ORIGIN, logkey)])
    yield s
    s.stop()


def test_init_makes_an_owner_only_key_and_never_replaces_it(tmp_path, capsys):
    d = tmp_path / "w"
    assert main(["witness", "init", "--dir", str(d), "--name", "witness.example/a"]) == 0
    vk = capsys.readouterr().out.strip()
    r = ref.parse_vkey(vk)
    assert r["name"] == "witness.example/a" and r["type"] == 0x04
    assert stat.S_IMODE((d / "witness.key").stat().st_mode) == 0o600 and stat.S_IMODE(d.stat().st_mode) == 0o700
    before = (d / "witness.key").read_bytes()
    assert main(["witness", "init", "--dir", str(d), "--name", "witness.example/b"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "never replaced" in err[0] and (d / "witness.key").read_bytes() == before
    assert main(["witness", "init", "--dir", str(tmp_path / "x"), "--name", "bad name"]) == 3


def test_every_status_code_by_real_http(served, wdir, logkey, leaves):
    d, wv = wdir
    wref = ref.parse_vkey(wv.text())
    mth = ref.mth
    n3, n5 = signed(3, mth(leaves[:3]), logkey), signed(5, mth(leaves[:5]), logkey)
    stranger = Ed25519PrivateKey.generate()
    # 404: an origin the witness does not know (validly signed for its own name)
    other = signed(3, mth(leaves[:3]), stranger, "other.example/l", "other.example/l")
    assert served.post(body(0, [], other))[0] == 404
    # 403: the known origin, signed by another key under the same name; or a broken signature
    assert served.post(body(0, [], signed(3, mth(leaves[:3]), stranger)))[0] == 403
    broken = n3.replace(n3.split(" ")[-1], b64(base64.b64decode(n3.split(" ")[-1])[:4] + b"\0" * 64) + "\n")
    assert served.post(body(0, [], broken))[0] == 403
    # 400: old size above the checkpoint size; a malformed body; a proof from size 0
    assert served.post(body(4, [], n3))[0] == 400
    assert served.post("old three\n\n" + n3)[0] == 400
    assert served.post(body(0, [b"\1" * 32], n3))[0] == 400
    # 200: the first checkpoint; the cosignature verifies independently
    status, ctype, text = served.post(body(0, [], n3))
    assert status == 200
    _, ok = ref.open_note(n3 + text, [ref.parse_vkey(Vkey.of(ORIGIN, logkey).text()), wref])
    assert abs(ok["witness.example/w1"] - time.time()) < 60
    # 409 with text/x.tlog.size: an old size other than the one it cosigned ...
    assert served.post(body(0, [], n5)) == (409, "text/x.tlog.size", "3\n")
    # ... and the same size with another root
    assert served.post(body(3, [], signed(3, b"\7" * 32, logkey))) == (409, "text/x.tlog.size", "3\n")
    # 422: a consistency proof that does not verify
    proof = ref.consistency(3, leaves[:5])
    assert served.post(body(3, [proof[0], b"\2" * 32, *proof[2:]], n5))[0] == 422
    assert served.post(body(3, [*proof, b"\2" * 32], n5))[0] == 422
    # 200: consistent growth, persisted before the answer
    status, _, text = served.post(body(3, proof, n5))
    assert status == 200 and ref.open_note(n5 + text, [wref])[1]
    st = json.loads((d / "state.json").read_text())
    assert st == {ORIGIN: {"root": b64(mth(leaves[:5])), "size": 5}}
    assert stat.S_IMODE((d / "state.json").stat().st_mode) == 0o600
    assert served.post(body(5, [], n5))[0] == 200  # the same checkpoint again: cosigned again
    assert served.post(body(5, [], n5), path="/other")[0] == 404
    assert served.post("", method="GET")[0] == 405


def test_state_survives_a_restart(wdir, logkey, leaves):
    d, _ = wdir
    s = Served(d, [Vkey.of(ORIGIN, logkey)])
    try:
        assert s.post(body(0, [], signed(4, ref.mth(leaves[:4]), logkey)))[0] == 200
    finally:
        s.stop()
    s = Served(d, [Vkey.of(ORIGIN, logkey)])
    try:  # a restarted witness still remembers size 4: a log restored to size 2 is refused
        assert s.post(body(0, [], signed(2, ref.mth(leaves[:2]), logkey))) == (409, "text/x.tlog.size", "4\n")
        assert s.post(body(2, [], signed(2, ref.mth(leaves[:2]), logkey)))[:2] == (409, "text/x.tlog.size")
    finally:
        s.stop()


def test_concurrent_requests_cannot_roll_the_state_back(wdir, logkey, leaves, monkeypatch):
    """The specification's race: requests for sizes N and N+K checked against the same old size.
    The write of the state is slowed down to widen the window; the check and the update are one
    critical section, so the stored size never decreases and ends at the largest cosigned."""
    d, _ = wdir
    real = witness.replace_private
    monkeypatch.setattr(witness, "replace_private", lambda p, data: (time.sleep(0.02), real(p, data)))
    s = Served(d, [Vkey.of(ORIGIN, logkey)])
    cosigned, seen, errors = [], [], []

    def push(target: int) -> None:
        try:
            cur = 0
            for _ in range(30):
                proof = ref.consistency(cur, leaves[:target]) if 0 < cur < target else []
                status, _, text = s.post(body(cur, proof, signed(target, ref.mth(leaves[:target]), logkey)))
                if status == 200:
                    cosigned.append(target)
                    return
                if status != 409:
                    errors.append(status)
                    return
                cur = int(text)
                seen.append(cur)
                if cur > target:
                    return
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=push, args=(t,)) for t in (3, 9, 5, 12, 7, 4, 11, 6, 10, 8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        final = json.loads((d / "state.json").read_text())[ORIGIN]
    finally:
        s.stop()
    assert not errors and cosigned
    assert final["size"] == max(cosigned) and final["root"] == b64(ref.mth(leaves[:final["size"]]))


def test_the_witness_command_serves_until_stopped(tmp_path, wdir, logkey, leaves):
    d, wv = wdir
    vk = tmp_path / "log.vkey"
    vk.write_text(Vkey.of(ORIGIN, logkey).text() + "\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "witness", "serve", "--dir", str(d), "--log-vkey",
                          str(vk), "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = p.stdout.readline()
        info = json.loads(line)
        assert info["vkey"] == wv.text() and info["url"].startswith("http://127.0.0.1:")
        port = int(info["url"].rsplit(":", 1)[1])
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("POST", "/add-checkpoint", body=body(0, [], signed(2, ref.mth(leaves[:2]), logkey)).encode())
        r = c.getresponse()
        assert r.status == 200 and ref.parse_vkey(wv.text())["name"] in r.read().decode()
        c.close()
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(20)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert p.returncode in (0, 143), p.stderr.read()[-500:]


def test_https(tmp_path, wdir, logkey, leaves, monkeypatch):
    """``--tls-cert/--tls-key``: the log's client verifies the certificate (here a self-signed one
    trusted through SSL_CERT_FILE); without trusting it, the witness counts as down."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from pipelines.receipts import witness_client

    k = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(k.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(k, hashes.SHA256()))
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    d, wv = wdir
    s = Served(d, [Vkey.of(ORIGIN, logkey)], tls=(str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")))
    url = f"https://127.0.0.1:{s.port}"
    note = signed(3, ref.mth(leaves[:3]), logkey)
    try:
        monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "empty.pem"))
        (tmp_path / "empty.pem").write_text("")
        with pytest.raises(witness_client.WitnessDown):
            witness_client.post(url, body(0, [], note))
        monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "cert.pem"))
        status, _, text = witness_client.post(url, body(0, [], note))
        assert status == 200 and ref.open_note(note + text, [ref.parse_vkey(wv.text())])[1]
    finally:
        s.stop()


def test_the_log_signing_key_is_not_needed_by_the_witness(wdir, tmp_path, monkeypatch):
    """The witness folder holds its own key only; it never reads the log's config folder."""
    monkeypatch.setenv("FORGETFUL_CONFIG_DIR", str(tmp_path / "cfg"))
    key = load_signing_key(create=True)
    s = Served(wdir[0], [Vkey.of(ORIGIN, key)])
    try:
        assert s.post(body(0, [], signed(1, ref.sha(b"\0x"), key)))[0] == 200
    finally:
        s.stop()
    assert sorted(p.name for p in wdir[0].iterdir()) == [".lock", "state.json", "witness.json", "witness.key"]
