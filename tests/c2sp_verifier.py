"""An independent C2SP verifier, written for the tests from the specification texts alone — it
imports nothing of the project (only ``cryptography`` for Ed25519 and ``hashlib``):

* signed-note (https://c2sp.org/signed-note): text, blank line, ``— name base64(keyid || sig)``
  lines; key ID = SHA-256(name || 0x0A || type || key)[:4]; unknown keys ignored, a failing
  known key rejects the note, no verified known key rejects it;
* vkeys ``name+hex(keyid)+base64(type || key)``;
* tlog-checkpoint: origin, size, base64 root; tlog-cosignature: type 0x04, u64 timestamp ||
  Ed25519 over "cosignature/v1\\ntime T\\n" || checkpoint text;
* tlog-proof@v1, with the inclusion proof checked by rebuilding the root *recursively* from the
  RFC 6962 §2.1.1 definition of the Merkle tree hash (the project checks it iteratively);
* RFC 6962 §2.1.2 consistency proofs, generated recursively from the leaves (to compare).
"""
from __future__ import annotations

import base64
import hashlib
import struct

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey


class Rejected(Exception):
    pass


def sha(b: bytes) -> bytes:
    return hashlib.sha256(b).digest()


def b64(s: str) -> bytes:
    try:
        out = base64.b64decode(s, validate=True)
    except ValueError:
        raise Rejected("not base64") from None
    if base64.b64encode(out).decode() != s:
        raise Rejected("non-canonical base64")
    return out


def parse_vkey(text: str) -> dict:
    name, rest = text.strip().split("+", 1)
    hexid, data = rest.split("+", 1)
    raw = b64(data)
    typ, key = raw[0], raw[1:]
    kid = sha(name.encode() + b"\x0a" + bytes([typ]) + key)[:4]
    if kid.hex() != hexid or len(key) != 32:
        raise Rejected("vkey key ID does not match")
    return {"name": name, "id": kid, "type": typ, "key": Ed25519PublicKey.from_public_bytes(key)}


def open_note(note: str, vkeys: list[dict]) -> tuple[str, dict]:
    """(text, {key name: timestamp or None}) of the keys whose signatures verified."""
    if any(ord(c) < 0x20 and c != "\n" for c in note) or not note.endswith("\n"):
        raise Rejected("bad note bytes")
    i = note.rindex("\n\n")
    text, sigs = note[:i + 1], note[i + 2:-1].split("\n")
    ok = {}
    for line in sigs:
        if not line.startswith("\u2014 "):
            raise Rejected("bad signature line")
        name, blob = line[2:].split(" ")
        raw = b64(blob)
        for k in vkeys:
            if k["name"] != name or k["id"] != raw[:4]:
                continue
            try:
                if k["type"] == 0x01:
                    k["key"].verify(raw[4:], text.encode())
                    ok[name] = None
                elif k["type"] == 0x04:
                    (t,) = struct.unpack(">Q", raw[4:12])
                    k["key"].verify(raw[12:], b"cosignature/v1\ntime %d\n" % t + text.encode())
                    ok[name] = t
            except InvalidSignature:
                raise Rejected(f"signature of {name} fails") from None
    if not ok:
        raise Rejected("no known key signed the note")
    return text, ok


def checkpoint(text: str) -> tuple[str, int, bytes]:
    lines = text.split("\n")
    size = lines[1]
    if size != str(int(size)):
        raise Rejected("size")
    root = b64(lines[2])
    if len(root) != 32:
        raise Rejected("root")
    return lines[0], int(size), root


def _k(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def root_from_path(index: int, size: int, leaf: bytes, path: list[bytes]) -> bytes:
    """MTH of the tree from the leaf hash and its audit path, top-down by RFC 6962 §2.1.1."""
    if size == 1:
        if path:
            raise Rejected("path too long")
        return leaf
    if not path:
        raise Rejected("path too short")
    k = _k(size)
    if index < k:
        return sha(b"\x01" + root_from_path(index, k, leaf, path[:-1]) + path[-1])
    return sha(b"\x01" + path[-1] + root_from_path(index - k, size - k, leaf, path[:-1]))


def mth(leaves: list[bytes]) -> bytes:
    if not leaves:
        return sha(b"")
    if len(leaves) == 1:
        return sha(b"\x00" + leaves[0])
    k = _k(len(leaves))
    return sha(b"\x01" + mth(leaves[:k]) + mth(leaves[k:]))


def consistency(m: int, leaves: list[bytes], whole: bool = True) -> list[bytes]:
    """RFC 6962 §2.1.2 SUBPROOF(m, D[n], b)."""
    n = len(leaves)
    if m == n:
        return [] if whole else [mth(leaves)]
    k = _k(n)
    if m <= k:
        return consistency(m, leaves[:k], whole) + [mth(leaves[k:])]
    return consistency(m - k, leaves[k:], False) + [mth(leaves[:k])]


def verify_tlog_proof(text: str, log_vkey: str, witness_vkeys: tuple[str, ...] = (), quorum: int = 0) -> dict:
    """Check a c2sp.org/tlog-proof@v1 file; returns index, size, the entry bytes, cosigners."""
    lines = text.split("\n")
    if lines[0] != "c2sp.org/tlog-proof@v1":
        raise Rejected("header")
    i, extra = 1, None
    if lines[1].startswith("extra "):
        extra, i = b64(lines[1][6:]), 2
    if not lines[i].startswith("index "):
        raise Rejected("index")
    index = int(lines[i][6:])
    j = lines.index("", i + 1)
    path = [b64(x) for x in lines[i + 1:j]]
    note = "\n".join(lines[j + 1:])
    log = parse_vkey(log_vkey)
    ws = [parse_vkey(w) for w in witness_vkeys]
    body, ok = open_note(note, [log, *ws])
    if log["name"] not in ok:
        raise Rejected("the log did not sign the checkpoint")
    origin, size, root = checkpoint(body)
    if origin != log["name"] or extra is None or not index < size:
        raise Rejected("origin, extra or index")
    if root_from_path(index, size, sha(b"\x00" + extra), path) != root:
        raise Rejected("not included")
    cosigners = sorted(n for n in ok if n != log["name"])
    if len(cosigners) < quorum:
        raise Rejected("quorum")
    return {"index": index, "size": size, "entry": extra, "cosigners": cosigners, "times": ok}
