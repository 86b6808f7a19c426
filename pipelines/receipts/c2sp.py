"""The C2SP transparency-log text formats, so any verifier of that ecosystem can check the log.

Every function here is pure (text and bytes in, text and bytes out); the log's own files are in
:mod:`pipelines.receipts.checkpoints`, the witness in :mod:`pipelines.receipts.witness`. Formats,
each stated at its functions: signed-note (https://c2sp.org/signed-note; :func:`split_note`,
:func:`note_verified`), verifier keys (:class:`Vkey`), tlog-checkpoint
(https://c2sp.org/tlog-checkpoint; :func:`checkpoint_body`), tlog-cosignature
(https://c2sp.org/tlog-cosignature; :func:`cosign`), tlog-proof@v1 (https://c2sp.org/tlog-proof;
:func:`tlog_proof_text`) and the tlog-witness ``add-checkpoint`` body
(https://c2sp.org/tlog-witness; :func:`add_checkpoint_body`). Malformed text raises
:class:`NoteError` (a ``ValueError``); callers turn it into their own typed error. Base64 is
RFC 4648 §4 (standard alphabet, padded) and is decoded strictly. docs/RECEIPTS.md.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from dataclasses import dataclass

from pipelines.receipts.signing import public_bytes

ED25519 = 0x01
COSIGNATURE = 0x04
DASH = "\u2014 "
PROOF_HEADER = "c2sp.org/tlog-proof@v1"
MAX_SIGNATURES = 100
MAX_PROOF_LINES = 63
HASH_LEN = 32
_DECIMAL = re.compile(r"^(0|[1-9][0-9]{0,19})$")


class NoteError(ValueError):
    """Text that is not the C2SP format it claims to be."""


def b64e(data: bytes) -> str:
    return base64.b64encode(bytes(data)).decode("ascii")


def b64d(text: str, what: str = "base64") -> bytes:
    """Strict standard base64: the canonical encoding of what it decodes to, nothing else."""
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise NoteError(f"{what} is not base64") from None
    if b64e(raw) != text:
        raise NoteError(f"{what} is not canonical base64")
    return raw


def decimal(text: str, what: str) -> int:
    """An ASCII decimal without leading zeros (``0`` itself allowed), below 2**64."""
    if not _DECIMAL.match(text) or int(text) >= 2 ** 64:
        raise NoteError(f"{what} is not a decimal without leading zeros")
    return int(text)


def check_name(name: str) -> str:
    """A key name: non-empty, no Unicode space, no ``+`` (signed-note, key names)."""
    if not name or "+" in name or any(c.isspace() for c in name) or any(ord(c) < 0x20 for c in name):
        raise NoteError(f"{name!r} is not a key name (non-empty, no spaces, no '+')")
    return name


def key_id(name: str, sig_type: int, key: bytes) -> bytes:
    """``SHA-256(name || 0x0A || type || key)[:4]``."""
    return hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([sig_type]) + bytes(key)).digest()[:4]


@dataclass(frozen=True)
class Vkey:
    """A verifier key: name, signature type (:data:`ED25519` or :data:`COSIGNATURE`), raw key.

    The signed-note ``vkey`` encoding, as Go's ``sumdb/note``:
    ``<name>+<8 lowercase hex of the key ID>+<base64(type || 32-byte key)>``.
    """

    name: str
    sig_type: int
    key: bytes

    @property
    def key_id(self) -> bytes:
        return key_id(self.name, self.sig_type, self.key)

    def text(self) -> str:
        return f"{self.name}+{self.key_id.hex()}+{b64e(bytes([self.sig_type]) + self.key)}"

    def public_key(self):
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        return Ed25519PublicKey.from_public_bytes(self.key)

    @classmethod
    def of(cls, name: str, key, sig_type: int = ED25519) -> Vkey:
        """The vkey of ``key`` (an Ed25519 public or private key) under ``name``."""
        return cls(check_name(name), sig_type, public_bytes(key))

    @classmethod
    def parse(cls, text: str) -> Vkey:
        """Strict: ``<name>+<8 hex>+<base64>`` split at the first two ``+`` (base64 may hold
        ``+``), a supported type, a 32-byte key, the right key ID."""
        name, _, rest = text.strip().partition("+")
        parts = [name, *rest.partition("+")[::2]]
        if not re.fullmatch(r"[0-9a-f]{8}", parts[1]):
            raise NoteError("a verifier key is <name>+<8 hex>+<base64>")
        raw = b64d(parts[2], "the verifier key's key material")
        if len(raw) != 1 + 32 or raw[0] not in (ED25519, COSIGNATURE):
            raise NoteError("the verifier key is not an Ed25519 (0x01) or cosignature/v1 (0x04) key")
        v = cls(check_name(parts[0]), raw[0], raw[1:])
        if v.key_id.hex() != parts[1]:
            raise NoteError("the verifier key's key ID does not match its name and key")
        return v


@dataclass(frozen=True)
class Signature:
    """One signature line: key name, 4-byte key ID, the signature bytes after it."""

    name: str
    key_id: bytes
    sig: bytes

    def line(self) -> str:
        return f"{DASH}{self.name} {b64e(self.key_id + self.sig)}\n"

    @classmethod
    def parse(cls, line: str) -> Signature:
        if not line.startswith(DASH):
            raise NoteError("a signature line starts with an em dash and a space")
        parts = line[len(DASH):].split(" ")
        if len(parts) != 2:
            raise NoteError("a signature line is '— <name> <base64>'")
        raw = b64d(parts[1], "a note signature")
        if len(raw) < 5:
            raise NoteError("a note signature is a key ID and a signature")
        return cls(check_name(parts[0]), raw[:4], raw[4:])


def split_note(text: str) -> tuple[str, list[Signature]]:
    """(note text, signatures) of a signed note; the text ends in its newline.

    A note is UTF-8 text ending in a newline, then a blank line, then signature lines
    ``"— <key name> base64(key ID || signature)\n"`` (em dash U+2014, space). No ASCII control
    character but the newline; key names are non-empty without spaces or ``+``; the text is split from
    the signatures at the *last* blank line. ``key ID = SHA-256(name || 0x0A || type || public
    key)[:4]`` (big-endian u32); type ``0x01`` is an Ed25519 signature over the note text
    (:data:`ED25519`).
    """
    if any(ord(c) < 0x20 and c != "\n" for c in text):
        raise NoteError("a signed note holds no control characters but newlines")
    if not text.endswith("\n"):
        raise NoteError("a signed note ends in a newline")
    cut = text.rfind("\n\n")
    if cut < 0:
        raise NoteError("a signed note has a blank line before its signatures")
    body, lines = text[:cut + 1], text[cut + 2:-1].split("\n")
    if not body or lines == [""]:
        raise NoteError("a signed note has a text and at least one signature")
    if len(lines) > MAX_SIGNATURES:
        raise NoteError(f"more than {MAX_SIGNATURES} signatures")
    return body, [Signature.parse(x) for x in lines]


def join_note(body: str, sigs) -> str:
    """A signed note from its text and signatures (:class:`Signature` or signature lines)."""
    return body + "\n" + "".join(s if isinstance(s, str) else s.line() for s in sigs)


def _ed25519_ok(pub, sig: bytes, message: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature

    try:
        pub.verify(sig, message)
    except InvalidSignature:
        return False
    return True


def sign_note(body: str, name: str, key) -> Signature:
    """The Ed25519 note signature (type 0x01) of ``body`` by private ``key`` under ``name``."""
    return Signature(name, key_id(name, ED25519, public_bytes(key)), key.sign(body.encode("utf-8")))


def _matching(sigs: list[Signature], v: Vkey) -> list[Signature]:
    return [s for s in sigs if s.name == v.name and s.key_id == v.key_id]


def note_verified(body: str, sigs: list[Signature], v: Vkey) -> bool:
    """Is ``body`` signed by ``v`` (type 0x01)? Every signature of that key must verify and at
    least one must be there; signatures of other keys are ignored.

    A verifier ignores signatures of unknown keys and rejects the note when a signature of a known
    (name, key ID) fails.
    """
    mine = _matching(sigs, v)
    pub = v.public_key()
    return bool(mine) and all(_ed25519_ok(pub, s.sig, body.encode("utf-8")) for s in mine)


def cosignature_message(body: str, timestamp: int) -> bytes:
    return f"cosignature/v1\ntime {int(timestamp)}\n".encode("ascii") + body.encode("utf-8")


def cosign(body: str, name: str, key, timestamp: int) -> Signature:
    """A cosignature/v1 of checkpoint text ``body`` by private ``key`` at POSIX ``timestamp``.

    ``cosignature/v1``, type ``0x04`` (:data:`COSIGNATURE`): the signature is ``u64 big-endian
    timestamp || Ed25519 signature`` over ``"cosignature/v1\ntime <T>\n" || checkpoint text``, ``T``
    POSIX seconds (:func:`cosignature_time` reads it back).
    """
    if not 0 <= int(timestamp) < 2 ** 63:
        raise NoteError("a cosignature timestamp is below 2**63")
    sig = key.sign(cosignature_message(body, timestamp))
    return Signature(name, key_id(name, COSIGNATURE, public_bytes(key)), struct.pack(">Q", int(timestamp)) + sig)


def cosignature_time(body: str, sigs: list[Signature], v: Vkey) -> int | None:
    """The newest timestamp of a valid cosignature of ``v`` (type 0x04) on ``body``; None when
    there is none or one of its cosignatures fails (the note is then rejected)."""
    pub, times = v.public_key(), []
    for s in _matching(sigs, v):
        if len(s.sig) != 8 + 64:
            return None
        t = struct.unpack(">Q", s.sig[:8])[0]
        if t >= 2 ** 63 or not _ed25519_ok(pub, s.sig[8:], cosignature_message(body, t)):
            return None
        times.append(t)
    return max(times) if times else None


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()


def checkpoint_body(origin: str, size: int, root: bytes) -> str:
    """The note text of a checkpoint (no extension lines).

    Note text ``origin``, the tree size in decimal without leading zeros, the base64 RFC 6962 root,
    then optional non-empty extension lines; the log's key name is the origin
    (:func:`parse_checkpoint` reads it).
    """
    if len(root) != HASH_LEN or int(size) < 0:
        raise NoteError("a checkpoint has a size and a 32-byte root")
    return f"{origin}\n{int(size)}\n{b64e(root)}\n"


def parse_checkpoint(body: str) -> Checkpoint:
    """A checkpoint's note text: at least three non-empty lines (:func:`checkpoint_body`)."""
    if not body.endswith("\n"):
        raise NoteError("a checkpoint ends in a newline")
    lines = body[:-1].split("\n")
    if len(lines) < 3 or any(not x for x in lines):
        raise NoteError("a checkpoint is at least three non-empty lines: origin, size, root")
    root = b64d(lines[2], "the checkpoint root")
    if len(root) != HASH_LEN:
        raise NoteError("the checkpoint root is not a SHA-256 hash")
    return Checkpoint(lines[0], decimal(lines[1], "the checkpoint size"), root, tuple(lines[3:]))


def _hash_lines(lines: list[str], what: str) -> list[bytes]:
    out = [b64d(x, what) for x in lines]
    if any(len(h) != HASH_LEN for h in out):
        raise NoteError(f"{what} is not a SHA-256 hash")
    return out


@dataclass(frozen=True)
class TlogProof:
    extra: bytes | None
    index: int
    path: list[bytes]
    note: str


def tlog_proof_text(index: int, path: list[bytes], note: str, extra: bytes | None = None) -> str:
    """A ``c2sp.org/tlog-proof@v1`` file (its checkpoint ``note`` verbatim).

    ``c2sp.org/tlog-proof@v1``, optional ``extra <base64>``, ``index <N>`` (zero-based), the inclusion
    hashes one per line (the leaf's sibling first, RFC 6962 §2.1.1), an empty line, the checkpoint
    verbatim (:func:`parse_tlog_proof` reads it).
    """
    head = [PROOF_HEADER] + ([f"extra {b64e(extra)}"] if extra is not None else []) + [f"index {int(index)}"]
    return "\n".join(head + [b64e(h) for h in path]) + "\n\n" + note


def parse_tlog_proof(text: str) -> TlogProof:
    lines = text.split("\n")
    if lines[0] != PROOF_HEADER:
        raise NoteError(f"a tlog proof starts with {PROOF_HEADER}")
    i, extra = 1, None
    if len(lines) > 1 and lines[1].startswith("extra "):
        extra, i = b64d(lines[1][len("extra "):], "the proof's extra data"), 2
    if len(lines) <= i or not lines[i].startswith("index "):
        raise NoteError("a tlog proof names the entry's index")
    index = decimal(lines[i][len("index "):], "the proof's index")
    try:
        blank = lines.index("", i + 1)
    except ValueError:
        raise NoteError("a tlog proof has an empty line before its checkpoint") from None
    path = _hash_lines(lines[i + 1:blank], "an inclusion proof line")
    return TlogProof(extra, index, path, "\n".join(lines[blank + 1:]))


def add_checkpoint_body(old: int, proof: list[bytes], note: str) -> str:
    """The body of a tlog-witness ``add-checkpoint`` request.

    ``old <N>``, at most 63 consistency-proof hashes, an empty line, the checkpoint
    (:func:`parse_add_checkpoint` reads it).
    """
    return f"old {int(old)}\n" + "".join(b64e(h) + "\n" for h in proof) + "\n" + note


def parse_add_checkpoint(text: str) -> tuple[int, list[bytes], str]:
    """(old size, consistency proof, signed checkpoint note) of an ``add-checkpoint`` body."""
    lines = text.split("\n")
    if not lines[0].startswith("old "):
        raise NoteError("the request starts with an 'old <size>' line")
    old = decimal(lines[0][len("old "):], "the old size")
    try:
        blank = lines.index("", 1)
    except ValueError:
        raise NoteError("the request has an empty line before its checkpoint") from None
    if blank - 1 > MAX_PROOF_LINES:
        raise NoteError(f"more than {MAX_PROOF_LINES} consistency proof lines")
    return old, _hash_lines(lines[1:blank], "a consistency proof line"), "\n".join(lines[blank + 1:])
