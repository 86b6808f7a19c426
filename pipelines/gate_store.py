"""Persisted gate states in the warehouse, so a later ``forgetful forget`` can reach them.

Tables
------
``gate_states(context_id, study, created, C, sigma, n_tokens, state_npz, state_sha256)``
    one row per stored context; ``state_npz`` is :meth:`sv_core.Gate.to_state` saved with
    :func:`numpy.savez` (no pickles), ``state_sha256`` its SHA-256.
``gate_tokens(context_id, token_id, subject_id, stay_id, hour)``
    which patient/stay/hour every live token of a context came from.

Context ids are opaque integers (never derived from a record id), so receipts may name them.
Writers run inside the caller's transaction.
"""
from __future__ import annotations

import hashlib
import io
import time
from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa

from sv_core import Gate

from .errors import GateStoreError

STATES = "gate_states"
TOKENS = "gate_tokens"

DDL = (
    f"CREATE TABLE IF NOT EXISTS {STATES} (context_id BIGINT PRIMARY KEY, study VARCHAR NOT NULL, "
    "created VARCHAR NOT NULL, C DOUBLE NOT NULL, sigma DOUBLE NOT NULL, n_tokens INTEGER NOT NULL, "
    "state_npz BLOB NOT NULL, state_sha256 VARCHAR NOT NULL)",
    f"CREATE TABLE IF NOT EXISTS {TOKENS} (context_id BIGINT NOT NULL, token_id BIGINT NOT NULL, "
    "subject_id BIGINT NOT NULL, stay_id BIGINT NOT NULL, hour INTEGER NOT NULL)",
)


@dataclass
class StoredContext:
    """A gate to store: the gate, and per live token (aligned with ``gate.ids``) its origin.

    token_subject, token_stay, token_hour : (n,) int arrays aligned with ``gate.ids``.
    """

    gate: Gate
    token_subject: np.ndarray
    token_stay: np.ndarray
    token_hour: np.ndarray


def ensure_tables(con: duckdb.DuckDBPyConnection) -> None:
    for ddl in DDL:
        con.execute(ddl)


def has_tables(con: duckdb.DuckDBPyConnection) -> bool:
    names = {r[0] for r in con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()").fetchall()}
    return STATES in names and TOKENS in names


def state_to_npz(state: dict) -> bytes:
    """Serialise :meth:`Gate.to_state` to npz bytes (arrays only, no pickle)."""
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in state.items()})
    return buf.getvalue()


def npz_to_state(blob: bytes) -> dict:
    with np.load(io.BytesIO(bytes(blob)), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def gate_to_blob(g: Gate) -> bytes:
    return state_to_npz(g.to_state())


def blob_to_gate(blob: bytes) -> Gate:
    return Gate.from_state(npz_to_state(blob))


def replace_study(con: duckdb.DuckDBPyConnection, study: str, contexts: list[StoredContext]) -> list[int]:
    """Replace every stored context of ``study`` by ``contexts`` (inside the caller's
    transaction). Returns the new opaque context ids."""
    ensure_tables(con)
    old = [r[0] for r in con.execute(f"SELECT context_id FROM {STATES} WHERE study = ?", [study]).fetchall()]
    if old:
        con.execute(f"DELETE FROM {TOKENS} WHERE context_id IN (SELECT unnest(?::BIGINT[]))", [old])
        con.execute(f"DELETE FROM {STATES} WHERE study = ?", [study])
    start = int(con.execute(f"SELECT coalesce(max(context_id), 0) FROM {STATES}").fetchone()[0]) + 1
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ids = []
    for j, ctx in enumerate(contexts):
        cid = start + j
        g = ctx.gate
        tok = g.ids
        n = tok.size
        for name, arr in (("token_subject", ctx.token_subject), ("token_stay", ctx.token_stay),
                          ("token_hour", ctx.token_hour)):
            if np.asarray(arr).shape != (n,):
                raise GateStoreError(f"{name} has shape {np.shape(arr)}, expected ({n},) (one per live token)")
        blob = gate_to_blob(g)
        con.execute(f"INSERT INTO {STATES} VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [cid, study, created, g.C, g.sigma, int(n), blob, hashlib.sha256(blob).hexdigest()])
        tbl = pa.table({"context_id": pa.array(np.full(n, cid, dtype=np.int64)),
                        "token_id": pa.array(np.asarray(tok, dtype=np.int64)),
                        "subject_id": pa.array(np.asarray(ctx.token_subject, dtype=np.int64)),
                        "stay_id": pa.array(np.asarray(ctx.token_stay, dtype=np.int64)),
                        "hour": pa.array(np.asarray(ctx.token_hour, dtype=np.int32))})
        con.register("_gate_tokens_df", tbl)
        con.execute(f"INSERT INTO {TOKENS} SELECT * FROM _gate_tokens_df")
        con.unregister("_gate_tokens_df")
        ids.append(cid)
    return ids


def load_gate(con: duckdb.DuckDBPyConnection, context_id: int) -> Gate:
    """The stored gate of one context; its checksum is verified first."""
    row = con.execute(f"SELECT state_npz, state_sha256 FROM {STATES} WHERE context_id = ?",
                      [int(context_id)]).fetchone()
    if row is None:
        raise GateStoreError(f"no stored gate state for context {context_id}")
    blob = bytes(row[0])
    if hashlib.sha256(blob).hexdigest() != row[1]:
        raise GateStoreError(f"stored gate state of context {context_id} fails its sha256 check")
    return blob_to_gate(blob)


def update_gate(con: duckdb.DuckDBPyConnection, context_id: int, g: Gate) -> None:
    blob = gate_to_blob(g)
    con.execute(f"UPDATE {STATES} SET state_npz = ?, state_sha256 = ?, n_tokens = ? WHERE context_id = ?",
                [blob, hashlib.sha256(blob).hexdigest(), int(g.n), int(context_id)])


def drop_context(con: duckdb.DuckDBPyConnection, context_id: int) -> None:
    con.execute(f"DELETE FROM {TOKENS} WHERE context_id = ?", [int(context_id)])
    con.execute(f"DELETE FROM {STATES} WHERE context_id = ?", [int(context_id)])


def tokens_of_subject(con: duckdb.DuckDBPyConnection, subject_id: int) -> dict[int, np.ndarray]:
    """context_id -> token ids (ascending) of ``subject_id`` across every stored context."""
    if not has_tables(con):
        return {}
    out: dict[int, list[int]] = {}
    for cid, tid in con.execute(
            f"SELECT context_id, token_id FROM {TOKENS} WHERE subject_id = ? ORDER BY context_id, token_id",
            [int(subject_id)]).fetchall():
        out.setdefault(int(cid), []).append(int(tid))
    return {c: np.asarray(t, dtype=np.int64) for c, t in out.items()}


def context_info(con: duckdb.DuckDBPyConnection, context_id: int) -> tuple[str, int]:
    row = con.execute(f"SELECT study, n_tokens FROM {STATES} WHERE context_id = ?", [int(context_id)]).fetchone()
    if row is None:
        raise GateStoreError(f"gate_tokens names context {context_id} but gate_states has no such row")
    return str(row[0]), int(row[1])


def summary(con: duckdb.DuckDBPyConnection) -> dict:
    """Aggregates: contexts and tokens per study."""
    if not has_tables(con):
        return {}
    return {s: {"contexts": int(c), "tokens": int(t or 0)} for s, c, t in con.execute(
        f"SELECT study, count(*), sum(n_tokens) FROM {STATES} GROUP BY study ORDER BY study").fetchall()}
