"""The receipt log as an auditor sees it: file formats and every check that needs **no secret**.

A ledger folder holds two append-only files (:mod:`pipelines.receipts.ledger` writes them):

* ``receipts.jsonl`` — one receipt per line, canonical JSON (sorted keys, no spaces, ASCII),
  ``\\n``-terminated. Line ``i`` is leaf ``i - 1`` of an RFC 9162 Merkle tree
  (:mod:`pipelines.receipts.translog`); the leaf bytes are the line without its newline;
* ``heads.jsonl`` — one signed tree head per tree size 1, 2, …, n (:mod:`pipelines.receipts.signing`),
  each chained to the one before.

:func:`audit` checks, with the log's public key only: every line canonical; ``seq`` 1..n without
gaps; each ``prev`` equal to the previous row's ``mac`` and one key fingerprint throughout (the
MACs themselves need the operator's secret); exactly one head per tree size, chained, each
root equal to the root recomputed from the rows, the newest signature valid (``all_signatures``:
every one); and, against the log, every recorded state it is given — the signed anchor in the
config folder, a head the auditor kept, the size and root a warehouse recorded. A log shorter
than a recorded state, or whose prefix of that size hashes to another root, raises
:class:`LedgerRollbackError`; everything else :class:`LedgerTamperedError`.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.errors import LedgerError, LedgerRollbackError, LedgerTamperedError
from pipelines.receipts import translog
from pipelines.receipts.signing import ZERO, TreeHead
from pipelines.store.keys import anchors_dir

FILE = "receipts.jsonl"
HEADS = "heads.jsonl"
GENESIS = "0" * 64
_FIELDS = ("seq", "ts", "kind", "subject_id_hash", "payload", "key_fp", "prev", "mac")


def canonical_json(obj: Any) -> str:
    """Canonical JSON: sorted keys, no whitespace, ASCII only, finite numbers only."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


@dataclass(frozen=True)
class Row:
    seq: int
    ts: str
    kind: str
    subject_id_hash: str
    payload: dict
    key_fp: str
    prev: str
    mac: str

    def body(self) -> bytes:
        """What the row's HMAC covers (every field but ``mac``)."""
        return canonical_json([self.seq, self.ts, self.kind, self.subject_id_hash, self.payload, self.key_fp,
                               self.prev]).encode("ascii")

    def to_json(self) -> dict:
        return {f: getattr(self, f) for f in _FIELDS}

    def line(self) -> bytes:
        """The stored line without its newline: the Merkle leaf."""
        return canonical_json(self.to_json()).encode("ascii")


def _lines(path: Path, what: str) -> list[bytes]:
    """``\\n``-terminated lines; no ``\\r`` anywhere, nothing after the last newline."""
    if not path.is_file():
        return []
    raw = path.read_bytes()
    if not raw:
        return []
    if not raw.endswith(b"\n"):
        raise LedgerTamperedError(0, f"the last line of {what} is incomplete (truncated write, edit or trailing bytes)")
    if b"\r" in raw:
        raise LedgerTamperedError(0, f"{what} holds carriage returns (CRLF line endings or an edit)")
    return raw[:-1].split(b"\n")


def read_rows(path: str | os.PathLike) -> list[Row]:
    """The receipts of ``path``, each line checked canonical (no MAC check: that needs the key)."""
    return _read_rows(Path(path))[0]


def _read_rows(path: Path) -> tuple[list[Row], list[bytes]]:
    """Rows and their exact lines (each line equals its row's canonical JSON)."""
    out, lines = [], _lines(path, FILE)
    for i, line in enumerate(lines, start=1):
        try:
            d = json.loads(line)
            if not isinstance(d, dict) or set(d) != set(_FIELDS):
                raise ValueError("fields")
            if type(d["seq"]) is not int or not isinstance(d["payload"], dict):
                raise ValueError("types")
            r = Row(d["seq"], str(d["ts"]), str(d["kind"]), str(d["subject_id_hash"]), d["payload"],
                    str(d["key_fp"]), str(d["prev"]), str(d["mac"]))
            if r.line() != line:
                raise ValueError("not canonical")
        except (ValueError, TypeError, UnicodeDecodeError):
            raise LedgerTamperedError(i, "line is not a canonical receipt row") from None
        out.append(r)
    return out, lines


def read_heads(path: str | os.PathLike) -> list[TreeHead]:
    out = []
    for i, line in enumerate(_lines(Path(path), HEADS), start=1):
        try:
            h = TreeHead.from_json(json.loads(line))
            if h.line().encode("ascii") != line:
                raise ValueError("not canonical")
        except (ValueError, TypeError, UnicodeDecodeError):
            raise LedgerTamperedError(i, f"line {i} of {HEADS} is not a canonical signed tree head") from None
        out.append(h)
    return out


@dataclass
class LogState:
    """A parsed log: rows, their leaf hashes, the root of every prefix, the stored heads."""

    rows: list[Row]
    heads: list[TreeHead]
    leaves: list[bytes] = field(default_factory=list)
    roots: list[bytes] = field(default_factory=list)  # roots[i] = root of the first i + 1 rows

    @classmethod
    def read(cls, directory: str | os.PathLike) -> LogState:
        d = Path(directory)
        rows, lines = _read_rows(d / FILE)
        leaves = [translog.leaf_hash(x) for x in lines]
        return cls(rows, read_heads(d / HEADS), leaves, list(translog.prefix_roots(leaves)))

    @property
    def size(self) -> int:
        return len(self.rows)

    def root(self, size: int | None = None) -> bytes:
        n = self.size if size is None else int(size)
        return self.roots[n - 1] if n else translog.EMPTY_ROOT


def check_rows(rows: list[Row]) -> None:
    """Sequence numbers, links and key fingerprint (the public half of the chain check)."""
    prev = GENESIS
    for i, r in enumerate(rows, start=1):
        if r.seq != i:
            raise LedgerTamperedError(r.seq, f"expected seq {i} (rows missing, duplicated or reordered)")
        if r.prev != prev:
            raise LedgerTamperedError(r.seq, "prev does not match the previous row's mac")
        if r.key_fp != rows[0].key_fp:
            raise LedgerTamperedError(r.seq, "the key fingerprint changes within the log")
        prev = r.mac


def check_heads(st: LogState, pub, all_signatures: bool = False, allow_unsigned_tail: bool = False) -> int:
    """Check the stored heads against the rows; returns how many newest rows have no head yet
    (only with ``allow_unsigned_tail``: the keyed writer signs them; an auditor must refuse)."""
    heads = st.heads
    if len(heads) > st.size:
        raise LedgerRollbackError(st.size + 1, f"{len(heads)} signed tree heads but only {st.size} receipts "
                                               "(receipts deleted or the log truncated)")
    lid = None if pub is None else _log_id(pub)
    prev = ZERO
    for i, h in enumerate(heads, start=1):
        if h.tree_size != i:
            raise LedgerTamperedError(i, f"signed head {i} states tree size {h.tree_size}")
        if lid is not None and h.log_id != lid:
            raise LedgerTamperedError(i, "signed head was made by another key than the given public key")
        if h.prev != prev:
            raise LedgerTamperedError(i, "signed head does not chain to the previous head")
        if bytes.fromhex(h.root_hash) != st.root(i):
            raise LedgerTamperedError(i, "the root recomputed from the receipts differs from the signed head's "
                                         "(a receipt edited, reordered or replaced)")
        if all_signatures and pub is not None and not h.verify(pub):
            raise LedgerTamperedError(i, "signed head's signature does not verify")
        prev = h.digest()
    if heads and pub is not None and not heads[-1].verify(pub):
        raise LedgerTamperedError(len(heads), "the newest signed head's signature does not verify (forged head)")
    unsigned = st.size - len(heads)
    if unsigned and not allow_unsigned_tail:
        raise LedgerTamperedError(len(heads) + 1, f"{unsigned} receipt(s) at the end have no signed tree head "
                                                  "(appended without the signing key; an interrupted append is "
                                                  "signed by the operator's next forgetful command)")
    return unsigned


def _log_id(pub) -> str:
    from pipelines.receipts.signing import log_id

    return log_id(pub)


def check_recorded(st: LogState, size: int, root_hex: str | None, what: str) -> None:
    """The log must extend a state recorded elsewhere: at least ``size`` receipts, and the first
    ``size`` of them hashing to ``root_hex`` (when given)."""
    if size > st.size:
        raise LedgerRollbackError(st.size + 1, f"the log holds {st.size} receipts but {what} recorded {size} "
                                               "(a restored backup or a truncated log; see README, deletion "
                                               "guarantees, for the recovery path)")
    if root_hex is not None and bytes.fromhex(root_hex) != st.root(size):
        raise LedgerRollbackError(size, f"the log's first {size} receipts do not hash to the root {what} recorded "
                                        "(the log was rewritten or replaced by another)")


def check_legacy(rows: list[Row], head_mac: str | None = None, min_count: int | None = None) -> None:
    """The pre-signing auditor checks: at least ``min_count`` receipts, and a row whose MAC is
    ``head_mac`` (equality only: no key needed)."""
    if min_count is not None and len(rows) < int(min_count):
        raise LedgerRollbackError(len(rows) + 1, f"{len(rows)} rows, fewer than the expected {int(min_count)}")
    if head_mac is not None and not any(r.mac == head_mac for r in rows) and not (head_mac == GENESIS and not rows):
        raise LedgerRollbackError(len(rows), "the given head hash is not in the chain (truncated or replaced)")


def check_kept_head(st: LogState, head: TreeHead, pub, what: str = "the kept head") -> dict:
    """A head recorded outside the log (an auditor's copy, the anchor): signed by ``pub``, and the
    log extends it; the consistency proof from it to the log is produced and verified too."""
    if pub is not None and not head.verify(pub):
        raise LedgerTamperedError(head.tree_size, f"{what} is not signed by the log's key")
    check_recorded(st, head.tree_size, head.root_hash, what)
    if head.tree_size:
        proof = translog.Tree(st.leaves).consistency_proof(head.tree_size)
        if not translog.verify_consistency(head.tree_size, st.size, bytes.fromhex(head.root_hash), st.root(), proof):
            raise LedgerRollbackError(head.tree_size, f"no consistency proof from {what} to the log")
    return {"tree_size": head.tree_size, "consistent": True}


# -------------------------------------------------------------------------------- anchors
def anchor_path(ledger_file: str | os.PathLike) -> Path:
    """Where the anchor of the log at ``ledger_file`` lives: ``<config dir>/anchors/<hash>.json``."""
    h = hashlib.sha256(str(Path(ledger_file).resolve()).encode()).hexdigest()[:32]
    return anchors_dir() / f"{h}.json"


def anchored_heads() -> list[TreeHead]:
    """The signed head of every anchor in this configuration (legacy unsigned ones skipped), for
    checking that the configured signing key is the one that signed them."""
    from pipelines.store.keys import kept_logs

    out = []
    for p in kept_logs():
        try:
            a = json.loads(p.read_text(encoding="ascii"))
            out.append(TreeHead.from_json(a["head"]))
        except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
            continue  # legacy or unreadable: read_anchor reports it for its own log
    return out


def read_anchor(ledger_file: str | os.PathLike) -> TreeHead | dict | None:
    """The anchor's signed head; a legacy unsigned anchor as ``{"seq", "head"}``; None if absent."""
    p = anchor_path(ledger_file)
    if not p.is_file():
        return None
    try:
        a = json.loads(p.read_text(encoding="ascii"))
        if isinstance(a.get("head"), dict):
            return TreeHead.from_json(a["head"])
        return {"seq": int(a["seq"]), "head": str(a["head"])}
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise LedgerTamperedError(0, f"the anchor {p} is unreadable ({type(exc).__name__})") from None


def audit(directory: str | os.PathLike, pub, kept: TreeHead | None = None, recorded: dict | None = None,
          all_signatures: bool = False, use_anchor: bool = True) -> dict:
    """Verify the log in ``directory`` with public key ``pub`` only (see the module docstring).

    recorded : ``{"size": int, "root": hex | None, "what": str}`` (a warehouse's record).
    Returns aggregates: ``n_rows``, ``root``, ``head`` (the newest signed head), ``log_id``, and
    the outcome of each recorded state checked."""
    st = LogState.read(directory)
    check_rows(st.rows)
    check_heads(st, pub, all_signatures=all_signatures)
    out: dict[str, Any] = {"n_rows": st.size, "root": st.root().hex(), "log_id": _log_id(pub),
                           "head": st.heads[-1].to_json() if st.heads else None,
                           "signatures_checked": st.size if all_signatures else min(st.size, 1)}
    if use_anchor:
        a = read_anchor(Path(directory) / FILE)
        if isinstance(a, dict):
            raise LedgerTamperedError(a["seq"], "the anchor is not a signed tree head (legacy or forged; the "
                                                "operator's next forgetful command re-signs a genuine one)")
        out["anchor"] = "none" if a is None else f"size {check_kept_head(st, a, pub, 'the anchor')['tree_size']} " \
                                                 "consistent"
    if kept is not None:
        out["kept_head"] = check_kept_head(st, kept, pub)
    if recorded is not None:
        check_recorded(st, int(recorded["size"]), recorded.get("root"), recorded["what"])
        out["recorded"] = {"size": int(recorded["size"]), "consistent": True}
    return out


# -------------------------------------------------------------------------------- proofs
def check_proof_file(path: str | os.PathLike, pub) -> dict:
    """Verify a proof written by ``forgetful receipts prove`` offline, with the public key only:
    an inclusion proof (the receipt line, its index, the audit path and the signed head) or a
    consistency proof (two signed heads and the proof between them)."""
    p = Path(path)
    try:
        d = json.loads(p.read_text(encoding="ascii"))
        kind = d["version"]
        if kind == "forgetful-inclusion-v1":
            if set(d) != {"version", "leaf", "leaf_index", "tree_size", "audit_path", "sth"}:
                raise ValueError("fields")
            sth, path_ = TreeHead.from_json(d["sth"]), [bytes.fromhex(h) for h in d["audit_path"]]
            leaf, index, size = d["leaf"].encode("ascii"), d["leaf_index"], d["tree_size"]
            if type(index) is not int or type(size) is not int:
                raise ValueError("types")
        elif kind == "forgetful-consistency-v1":
            if set(d) != {"version", "first", "second", "proof"}:
                raise ValueError("fields")
            first, second = TreeHead.from_json(d["first"]), TreeHead.from_json(d["second"])
            proof = [bytes.fromhex(h) for h in d["proof"]]
        else:
            raise ValueError("version")
    except FileNotFoundError:
        raise LedgerError(f"proof file {p} does not exist") from None
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeError):
        raise LedgerTamperedError(0, f"{p.name} is not a forgetful proof file") from None
    if kind == "forgetful-inclusion-v1":
        if not sth.verify(pub):
            raise LedgerTamperedError(sth.tree_size, "the proof's signed head is not signed by the given key")
        if size != sth.tree_size:
            raise LedgerTamperedError(size, "the proof's tree size differs from its signed head's")
        try:
            seq = json.loads(leaf)["seq"]
        except (ValueError, KeyError, TypeError):
            seq = None
        if seq != index + 1:
            raise LedgerTamperedError(index + 1, "the receipt's seq does not match its leaf index")
        if not translog.verify_inclusion(index, size, translog.leaf_hash(leaf), path_, bytes.fromhex(sth.root_hash)):
            raise LedgerTamperedError(index + 1, "the audit path does not lead to the signed root (not included)")
        return {"kind": kind, "seq": index + 1, "tree_size": size, "root_hash": sth.root_hash, "verified": True}
    for h, what in ((first, "first"), (second, "second")):
        if not h.verify(pub):
            raise LedgerTamperedError(h.tree_size, f"the {what} signed head is not signed by the given key")
    if not translog.verify_consistency(first.tree_size, second.tree_size, bytes.fromhex(first.root_hash),
                                       bytes.fromhex(second.root_hash), proof):
        raise LedgerRollbackError(first.tree_size, f"the tree of size {first.tree_size} is not a prefix of the tree "
                                                   f"of size {second.tree_size} (fork, rewrite or rollback)")
    return {"kind": kind, "first": first.tree_size, "second": second.tree_size, "verified": True}
