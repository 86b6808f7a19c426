"""A transparency-log witness (https://c2sp.org/tlog-witness): it cosigns a checkpoint of a log
it trusts only when that checkpoint extends the one it cosigned last, and it never forgets the
largest tree it cosigned — so a log restored from a backup, or forked, is refused by it.

**Folder** (``forgetful witness init --dir D --name NAME``; owner-only, 0700/0600):

* ``witness.key`` — its Ed25519 key (PKCS#8 PEM), made once and never replaced;
* ``witness.json`` — ``{"name": NAME}``, the cosigner name (a schema-less URL is recommended);
* ``state.json`` — per log origin the latest cosigned checkpoint, ``{"<origin>": {"size": n,
  "root": "<base64>"}}``, replaced atomically (fsynced temporary file renamed over it).

Its verifier key is ``NAME+<key ID>+base64(0x04 || key)`` (https://c2sp.org/tlog-cosignature).
The request's checks: :meth:`Cosigner.add_checkpoint`; serving: :func:`make_server`.
"""
from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from pipelines.errors import WitnessError
from pipelines.receipts import c2sp, translog
from pipelines.receipts.checkpoints import flocked
from pipelines.store.safe_io import replace_private

KEY = "witness.key"
CONFIG = "witness.json"
STATE = "state.json"
MAX_BODY = 64 * 1024
SIZE_TYPE = "text/x.tlog.size"


def init(directory: str | os.PathLike, name: str) -> c2sp.Vkey:
    """Make a witness folder with a new key; refuses a folder that already holds one."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from pipelines.store.keys import write_private

    try:
        c2sp.check_name(name)
    except c2sp.NoteError as exc:
        raise WitnessError(str(exc)) from None
    d = Path(directory)
    if (d / KEY).exists() or (d / CONFIG).exists():
        raise WitnessError(f"{d} already holds a witness: its key is never replaced (use another --dir)")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    if not write_private(d / KEY, pem):
        raise WitnessError(f"{d / KEY} was created meanwhile by another process; nothing was changed")
    replace_private(d / CONFIG, (json.dumps({"name": name}) + "\n").encode())
    return c2sp.Vkey.of(name, key, c2sp.COSIGNATURE)


def load(directory: str | os.PathLike):
    """(name, private key) of the witness folder ``directory``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    d = Path(directory)
    if not (d / KEY).is_file() or not (d / CONFIG).is_file():
        raise WitnessError(f"{d} is not a witness folder (make one with `forgetful witness init --dir {d} "
                           "--name NAME`)")
    mode = (d / KEY).stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise WitnessError(f"witness key {d / KEY} is accessible by group or others; run: chmod 600 {d / KEY}")
    try:
        name = c2sp.check_name(json.loads((d / CONFIG).read_text())["name"])
        key = serialization.load_pem_private_key((d / KEY).read_bytes(), password=None)
    except (ValueError, KeyError, TypeError, c2sp.NoteError):
        raise WitnessError(f"{d} holds an unreadable witness key or name") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise WitnessError(f"{d / KEY} is not an Ed25519 key")
    return name, key


class Cosigner:
    """The witness's logic and state, independent of HTTP."""

    def __init__(self, directory: str | os.PathLike, logs: list[c2sp.Vkey]):
        self.dir = Path(directory)
        self.name, self.key = load(self.dir)
        self.vkey = c2sp.Vkey.of(self.name, self.key, c2sp.COSIGNATURE)
        self.logs: dict[str, list[c2sp.Vkey]] = {}
        for v in logs:
            if v.sig_type != c2sp.ED25519:
                raise WitnessError(f"{v.name}: a log's verifier key is an Ed25519 note key (type 0x01)")
            self.logs.setdefault(v.name, []).append(v)
        self._mutex = threading.Lock()

    @contextlib.contextmanager
    def _locked(self):
        with self._mutex, flocked(self.dir / ".lock"):
            yield

    def state(self) -> dict:
        p = self.dir / STATE
        return json.loads(p.read_text()) if p.is_file() else {}

    def add_checkpoint(self, raw: bytes) -> tuple[int, str, bytes]:
        """(status, content type, body) of one ``add-checkpoint`` request body.

        In the specification's order: a body that is not ``old N``, proof lines, an empty line and a
        signed checkpoint → 400; unknown origin → 404; no signature of a trusted log key that verifies
        → 403; old size above the checkpoint size → 400 (and a non-empty proof from size 0); then, under
        one lock for the check *and* the update (a threading lock and an ``flock`` on ``D/.lock``, so
        neither concurrent requests nor two processes on one folder can roll the state back): old size
        other than the size it last cosigned → 409 with ``text/x.tlog.size`` body ``"<its size>\n"``; the
        same size with another root → 409 likewise; a consistency proof (RFC 6962 §2.1.2, verified by
        :func:`pipelines.receipts.translog.verify_consistency`) that fails → 422; else the state is
        persisted and the answer is one ``cosignature/v1`` line timestamped now (200).
        """
        try:
            old, proof, note = c2sp.parse_add_checkpoint(raw.decode("utf-8"))
            body, sigs = c2sp.split_note(note)
            cp = c2sp.parse_checkpoint(body)
        except (UnicodeDecodeError, c2sp.NoteError) as exc:
            return _text(400, f"malformed request: {exc}")
        if cp.origin not in self.logs:
            return _text(404, "unknown log origin")
        if not any(c2sp.note_verified(body, sigs, v) for v in self.logs[cp.origin]):
            return _text(403, "no valid signature of a trusted key of this log")
        if old > cp.size:
            return _text(400, "old size above the checkpoint size")
        if old == 0 and proof:
            return _text(400, "a consistency proof from size 0 must be empty")
        with self._locked():
            state = self.state()
            cur = state.get(cp.origin, {"size": 0, "root": None})
            if old != cur["size"]:
                return 409, SIZE_TYPE, f"{cur['size']}\n".encode()
            if old == cp.size and old and c2sp.b64e(cp.root) != cur["root"]:
                return 409, SIZE_TYPE, f"{cur['size']}\n".encode()  # the same size with another root
            if old and not translog.verify_consistency(old, cp.size, c2sp.b64d(cur["root"]), cp.root, proof):
                return _text(422, "the consistency proof does not verify")
            if cp.size == 0 and cp.root != translog.EMPTY_ROOT:
                return _text(422, "an empty tree has the empty root")
            state[cp.origin] = {"root": c2sp.b64e(cp.root), "size": cp.size}
            replace_private(self.dir / STATE, (json.dumps(state, indent=1, sort_keys=True) + "\n").encode())
        line = c2sp.cosign(body, self.name, self.key, int(time.time())).line()
        return 200, "text/plain; charset=utf-8", line.encode("utf-8")


def _text(status: int, message: str) -> tuple[int, str, bytes]:
    return status, "text/plain; charset=utf-8", (message + "\n").encode("utf-8")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30
    server_version = "forgetful-witness"

    def do_POST(self):  # noqa: N802 (http.server's naming)
        if self.path != self.server.prefix + "/add-checkpoint":
            return self._reply(*_text(404, "not found"))
        try:
            n = int(self.headers.get("Content-Length", ""))
        except ValueError:
            n = -1
        if not 0 <= n <= MAX_BODY:
            self.close_connection = True
            return self._reply(*_text(400, f"a request body of 0..{MAX_BODY} bytes with its Content-Length"))
        try:
            answer = self.server.cosigner.add_checkpoint(self.rfile.read(n))
        except (OSError, ValueError) as exc:  # its state cannot be read or written: cosign nothing
            answer = _text(500, f"witness state unavailable ({type(exc).__name__})")
        self._reply(*answer)

    def do_GET(self):  # noqa: N802
        self._reply(*_text(405, "POST <prefix>/add-checkpoint only"))

    def _reply(self, status: int, ctype: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):  # one line per request on stderr, no bodies
        if not self.server.quiet:
            print(f"[witness {self.server.cosigner.name}] {self.address_string()} {fmt % args}", file=sys.stderr)


def make_server(directory: str | os.PathLike, logs: list[c2sp.Vkey], host: str = "127.0.0.1", port: int = 0,
                prefix: str = "", tls: tuple[str, str] | None = None, quiet: bool = False) -> ThreadingHTTPServer:
    """A bound (not yet serving) witness server; ``port=0`` picks a free port
    (``server.server_address``). ``tls``: (certificate chain file, key file).

    The standard library's ``ThreadingHTTPServer``, HTTP/1.1 with keep-alive, on 127.0.0.1 by
    default; ``POST <prefix>/add-checkpoint`` only. A deployment reachable by logs elsewhere
    terminates TLS in front of it (a reverse proxy) or passes ``--tls-cert/--tls-key``
    (docs/RECEIPTS.md).
    """
    cosigner = Cosigner(directory, logs)
    srv = ThreadingHTTPServer((host, int(port)), _Handler)
    srv.daemon_threads = True
    srv.cosigner, srv.prefix, srv.quiet = cosigner, prefix.rstrip("/"), quiet
    if tls is not None:
        import ssl

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*tls)
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    return srv
