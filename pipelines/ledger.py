"""Hash-chained deletion-receipt ledger, stored in the warehouse.

Table ``deletion_receipts(seq, ts, kind, subject_id_hash, payload_json, prev_sha256, sha256)``:

* ``seq`` counts 1, 2, 3, … without gaps;
* ``payload_json`` is canonical JSON (sorted keys, no spaces) with aggregates only;
* ``sha256`` is the SHA-256 of the row's canonical content
  ``json.dumps([seq, ts, kind, subject_id_hash, payload_json, prev_sha256])`` and
  ``prev_sha256`` is the previous row's ``sha256`` (64 zeros for the first row).

Editing any field of a row breaks that row's own hash; deleting or reordering rows breaks
``seq`` contiguity or the ``prev_sha256`` link of the next row. (Truncating the newest rows
leaves a valid shorter chain: keep the head hash printed by ``forgetful receipts verify``
elsewhere to detect that.)

Subject ids are never stored: ``subject_id_hash`` is HMAC-SHA256 of the id under a secret key
(the *salt*), read from ``$FORGETFUL_LEDGER_KEY`` or from ``<warehouse>.ledger-key`` (created
with mode 0600 on first use). Without the key the hash cannot be inverted by enumerating ids.

:func:`append` runs inside the caller's transaction (no BEGIN/COMMIT here) so a deletion and
its receipt commit together or not at all.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from .errors import LedgerError, LedgerTamperedError

TABLE = "deletion_receipts"
GENESIS = "0" * 64
KEY_ENV = "FORGETFUL_LEDGER_KEY"

DDL = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} ("
    "seq BIGINT PRIMARY KEY, ts VARCHAR NOT NULL, kind VARCHAR NOT NULL, "
    "subject_id_hash VARCHAR NOT NULL, payload_json VARCHAR NOT NULL, "
    "prev_sha256 VARCHAR NOT NULL, sha256 VARCHAR NOT NULL)"
)


def canonical_json(obj: Any) -> str:
    """Canonical JSON: sorted keys, no whitespace, ASCII only, finite numbers only."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def row_digest(seq: int, ts: str, kind: str, subject_id_hash: str, payload_json: str, prev_sha256: str) -> str:
    """SHA-256 (hex) of a row's canonical content."""
    content = json.dumps([int(seq), ts, kind, subject_id_hash, payload_json, prev_sha256],
                         separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(content.encode("ascii")).hexdigest()


# ------------------------------------------------------------------------------ subject hashing
def key_path(warehouse: str | os.PathLike) -> Path:
    p = Path(warehouse)
    return p.parent / (p.name + ".ledger-key")


def ledger_key(warehouse: str | os.PathLike | None, create: bool = True) -> bytes:
    """The HMAC key: ``$FORGETFUL_LEDGER_KEY`` if set, else the key file beside the warehouse
    (created with 32 random bytes, mode 0600, when ``create``)."""
    env = os.environ.get(KEY_ENV)
    if env:
        return env.encode()
    if warehouse is None:
        raise LedgerError(f"no ledger key: set ${KEY_ENV} or pass the warehouse path")
    p = key_path(warehouse)
    if p.is_file():
        return p.read_bytes().strip()
    if not create:
        raise LedgerError(f"no ledger key at {p} (and ${KEY_ENV} is unset)")
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_hex(32))
    return p.read_bytes().strip()


def subject_hash(subject_id: int, key: bytes) -> str:
    """HMAC-SHA256 (hex) of ``subject:<id>`` under ``key``."""
    return hmac.new(key, f"subject:{int(subject_id)}".encode(), hashlib.sha256).hexdigest()


# ------------------------------------------------------------------------------ rows
@dataclass(frozen=True)
class LedgerRow:
    seq: int
    ts: str
    kind: str
    subject_id_hash: str
    payload_json: str
    prev_sha256: str
    sha256: str

    @property
    def payload(self) -> dict:
        return json.loads(self.payload_json)


def ensure_table(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(DDL)


def has_table(con: duckdb.DuckDBPyConnection) -> bool:
    return bool(con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = ? AND table_schema = current_schema()",
        [TABLE]).fetchone()[0])


def rows(con: duckdb.DuckDBPyConnection) -> list[LedgerRow]:
    """All ledger rows in ``seq`` order (empty when the table does not exist)."""
    if not has_table(con):
        return []
    return [LedgerRow(*r) for r in con.execute(
        f"SELECT seq, ts, kind, subject_id_hash, payload_json, prev_sha256, sha256 FROM {TABLE} ORDER BY seq"
    ).fetchall()]


def append(con: duckdb.DuckDBPyConnection, kind: str, subject_id_hash: str, payload: dict,
           ts: str | None = None) -> LedgerRow:
    """Append one receipt (inside the caller's transaction). Returns the stored row.

    ``payload`` must hold aggregates only (counts, tolerances, opaque context ids)."""
    if not kind or not isinstance(kind, str):
        raise LedgerError(f"kind must be a non-empty string, got {kind!r}")
    ensure_table(con)
    last = con.execute(f"SELECT seq, sha256 FROM {TABLE} ORDER BY seq DESC LIMIT 1").fetchone()
    seq, prev = (1, GENESIS) if last is None else (int(last[0]) + 1, str(last[1]))
    ts = ts or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        pj = canonical_json(payload)
    except (TypeError, ValueError) as exc:
        raise LedgerError(f"receipt payload is not canonical JSON: {exc}") from exc
    digest = row_digest(seq, ts, kind, subject_id_hash, pj, prev)
    con.execute(f"INSERT INTO {TABLE} VALUES (?, ?, ?, ?, ?, ?, ?)",
                [seq, ts, kind, subject_id_hash, pj, prev, digest])
    return LedgerRow(seq, ts, kind, subject_id_hash, pj, prev, digest)


def verify_rows(rs: list[LedgerRow]) -> str:
    """Check the chain; return the head hash (GENESIS when empty).

    Raises :class:`LedgerTamperedError` at the first row whose seq, link, payload or hash fails."""
    prev = GENESIS
    for expected_seq, r in enumerate(rs, start=1):
        if r.seq != expected_seq:
            raise LedgerTamperedError(r.seq, f"expected seq {expected_seq} (rows missing or reordered)")
        if r.prev_sha256 != prev:
            raise LedgerTamperedError(r.seq, "prev_sha256 does not match the previous row's sha256")
        if row_digest(r.seq, r.ts, r.kind, r.subject_id_hash, r.payload_json, r.prev_sha256) != r.sha256:
            raise LedgerTamperedError(r.seq, "sha256 does not match the row's content")
        try:
            if canonical_json(json.loads(r.payload_json)) != r.payload_json:
                raise LedgerTamperedError(r.seq, "payload_json is not in canonical form")
        except json.JSONDecodeError:
            raise LedgerTamperedError(r.seq, "payload_json is not JSON") from None
        prev = r.sha256
    return prev


def verify_rows_reference(rs: list[LedgerRow]) -> int | None:
    """Slow, obvious reference: recompute every hash from scratch for every prefix; return the
    first bad seq (None when the chain holds)."""
    for i, r in enumerate(rs):
        prev = GENESIS if i == 0 else rs[i - 1].sha256
        content = json.dumps([r.seq, r.ts, r.kind, r.subject_id_hash, r.payload_json, r.prev_sha256],
                             separators=(",", ":"), ensure_ascii=True)
        ok = (r.seq == i + 1 and r.prev_sha256 == prev
              and hashlib.sha256(content.encode("ascii")).hexdigest() == r.sha256)
        if ok:
            try:
                ok = json.dumps(json.loads(r.payload_json), sort_keys=True, separators=(",", ":"),
                                ensure_ascii=True) == r.payload_json
            except json.JSONDecodeError:
                ok = False
        if not ok:
            return r.seq
    return None


def verify(con: duckdb.DuckDBPyConnection) -> dict:
    """Verify the chain on an open connection: ``{"n_rows", "head_sha256"}`` or raise."""
    rs = rows(con)
    return {"n_rows": len(rs), "head_sha256": verify_rows(rs)}


def summary(con: duckdb.DuckDBPyConnection) -> dict:
    """Aggregate fields only: counts by kind, certified counts, chain status (no hashes of ids)."""
    rs = rows(con)
    by_kind: dict[str, int] = {}
    certified = 0
    contexts = 0
    for r in rs:
        by_kind[r.kind] = by_kind.get(r.kind, 0) + 1
        p = r.payload
        certified += int(bool(p.get("certified", False)))
        contexts += len(p.get("contexts", []))
    try:
        head = verify_rows(rs)
        ok, where = True, None
    except LedgerTamperedError as exc:
        head, ok, where = None, False, exc.seq
    return {"count": len(rs), "certified": certified, "by_kind": by_kind, "contexts_touched": contexts,
            "chain_verified": ok, "first_bad_seq": where, "head_sha256": head}
