"""The deletion-receipt ledger and forget registry: an append-only, keyed (HMAC) chain of receipts
that lives in its own directory, never inside the (rebuildable) warehouse.

File ``<ledger dir>/receipts.jsonl``, one canonical JSON object per line::

    {"seq": 1, "ts": "...", "kind": "forget_subject", "subject_id_hash": "<hmac>",
     "payload": {...aggregates...}, "key_fp": "<16 hex>", "prev": "<mac of seq-1>", "mac": "<hmac>"}

* ``seq`` counts 1, 2, 3, … without gaps; ``prev`` is the previous row's ``mac`` (64 zeros first);
* ``mac`` = HMAC-SHA256 under the ledger sub-key (:mod:`pipelines.keys`) of the canonical JSON of
  every other field. Without the key no row can be edited, forged, appended or recomputed;
* ``key_fp`` is the key's public fingerprint: a ledger read with a different key is refused
  (:class:`LedgerKeyError`), never silently re-hashed;
* **anchors** against truncation and rollback (which a chain alone cannot see): every append
  also records the head ``(seq, mac)`` in the config directory (beside the key, not beside the
  ledger), and ``verify(head=…, min_count=…)`` checks an auditor's own copy of the head. A
  warehouse also records the head it has applied.

The *registry* is the set of ``subject_id_hash`` values of ``forget_subject`` rows: every build
excludes those subjects at scan time, and every command completes pending erasures first.
Appends are serialised by an exclusive lock on ``<ledger dir>/.lock`` and fsynced before return.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import LedgerError, LedgerKeyError, LedgerTamperedError
from .keys import Keys, config_dir

FILE = "receipts.jsonl"
GENESIS = "0" * 64
LEDGER_ENV = "FORGETFUL_LEDGER_DIR"
FORGET_KIND = "forget_subject"
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
        return canonical_json([self.seq, self.ts, self.kind, self.subject_id_hash, self.payload, self.key_fp,
                               self.prev]).encode("ascii")

    def to_json(self) -> dict:
        return {f: getattr(self, f) for f in _FIELDS}


def default_dir(warehouse: str | os.PathLike) -> Path:
    """``$FORGETFUL_LEDGER_DIR``, else ``<warehouse folder>/forget-registry``."""
    env = os.environ.get(LEDGER_ENV)
    return Path(env).expanduser().resolve() if env else Path(warehouse).resolve().parent / "forget-registry"


class Ledger:
    """One ledger directory under one key. Reading verifies the whole chain every time (a few
    µs per row), so a caller never acts on a tampered registry."""

    def __init__(self, directory: str | os.PathLike, keys: Keys):
        self.dir = Path(directory).resolve()
        self.path = self.dir / FILE
        self.keys = keys

    # -- anchors -------------------------------------------------------------------------
    def _anchor_path(self) -> Path:
        h = hashlib.sha256(str(self.path).encode()).hexdigest()[:32]
        return config_dir() / "anchors" / f"{h}.json"

    def anchor(self) -> dict | None:
        p = self._anchor_path()
        if not p.is_file():
            return None
        try:
            a = json.loads(p.read_text())
            return {"seq": int(a["seq"]), "head": str(a["head"])}
        except (ValueError, KeyError, TypeError) as exc:
            raise LedgerTamperedError(0, f"the head anchor {p} is unreadable ({type(exc).__name__})") from None

    def _write_anchor(self, seq: int, head: str) -> None:
        p = self._anchor_path()
        p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = p.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(canonical_json({"seq": seq, "head": head, "ledger": str(self.path)}))
        os.replace(tmp, p)

    # -- reading -------------------------------------------------------------------------
    def _parse(self) -> list[Row]:
        if not self.path.is_file():
            return []
        out = []
        raw = self.path.read_bytes()
        if raw and not raw.endswith(b"\n"):
            raise LedgerTamperedError(0, "the last line is incomplete (truncated write or edit)")
        for i, line in enumerate(raw.splitlines(), start=1):
            try:
                d = json.loads(line)
                if not isinstance(d, dict) or set(d) != set(_FIELDS):
                    raise ValueError("fields")
                r = Row(int(d["seq"]), str(d["ts"]), str(d["kind"]), str(d["subject_id_hash"]), d["payload"],
                        str(d["key_fp"]), str(d["prev"]), str(d["mac"]))
                if not isinstance(r.payload, dict) or canonical_json(r.to_json()) != line.decode("ascii"):
                    raise ValueError("not canonical")
            except (ValueError, TypeError, UnicodeDecodeError):
                raise LedgerTamperedError(i, "line is not a canonical receipt row") from None
            out.append(r)
        return out

    def verify(self, head: str | None = None, min_count: int | None = None) -> dict:
        """Check every row, the chain, the key, the stored anchor and (optionally) an auditor's
        head hash / minimum count. Returns ``{"n_rows", "head", "key_fp", "anchor"}``; raises
        :class:`LedgerTamperedError` (or :class:`LedgerKeyError` for a different key)."""
        rows = self._parse()
        prev = GENESIS
        fp = self.keys.fingerprint
        for i, r in enumerate(rows, start=1):
            if r.seq != i:
                raise LedgerTamperedError(r.seq, f"expected seq {i} (rows missing, duplicated or reordered)")
            if r.key_fp != fp:
                raise LedgerKeyError(f"receipt {r.seq} was written under key fingerprint {r.key_fp}, the configured key "
                                     f"is {fp}: restore the original key (see README, deletion guarantees)")
            if r.prev != prev:
                raise LedgerTamperedError(r.seq, "prev does not match the previous row's mac")
            if not Keys.equal(self.keys.mac("ledger", r.body()), r.mac):
                raise LedgerTamperedError(r.seq, "mac does not match the row's content (edited or forged)")
            prev = r.mac
        a = self.anchor()
        if a is not None and a["seq"] > 0:
            if len(rows) < a["seq"]:
                raise LedgerTamperedError(len(rows) + 1, f"the ledger holds {len(rows)} rows but its anchor records "
                                                          f"{a['seq']} (rows or the whole ledger deleted)")
            if not Keys.equal(rows[a["seq"] - 1].mac, a["head"]):
                raise LedgerTamperedError(a["seq"], "row does not match the anchored head (ledger replaced or rolled back)")
        if min_count is not None and len(rows) < int(min_count):
            raise LedgerTamperedError(len(rows) + 1, f"{len(rows)} rows, fewer than the expected {int(min_count)}")
        if head is not None and not any(Keys.equal(r.mac, head) for r in rows):
            if not (head == GENESIS and not rows):
                raise LedgerTamperedError(len(rows), "the given head hash is not in the chain (truncated or replaced)")
        return {"n_rows": len(rows), "head": prev, "key_fp": fp,
                "anchor": "none" if a is None else f"seq {a['seq']} matched"}

    def rows(self) -> list[Row]:
        """Verified rows, in order."""
        self.verify()
        return self._parse()

    def registry(self) -> dict[str, int]:
        """Forgotten subjects: subject hash -> receipt seq (verified first)."""
        return {r.subject_id_hash: r.seq for r in self.rows() if r.kind == FORGET_KIND}

    def head(self) -> tuple[int, str]:
        v = self.verify()
        return v["n_rows"], v["head"]

    # -- writing -------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self):
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def append(self, kind: str, subject_id_hash: str, payload: dict, ts: str | None = None) -> Row:
        """Append one receipt (aggregates only in ``payload``); durable (fsynced) on return."""
        if not kind or not isinstance(kind, str):
            raise LedgerError(f"kind must be a non-empty string, got {type(kind).__name__}")
        try:
            canonical_json(payload)
        except (TypeError, ValueError) as exc:
            raise LedgerError(f"receipt payload is not canonical JSON: {exc}") from exc
        with self._locked():
            seq, prev = self.head()
            row = Row(seq + 1, ts or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), kind, str(subject_id_hash),
                      json.loads(canonical_json(payload)), self.keys.fingerprint, prev, "")
            row = Row(**{**row.to_json(), "mac": self.keys.mac("ledger", row.body())})
            line = (canonical_json(row.to_json()) + "\n").encode("ascii")
            new = not self.path.exists()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
            if new:
                dfd = os.open(self.dir, os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
            self._write_anchor(row.seq, row.mac)
        return row

    # -- auditor exports -----------------------------------------------------------------
    def export(self, out_dir: str | os.PathLike) -> dict:
        """Write ``receipt-<seq>.json`` per row and ``head.json``; returns the head record."""
        v = self.verify()
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for r in self._parse():
            (out / f"receipt-{r.seq:06d}.json").write_text(json.dumps(r.to_json(), indent=1, sort_keys=True) + "\n")
        head = {"n_rows": v["n_rows"], "head": v["head"], "key_fp": v["key_fp"],
                "verify": f"forgetful receipts verify --head {v['head']} --min-count {v['n_rows']}"}
        (out / "head.json").write_text(json.dumps(head, indent=1, sort_keys=True) + "\n")
        return head

    def summary(self) -> dict:
        """Aggregates only (no hashes of ids): counts, chain status, head, last deletion time."""
        try:
            v = self.verify()
            rows = self._parse()
            ok, where, reason = True, None, None
        except LedgerTamperedError as exc:
            rows, v, ok, where, reason = [], {"n_rows": 0, "head": None}, False, exc.seq, exc.reason
        by_kind: dict[str, int] = {}
        for r in rows:
            by_kind[r.kind] = by_kind.get(r.kind, 0) + 1
        certified = sum(bool(r.payload.get("certified")) for r in rows)
        return {"count": v["n_rows"], "certified": certified, "by_kind": by_kind, "chain_verified": ok,
                "first_bad_seq": where, "reason": reason, "head": v["head"],
                "last_ts": rows[-1].ts if rows else None}
