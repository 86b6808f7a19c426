"""The receipt log as C2SP checkpoints: its origin, its signed checkpoints with every witness
cosignature it holds, the witnesses it asks, and the auditor's witness policy.

Three files in the ledger folder, beside ``receipts.jsonl`` and ``heads.jsonl`` (owner-only):

* ``origin`` — one line, the log's origin: the first line of each checkpoint and the key name
  of the log's signature (https://c2sp.org/tlog-checkpoint: "a unique identifier for the log
  identity"). Made once per log as ``forgetful.invalid/<12 hex of the log id>-<8 random hex>``
  (the reserved ``.invalid`` name: no endpoint is implied), so two ledgers under one signing
  key are two logs to a witness. A restored or forked folder keeps it.
* ``checkpoints.jsonl`` — append-only, one canonical JSON object per signature,
  ``{"root": "<base64>", "sig": "— <name> <base64>", "size": <n>}``: the log's own Ed25519 note
  signature of the checkpoint ``(origin, size, root)`` (https://c2sp.org/signed-note, type 0x01)
  and every witness cosignature received for it (https://c2sp.org/tlog-cosignature,
  ``cosignature/v1``). A checkpoint as a signed note (:meth:`Checkpoints.note`) is its text, a
  blank line and every signature stored for its size and root — the log's first.
* ``witnesses.json`` — ``{"witnesses": [{"url": "...", "vkey": "<name>+<id>+<key>"}]}``: who the
  log asks (:mod:`pipelines.receipts.witness_client`; ``forgetful receipts witness add``).

The checkpoint of tree size ``n`` commits to the same RFC 9162 root as the signed tree head of
size ``n`` in ``heads.jsonl``; the log signs one when it needs it (a witness round, ``receipts
head --format checkpoint``, ``receipts prove --format tlog-proof``). :func:`check_witnessed` is
the auditor's side: with the log's key and the witnesses' verifier keys only, every stored
signature is checked against the receipts, and the newest checkpoint must carry a quorum.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from pipelines.errors import LedgerRollbackError, LedgerTamperedError, WitnessError
from pipelines.receipts import c2sp
from pipelines.receipts.logaudit import LogState, canonical_json
from pipelines.store.safe_io import replace_private

ORIGIN = "origin"
FILE = "checkpoints.jsonl"
WITNESSES = "witnesses.json"
ORIGIN_PREFIX = "forgetful.invalid/"


@contextlib.contextmanager
def flocked(path: Path):
    """Hold an exclusive ``flock`` on ``path`` (created 0600, never through a link) for the block."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Entry:
    size: int
    root: bytes
    sig: c2sp.Signature


@dataclass(frozen=True)
class Witness:
    url: str
    vkey: c2sp.Vkey

    @property
    def name(self) -> str:
        return self.vkey.name


def read_vkey(text: str, sig_type: int = c2sp.COSIGNATURE) -> c2sp.Vkey:
    """A verifier key of ``sig_type`` (default a witness's, cosignature/v1) from its text or a
    file holding it; :class:`WitnessError` otherwise."""
    p = Path(text)
    try:
        raw = p.read_text(encoding="utf-8").strip() if "+" not in text and p.is_file() else text
        v = c2sp.Vkey.parse(raw)
    except (c2sp.NoteError, UnicodeDecodeError) as exc:
        raise WitnessError(f"{text!r} is not a verifier key ({exc})") from None
    if v.sig_type != sig_type:
        raise WitnessError(f"{v.name}'s verifier key has type {v.sig_type:#04x}, not {sig_type:#04x} "
                           f"({'a witness' if sig_type == c2sp.COSIGNATURE else 'a log'}'s key)")
    return v


def witness_vkey(text: str) -> c2sp.Vkey:
    """A witness's verifier key (cosignature/v1, type 0x04), from its text or a file holding it."""
    return read_vkey(text, c2sp.COSIGNATURE)


class Checkpoints:
    """The C2SP files of one ledger folder (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory)
        self.file = self.dir / FILE

    # -- origin ---------------------------------------------------------------------------
    def origin(self) -> str | None:
        p = self.dir / ORIGIN
        if not p.is_file():
            return None
        text = p.read_text(encoding="utf-8")
        try:
            if not text.endswith("\n") or "\n" in text[:-1]:
                raise c2sp.NoteError("one line")
            return c2sp.check_name(text[:-1])
        except c2sp.NoteError:
            raise LedgerTamperedError(0, f"{p} is not one origin line") from None

    def ensure_origin(self, log_id: str) -> str:
        """The log's origin, made now if the folder has none yet (operator only)."""
        from pipelines.store.keys import write_private

        if self.origin() is None:
            write_private(self.dir / ORIGIN, f"{ORIGIN_PREFIX}{log_id[:12]}-{secrets.token_hex(4)}\n".encode())
        return self.origin()

    # -- signatures -----------------------------------------------------------------------
    def entries(self) -> list[Entry]:
        """Every stored signature, strictly parsed (one canonical JSON object per line)."""
        if not self.file.is_file():
            return []
        raw = self.file.read_bytes()
        if raw and not raw.endswith(b"\n"):
            raise LedgerTamperedError(0, f"the last line of {FILE} is incomplete")
        out = []
        for i, line in enumerate(raw.split(b"\n")[:-1], start=1):
            try:
                d = json.loads(line)
                if (set(d) != {"root", "sig", "size"} or type(d["size"]) is not int
                        or canonical_json(d).encode() != line):
                    raise ValueError("fields")
                out.append(Entry(d["size"], c2sp.b64d(d["root"]), c2sp.Signature.parse(d["sig"])))
            except (ValueError, TypeError, AttributeError, UnicodeError):
                raise LedgerTamperedError(0, f"line {i} of {FILE} is not a canonical checkpoint signature") from None
        return out

    def add(self, size: int, root: bytes, sigs: list[c2sp.Signature]) -> int:
        """Append the signatures of checkpoint ``(size, root)`` not stored yet; returns how many."""
        from pipelines.receipts.ledger import append_line

        with self.locked():
            have = {(e.size, e.root, e.sig) for e in self.entries()}
            new = [s for s in dict.fromkeys(sigs) if (int(size), bytes(root), s) not in have]
            for s in new:
                entry = {"root": c2sp.b64e(root), "sig": s.line()[:-1], "size": int(size)}
                append_line(self.file, canonical_json(entry))
        return len(new)

    def signatures(self, size: int, root: bytes) -> list[c2sp.Signature]:
        return [e.sig for e in self.entries() if e.size == size and e.root == root]

    def note(self, origin: str, size: int, root: bytes) -> str | None:
        """The stored checkpoint ``(size, root)`` as a signed note, None when it has no signature."""
        sigs = self.signatures(size, root)
        return c2sp.join_note(c2sp.checkpoint_body(origin, size, root), sigs) if sigs else None

    def publish(self, st: LogState, key) -> str:
        """Sign the checkpoint of the log's current size (once; Ed25519 is deterministic) and
        return it as a signed note with every signature held for it. Operator only (``key``)."""
        from pipelines.receipts.signing import log_id

        origin = self.ensure_origin(log_id(key))
        body = c2sp.checkpoint_body(origin, st.size, st.root())
        self.add(st.size, st.root(), [c2sp.sign_note(body, origin, key)])
        return self.note(origin, st.size, st.root())

    def newest_note(self, st: LogState) -> str | None:
        """The stored checkpoint of the log's current size (for an auditor: nothing is signed)."""
        origin = self.origin()
        return None if origin is None else self.note(origin, st.size, st.root())

    @contextlib.contextmanager
    def locked(self):
        """Serialise writers of these files (``<ledger>/.c2sp.lock``; the receipt lock is apart)."""
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        with flocked(self.dir / ".c2sp.lock"):
            yield

    # -- witnesses ------------------------------------------------------------------------
    def witnesses(self) -> list[Witness]:
        p = self.dir / WITNESSES
        if not p.is_file():
            return []
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
            return [Witness(str(w["url"]), witness_vkey(str(w["vkey"]))) for w in d["witnesses"]]
        except (ValueError, KeyError, TypeError, WitnessError) as exc:
            raise WitnessError(f"{p} is not a witness list ({type(exc).__name__}); fix or remove it") from None

    def set_witnesses(self, ws: list[Witness]) -> None:
        doc = {"witnesses": [{"url": w.url, "vkey": w.vkey.text()} for w in ws]}
        with self.locked():
            replace_private(self.dir / WITNESSES, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())


def check_witnessed(st: LogState, store: Checkpoints, log_key: c2sp.Vkey, witnesses: list[c2sp.Vkey],
                    quorum: int, fresh: dict[str, int] | None = None) -> dict:
    """The auditor's witness policy, with public keys only.

    Every stored signature of the log's key and of each witness must verify and name a size
    and root of this log (a larger size: :class:`LedgerRollbackError`; another root or a bad
    signature: :class:`LedgerTamperedError`); the checkpoint of the log's current size must be
    published and carry valid cosignatures from at least ``quorum`` of ``witnesses`` (stored, or
    ``fresh``: witness name -> timestamp of a cosignature just obtained by asking it). Returns,
    per witness, the published checkpoint sizes that lack its cosignature."""
    known = {(v.name, v.key_id): v for v in witnesses}
    published: set[int] = set()
    cosigned: dict[str, set[int]] = {v.name: set() for v in witnesses}
    for e in store.entries():
        who = log_key if (e.sig.name, e.sig.key_id) == (log_key.name, log_key.key_id) else known.get(
            (e.sig.name, e.sig.key_id))
        if who is None:
            continue  # a signature of a key the auditor does not know: ignored (signed-note)
        body = c2sp.checkpoint_body(log_key.name, e.size, e.root)
        ok = (c2sp.note_verified(body, [e.sig], who) if who is log_key
              else c2sp.cosignature_time(body, [e.sig], who) is not None)
        what = "the log's signature" if who is log_key else f"{who.name}'s cosignature"
        if not ok:
            raise LedgerTamperedError(e.size, f"{what} on the checkpoint of size {e.size} does not verify (forged)")
        if e.size > st.size:
            raise LedgerRollbackError(st.size + 1, f"{what} covers a checkpoint of {e.size} receipts, the log holds "
                                                   f"{st.size} (receipts removed or an older copy restored)")
        if e.root != st.root(e.size):
            raise LedgerTamperedError(e.size, f"{what} covers another root at size {e.size} than the receipts hash "
                                              "to (the log was rewritten or forked)")
        (published if who is log_key else cosigned[who.name]).add(e.size)
    have = {n for n, sizes in cosigned.items() if st.size in sizes and st.size in published}
    have |= {n for n in (fresh or {}) if n in cosigned and st.size in published}
    out = {"origin": log_key.name, "checkpoint_size": st.size, "published": sorted(published), "quorum": quorum,
           "cosigned_newest": len(have),
           "witnesses": {n: {"lacking": sorted(published - sizes), "cosigned_newest": n in have}
                         for n, sizes in cosigned.items()}}
    if st.size not in published:
        raise LedgerTamperedError(st.size, f"the log has published no checkpoint of its {st.size} receipts (the "
                                           "operator's next forgetful command, or `receipts head --format "
                                           "checkpoint`, signs it)")
    if len(have) < quorum:
        lacking = {n: d["lacking"] for n, d in out["witnesses"].items() if not d["cosigned_newest"]}
        raise LedgerTamperedError(st.size, f"the newest checkpoint ({st.size} receipts) carries cosignatures of "
                                           f"{len(have)} of the {quorum} required witness(es); checkpoint sizes "
                                           f"each witness has not cosigned: {lacking}")
    return out
