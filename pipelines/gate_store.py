"""Persisted gate states in the warehouse, so a later ``forgetful forget`` can reach them.

Tables
------
``gate_states(context_id, study, created, C, sigma, n_tokens, state_npz, state_mac)``
    one row per stored context; ``state_npz`` is :meth:`sv_core.Gate.to_state` saved with
    :func:`numpy.savez` (no pickles), ``state_mac`` an HMAC (gate sub-key, :mod:`pipelines.keys`)
    over the context id, study, the blob and the context's token map.
``gate_tokens(context_id, token_id, subject_id, stay_id, hour)``
    which patient/stay/hour every live token of a context came from.

:func:`load_gate` checks the MAC (an edited blob, or a token map edited to hide a patient's
tokens, is :class:`GateStoreError`, never a certified gate) and then
:meth:`sv_core.Gate.from_state`, which validates shapes, finiteness, feasibility and the KKT
residual. Context ids are opaque integers (never derived from a record id), so receipts may name
them. Writers run inside the caller's transaction.
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
    "state_npz BLOB NOT NULL, state_mac VARCHAR NOT NULL)",
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


def token_digest(rows) -> bytes:
    """SHA-256 of a context's token map, rows ``(token_id, subject_id, stay_id, hour)`` in any order."""
    a = np.asarray(sorted((int(t), int(s), int(st), int(h)) for t, s, st, h in rows), dtype=np.int64).reshape(-1, 4)
    return hashlib.sha256(a.tobytes()).digest()


def state_mac(keys, context_id: int, study: str, blob: bytes, token_rows) -> str:
    head = f"{int(context_id)}\0{study}\0".encode()
    return keys.mac("gate", head + hashlib.sha256(bytes(blob)).digest() + token_digest(token_rows))


def _keys(keys):
    if keys is None:
        from .keys import Keys

        return Keys.load()
    return keys


def drop_study(con: duckdb.DuckDBPyConnection, study: str) -> int:
    """Delete every stored context of ``study`` (inside the caller's transaction); returns how many."""
    ensure_tables(con)
    old = [r[0] for r in con.execute(f"SELECT context_id FROM {STATES} WHERE study = ?", [study]).fetchall()]
    if old:
        con.execute(f"DELETE FROM {TOKENS} WHERE context_id IN (SELECT unnest(?::BIGINT[]))", [old])
        con.execute(f"DELETE FROM {STATES} WHERE study = ?", [study])
    return len(old)


def append_contexts(con: duckdb.DuckDBPyConnection, study: str, contexts, keys=None) -> list[int]:
    """Store ``contexts`` (any iterable of :class:`StoredContext`, consumed one at a time) under
    ``study`` beside those already stored (inside the caller's transaction). Returns the new opaque
    context ids."""
    keys = _keys(keys)
    ensure_tables(con)
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
        rows = zip(np.asarray(tok), np.asarray(ctx.token_subject), np.asarray(ctx.token_stay), np.asarray(ctx.token_hour))
        con.execute(f"INSERT INTO {STATES} VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [cid, study, created, g.C, g.sigma, int(n), blob, state_mac(keys, cid, study, blob, rows)])
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


def replace_study(con: duckdb.DuckDBPyConnection, study: str, contexts, keys=None) -> list[int]:
    """Replace every stored context of ``study`` by ``contexts`` (inside the caller's
    transaction). Returns the new opaque context ids."""
    drop_study(con, study)
    return append_contexts(con, study, contexts, keys)


def rename_study(con: duckdb.DuckDBPyConnection, src: str, dst: str, keys=None) -> int:
    """Move every context stored under ``src`` to ``dst`` (their MACs, which bind the study name,
    re-made one context at a time; inside the caller's transaction). A study written in batches
    under a pending name is published this way in one transaction. Returns how many moved."""
    keys = _keys(keys)
    ensure_tables(con)
    ids = [int(r[0]) for r in con.execute(f"SELECT context_id FROM {STATES} WHERE study = ? ORDER BY context_id",
                                          [src]).fetchall()]
    for cid in ids:
        blob, mac = con.execute(f"SELECT state_npz, state_mac FROM {STATES} WHERE context_id = ?", [cid]).fetchone()
        blob, toks = bytes(blob), token_rows(con, cid)
        if not keys.equal(state_mac(keys, cid, src, blob, toks), str(mac)):  # never re-sign an edited context
            raise GateStoreError(f"stored gate state of context {cid} fails its MAC check; not moved to {dst!r}")
        con.execute(f"UPDATE {STATES} SET study = ?, state_mac = ? WHERE context_id = ?",
                    [dst, state_mac(keys, cid, dst, blob, toks), cid])
    return len(ids)


def token_rows(con: duckdb.DuckDBPyConnection, context_id: int) -> list[tuple[int, int, int, int]]:
    return [tuple(int(x) for x in r) for r in con.execute(
        f"SELECT token_id, subject_id, stay_id, hour FROM {TOKENS} WHERE context_id = ? ORDER BY token_id",
        [int(context_id)]).fetchall()]


def load_gate(con: duckdb.DuckDBPyConnection, context_id: int, keys=None) -> Gate:
    """The stored gate of one context: MAC checked, then validated by ``Gate.from_state``; its
    ids must equal the context's token map."""
    from sv_core import GateError

    keys = _keys(keys)
    row = con.execute(f"SELECT state_npz, state_mac, study FROM {STATES} WHERE context_id = ?",
                      [int(context_id)]).fetchone()
    if row is None:
        raise GateStoreError(f"no stored gate state for context {context_id}")
    blob, study = bytes(row[0]), str(row[2])
    toks = token_rows(con, context_id)
    if not keys.equal(state_mac(keys, context_id, study, blob, toks), str(row[1])):
        raise GateStoreError(f"stored gate state of context {context_id} fails its MAC check "
                             "(blob or token map edited, or written under another key)")
    try:
        g = blob_to_gate(blob)
    except (GateError, ValueError, KeyError, OSError) as exc:
        raise GateStoreError(f"stored gate state of context {context_id} is invalid ({type(exc).__name__}: {exc})") from None
    except Exception as exc:  # any other failure to parse stored bytes (a bad zip, a short read)
        raise GateStoreError(f"stored gate state of context {context_id} is invalid ({type(exc).__name__})") from None
    if sorted(int(i) for i in g.ids) != [t[0] for t in toks]:
        raise GateStoreError(f"stored gate state of context {context_id} does not match its token map")
    return g


def unauthentic_contexts(con: duckdb.DuckDBPyConnection, keys=None) -> dict[int, str]:
    """Every stored context whose MAC does not verify over its blob and token map (or whose token
    map names no stored state): context id -> reason. MACs only, no gate is loaded. A forget
    removes such a context whole, because an edited token map could hide a patient's tokens
    from :func:`tokens_of_subject`."""
    if not has_tables(con):
        return {}
    keys = _keys(keys)
    out: dict[int, str] = {}
    states = {int(c): (bytes(b), str(m), str(st)) for c, b, m, st in con.execute(
        f"SELECT context_id, state_npz, state_mac, study FROM {STATES}").fetchall()}
    for (cid,) in con.execute(f"SELECT DISTINCT context_id FROM {TOKENS}").fetchall():
        if int(cid) not in states:
            out[int(cid)] = "the token map names a context with no stored state"
    for cid, (blob, mac, study) in states.items():
        if not keys.equal(state_mac(keys, cid, study, blob, token_rows(con, cid)), mac):
            out[cid] = "fails its MAC check (blob or token map edited, or written under another key)"
    return out


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
