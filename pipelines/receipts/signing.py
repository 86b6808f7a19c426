"""The log's Ed25519 signing key and its signed tree heads (STH).

**Key.** ``<config dir>/signing.key`` (``$FORGETFUL_SIGNING_KEY_FILE`` overrides): an unencrypted
PKCS#8 PEM Ed25519 private key, created on first use with mode 0600 in a 0700 folder — beside the
HMAC key (:mod:`pipelines.store.keys`), never beside the warehouse — and only in a fresh
configuration: once a log is anchored, a missing key is refused, never silently replaced. A key
file readable by group or others is refused. The **log id** is ``SHA-256(raw 32-byte public key)`` (hex).

**Public key file** (``forgetful receipts public-key --out FILE``): PEM (SubjectPublicKeyInfo,
``-----BEGIN PUBLIC KEY-----``) or, with ``--format hex``, the 64 hex characters of the raw
32-byte key on one line. :func:`load_public_key` reads either.

**Signed tree head**, one JSON object (``heads.jsonl`` holds one per tree size, in order)::

    {"log_id": "<64 hex>", "prev": "<64 hex>", "root_hash": "<64 hex>", "signature": "<128 hex>",
     "timestamp": <ms since the epoch>, "tree_size": <n>, "version": "forgetful-sth-v1"}

The signature is Ed25519 over the 136 bytes ``b"forgetful/sth/v1" (16) || log_id (32) ||
tree_size (u64, big-endian) || timestamp (u64, big-endian) || root_hash (32) || prev (32)``.
``prev`` is :func:`head_digest` of the previous head (64 zeros for the first): every head commits
to all earlier ones, so one signature check of the newest head authenticates the whole series
(each head also verifies on its own; ``all_signatures`` checks every one).
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from pipelines.errors import LedgerError, LedgerKeyError, LedgerTamperedError
from pipelines.store.keys import (
    SIGNING_KEY_ENV,
    kept_logs,
    missing_key,
    signing_key_file,
    why_not_created,
    write_private,
)

STH_FORMAT = "forgetful-sth-v1"
_TAG = b"forgetful/sth/v1"
ZERO = "0" * 64
_HEAD_FIELDS = ("log_id", "prev", "root_hash", "signature", "timestamp", "tree_size", "version")


def load_signing_key(create: bool = False):
    """The Ed25519 private key (``cryptography``); created in the config dir when ``create`` and
    the configuration is fresh (it has anchored no receipt log: :func:`pipelines.store.keys.kept_logs`);
    otherwise a missing key is :class:`LedgerKeyError` naming the recovery."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    p = signing_key_file()
    if not p.exists():
        if not create or os.environ.get(SIGNING_KEY_ENV) or kept_logs():
            raise missing_key(p, "signing key", why_not_created(SIGNING_KEY_ENV))
        pem = Ed25519PrivateKey.generate().private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption())
        write_private(p, pem)
    if not p.is_file():
        raise LedgerKeyError(f"signing key path {p} exists but is not a file")
    mode = p.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise LedgerKeyError(f"signing key {p} is accessible by group or others (mode {stat.S_IMODE(mode):o}); "
                             f"run: chmod 600 {p}")
    try:
        key = serialization.load_pem_private_key(p.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise LedgerKeyError(f"signing key {p} is not a PEM private key ({type(exc).__name__})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise LedgerKeyError(f"signing key {p} is not an Ed25519 key")
    return key


def public_bytes(key) -> bytes:
    """Raw 32 bytes of a public (or the public half of a private) Ed25519 key."""
    from cryptography.hazmat.primitives import serialization

    pub = key.public_key() if hasattr(key, "public_key") else key
    return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def public_key_text(key, fmt: str = "pem") -> str:
    """The public key as a PEM block or one line of 64 hex characters."""
    from cryptography.hazmat.primitives import serialization

    pub = key.public_key() if hasattr(key, "public_key") else key
    if fmt == "hex":
        return public_bytes(pub).hex() + "\n"
    if fmt != "pem":
        raise ValueError(f"public key format must be pem or hex, got {fmt!r}")
    return pub.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def load_public_key(path: str | os.PathLike):
    """An Ed25519 public key from a PEM or raw-hex file (:func:`public_key_text`)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    p = Path(path)
    if not p.is_file():
        raise LedgerKeyError(f"public key file {p} does not exist")
    raw = p.read_bytes()
    try:
        if raw.lstrip().startswith(b"-----BEGIN"):
            key = serialization.load_pem_public_key(raw)
        else:
            text = raw.decode("ascii").strip()
            if len(text) != 64:
                raise ValueError("length")
            key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(text))
    except (ValueError, TypeError, UnicodeDecodeError):
        raise LedgerKeyError(f"{p} is neither a PEM public key nor 64 hex characters of an Ed25519 key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise LedgerKeyError(f"{p} is not an Ed25519 public key")
    return key


def log_id(key) -> str:
    """``SHA-256(raw public key)``, hex."""
    return hashlib.sha256(public_bytes(key)).hexdigest()


def _hex(v, n: int, what: str) -> bytes:
    if not isinstance(v, str) or len(v) != 2 * n or v != v.lower():
        raise ValueError(what)
    return bytes.fromhex(v)


@dataclass(frozen=True)
class TreeHead:
    """A signed tree head (see the module docstring)."""

    tree_size: int
    timestamp: int
    root_hash: str
    log_id: str
    prev: str
    signature: str

    def message(self) -> bytes:
        return (_TAG + bytes.fromhex(self.log_id) + struct.pack(">QQ", self.tree_size, self.timestamp)
                + bytes.fromhex(self.root_hash) + bytes.fromhex(self.prev))

    def digest(self) -> str:
        """``SHA-256(message || signature)``: what the next head's ``prev`` commits to."""
        return hashlib.sha256(self.message() + bytes.fromhex(self.signature)).hexdigest()

    def to_json(self) -> dict:
        return {"log_id": self.log_id, "prev": self.prev, "root_hash": self.root_hash, "signature": self.signature,
                "timestamp": self.timestamp, "tree_size": self.tree_size, "version": STH_FORMAT}

    def line(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    def verify(self, pub) -> bool:
        """Is the signature valid under public key ``pub`` and the log id its hash?"""
        from cryptography.exceptions import InvalidSignature

        if self.log_id != log_id(pub):
            return False
        try:
            pub.verify(bytes.fromhex(self.signature), self.message())
        except InvalidSignature:
            return False
        return True

    @classmethod
    def from_json(cls, d) -> TreeHead:
        """Strict: exactly the fields above, lower-case hex of the right lengths, integer sizes."""
        if not isinstance(d, dict) or set(d) != set(_HEAD_FIELDS) or d["version"] != STH_FORMAT:
            raise ValueError("fields")
        for f in ("tree_size", "timestamp"):
            if type(d[f]) is not int or not 0 <= d[f] < 2 ** 64:
                raise ValueError(f)
        _hex(d["log_id"], 32, "log_id"), _hex(d["root_hash"], 32, "root_hash"), _hex(d["prev"], 32, "prev")
        _hex(d["signature"], 64, "signature")
        return cls(d["tree_size"], d["timestamp"], d["root_hash"], d["log_id"], d["prev"], d["signature"])


def sign_head(key, tree_size: int, root_hash: bytes, prev: str = ZERO, timestamp_ms: int | None = None) -> TreeHead:
    """Sign ``(tree_size, root_hash)`` now with private key ``key``, chained to ``prev``."""
    ts = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
    unsigned = TreeHead(int(tree_size), ts, root_hash.hex(), log_id(key), prev, "00" * 64)
    return TreeHead(**{**unsigned.__dict__, "signature": key.sign(unsigned.message()).hex()})


def read_head_file(path: str | os.PathLike) -> TreeHead:
    """A signed tree head kept by an auditor (``receipts head --out``); strict JSON."""
    p = Path(path)
    try:
        return TreeHead.from_json(json.loads(p.read_text(encoding="ascii")))
    except FileNotFoundError:
        raise LedgerError(f"tree head file {p} does not exist") from None
    except (ValueError, TypeError, UnicodeDecodeError):
        raise LedgerTamperedError(0, f"{p.name} is not a signed tree head") from None
