"""Persisted gate states in the warehouse, so a later ``forgetful forget`` can reach them.

Tables
------
``gate_states(context_id, study, created, C, sigma, n_tokens, state_npz, state_mac)``
    one row per stored context; ``state_npz`` is :meth:`sv_core.Gate.to_state` saved with
    :func:`numpy.savez` (no pickles), ``state_mac`` an HMAC (gate sub-key, :mod:`pipelines.store.keys`)
    over the context id, study, the blob and the context's token map.
``gate_tokens(context_id, token_id, subject_id, stay_id, hour)``
    which patient/stay/hour every live token of a context came from.

:func:`load_gate` checks the MAC (an edited blob, or a token map edited to hide a patient's
tokens, is :class:`GateStoreError`, never a certified gate) and then
:meth:`sv_core.Gate.from_state`, which validates shapes, finiteness, feasibility and the KKT
residual. Context ids are opaque integers (never derived from a record id), so receipts may name
them. Writers run inside the caller's transaction; a study written in batches stages its
contexts (:func:`append_contexts`) and publishes them in one short transaction
(:func:`promote_study`); a gate validated on a worker travels to the writer already serialised
(:func:`staged_record`).
"""
from __future__ import annotations

import hashlib
import io
import time
from collections.abc import Iterable
from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa

from pipelines.errors import GateStoreError
from sv_core import Gate

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


@dataclass
class StagedState:
    """A gate already serialised and validated where it was built (:func:`staged_state`), to store
    as it is: the npz ``blob`` (:func:`gate_to_blob`), its SHA-256 ``digest``, ``C``, ``sigma``,
    the live token ``ids`` (n,) and per token its origin (token_subject, token_stay, token_hour:
    (n,) int arrays aligned with ``ids``)."""

    blob: bytes
    digest: bytes
    C: float
    sigma: float
    ids: np.ndarray
    token_subject: np.ndarray
    token_stay: np.ndarray
    token_hour: np.ndarray


def staged_record(g: Gate) -> dict:
    """``g`` serialised for :func:`staged_state` (on the worker that built and validated it):
    ``{"blob": (b,) uint8, "sha256": hex, "C", "sigma", "ids": (n,) int64}`` — arrays and
    numbers only (the task cache's JSON, no pickle).

    :func:`staged_state` on the writer's side checks the digest and the fields (a corrupt record is
    :class:`GateStoreError`) without building a :class:`sv_core.Gate` — the writer stores the bytes
    the worker validated instead of re-validating every gate serially. :func:`load_gate` still
    validates a stored blob in full when it is used. (:func:`append_contexts` with ``promote_to``
    computes each context's MAC under the final name, so :func:`promote_study` re-reads no blob.)
    """
    blob = gate_to_blob(g)
    return {"blob": np.frombuffer(blob, dtype=np.uint8), "sha256": hashlib.sha256(blob).hexdigest(),
            "C": float(g.C), "sigma": float(g.sigma), "ids": np.asarray(g.ids, dtype=np.int64)}


def staged_state(rec: dict, subject_id: int, stay_id: int, hours) -> StagedState:
    """A :func:`staged_record` read back by the writer: the blob's SHA-256 must equal the recorded
    one, ``C``/``sigma`` be finite and positive, ``ids`` and ``hours`` be (n,) integer arrays of one
    length (n >= 1) — else :class:`GateStoreError` (nothing is written). Cheap: no gate is built;
    the record's source (the authenticated task cache) vouches for who wrote it."""
    try:
        blob = np.asarray(rec["blob"])
        if blob.dtype != np.uint8 or blob.ndim != 1:
            raise ValueError("the blob is not a byte array")
        data = blob.tobytes()
        digest = hashlib.sha256(data).digest()
        if digest.hex() != str(rec["sha256"]):
            raise ValueError("the blob does not match its SHA-256")
        C, sigma = float(rec["C"]), float(rec["sigma"])
        if not (np.isfinite(C) and np.isfinite(sigma) and C > 0 and sigma > 0):
            raise ValueError("C and sigma must be finite and positive")
        ids, hour = np.asarray(rec["ids"]), np.asarray(hours)
        if ids.ndim != 1 or ids.dtype.kind not in "iu" or hour.dtype.kind not in "iu" or hour.shape != ids.shape \
                or ids.size == 0:
            raise ValueError("ids and hours must be one non-empty integer array each, of one length")
    except (KeyError, TypeError, ValueError) as exc:
        raise GateStoreError(f"staged gate state of a stay is invalid ({exc})") from None
    n = ids.size
    return StagedState(data, digest, C, sigma, ids.astype(np.int64), np.full(n, int(subject_id), dtype=np.int64),
                       np.full(n, int(stay_id), dtype=np.int64), hour.astype(np.int64))


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


def token_digest_arrays(token, subject, stay, hour) -> bytes:
    """:func:`token_digest` of the rows given as four aligned integer arrays (vectorised; the
    same bytes: rows sorted lexicographically, as int64)."""
    a = np.column_stack([np.asarray(x, dtype=np.int64).reshape(-1) for x in (token, subject, stay, hour)])
    a = a[np.lexsort(a.T[::-1])]
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).digest()


def state_mac(keys, context_id: int, study: str, blob: bytes, token_rows) -> str:
    return _mac(keys, context_id, study, hashlib.sha256(bytes(blob)).digest(), token_digest(token_rows))


def _mac(keys, context_id: int, study: str, blob_digest: bytes, tokens_digest: bytes) -> str:
    head = f"{int(context_id)}\0{study}\0".encode()
    return keys.mac("gate", head + blob_digest + tokens_digest)


def _keys(keys):
    if keys is None:
        from pipelines.store.keys import Keys

        return Keys.load()
    return keys


def drop_study(con: duckdb.DuckDBPyConnection, study: str) -> int:
    """Delete every stored context of ``study`` (states and token maps; inside the caller's
    transaction). Returns how many contexts were removed."""
    ensure_tables(con)
    old = [r[0] for r in con.execute(f"SELECT context_id FROM {STATES} WHERE study = ?", [study]).fetchall()]
    if old:
        con.execute(f"DELETE FROM {TOKENS} WHERE context_id IN (SELECT unnest(?::BIGINT[]))", [old])
        con.execute(f"DELETE FROM {STATES} WHERE study = ?", [study])
    return len(old)


def append_contexts(con: duckdb.DuckDBPyConnection, study: str, contexts: Iterable[StoredContext | StagedState],
                    keys=None, *, promote_to: str | None = None) -> list[tuple[int, str | None]]:
    """Store ``contexts`` (any iterable of :class:`StoredContext`, or of :class:`StagedState`: its
    blob stored as it is, consumed one at a time) under
    ``study`` beside the ones already there (inside the caller's transaction), with new opaque
    context ids above every existing one. The call's rows are inserted together, so its memory is
    that of the call's serialised states: pass a batch at a time.

    promote_to : also compute each context's MAC under this other study name, for a later
        :func:`promote_study` (a staged study renamed in one short transaction).

    Returns ``[(context_id, MAC under promote_to or None)]``.
    """
    keys = _keys(keys)
    ensure_tables(con)
    # fetchall: a result left open by fetchone blocks the register() below
    start = int(con.execute(f"SELECT coalesce(max(context_id), 0) FROM {STATES}").fetchall()[0][0]) + 1
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    states: dict[str, list] = {c: [] for c in ("context_id", "C", "sigma", "n_tokens", "state_npz", "state_mac")}
    tokens: dict[str, list] = {c: [] for c in ("context_id", "token_id", "subject_id", "stay_id", "hour")}
    ids: list[tuple[int, str | None]] = []
    for j, ctx in enumerate(contexts):
        cid = start + j
        staged = isinstance(ctx, StagedState)
        tok = np.asarray(ctx.ids if staged else ctx.gate.ids, dtype=np.int64)
        C, sigma = (ctx.C, ctx.sigma) if staged else (ctx.gate.C, ctx.gate.sigma)
        n = tok.size
        for name, arr in (("token_subject", ctx.token_subject), ("token_stay", ctx.token_stay),
                          ("token_hour", ctx.token_hour)):
            if np.asarray(arr).shape != (n,):
                raise GateStoreError(f"{name} has shape {np.shape(arr)}, expected ({n},) (one per live token)")
        subj, stay, hour = (np.asarray(a, dtype=np.int64) for a in (ctx.token_subject, ctx.token_stay, ctx.token_hour))
        blob = ctx.blob if staged else gate_to_blob(ctx.gate)
        bd = ctx.digest if staged else hashlib.sha256(blob).digest()
        td = token_digest_arrays(tok, subj, stay, hour)
        for c, v in (("context_id", cid), ("C", C), ("sigma", sigma), ("n_tokens", int(n)), ("state_npz", blob),
                     ("state_mac", _mac(keys, cid, study, bd, td))):
            states[c].append(v)
        for c, v in (("context_id", np.full(n, cid, dtype=np.int64)), ("token_id", tok), ("subject_id", subj),
                     ("stay_id", stay), ("hour", hour.astype(np.int32))):
            tokens[c].append(v)
        ids.append((cid, None if promote_to is None else _mac(keys, cid, promote_to, bd, td)))
    k = len(ids)
    if k == 0:
        return []
    st = pa.table({"context_id": pa.array(states["context_id"], type=pa.int64()),
                   "study": pa.array([study] * k, type=pa.string()),
                   "created": pa.array([created] * k, type=pa.string()),
                   "C": pa.array(states["C"], type=pa.float64()), "sigma": pa.array(states["sigma"], type=pa.float64()),
                   "n_tokens": pa.array(states["n_tokens"], type=pa.int32()),
                   "state_npz": pa.array(states["state_npz"], type=pa.binary()),
                   "state_mac": pa.array(states["state_mac"], type=pa.string())})
    tt = pa.table({c: pa.array(np.concatenate(v)) for c, v in tokens.items()})
    con.register("_gate_states_df", st)
    con.register("_gate_tokens_df", tt)
    try:
        con.execute(f"INSERT INTO {STATES} SELECT * FROM _gate_states_df")
        con.execute(f"INSERT INTO {TOKENS} SELECT * FROM _gate_tokens_df")
    finally:
        con.unregister("_gate_states_df")
        con.unregister("_gate_tokens_df")
    return ids


def replace_study(con: duckdb.DuckDBPyConnection, study: str, contexts: Iterable[StoredContext],
                  keys=None) -> list[int]:
    """Replace every stored context of ``study`` by ``contexts`` (inside the caller's
    transaction). Returns the new opaque context ids."""
    drop_study(con, study)
    return [cid for cid, _ in append_contexts(con, study, contexts, keys)]


def promote_study(con: duckdb.DuckDBPyConnection, staged: str, study: str, macs: dict[int, str]) -> int:
    """Replace ``study`` by the contexts staged under ``staged`` (inside the caller's transaction):
    the old contexts of ``study`` are removed and every staged context is renamed, its MAC
    replaced by the one :func:`append_contexts` computed for ``study`` (``macs``: context id ->
    MAC; every staged context must have one, else :class:`GateStoreError` and the caller's
    transaction is rolled back). Returns the number of contexts promoted. The blobs are not
    touched, so the transaction stays small whatever the number of contexts."""
    ensure_tables(con)
    staged_ids = sorted(int(r[0]) for r in con.execute(
        f"SELECT context_id FROM {STATES} WHERE study = ?", [staged]).fetchall())
    if staged_ids != sorted(int(c) for c in macs):
        raise GateStoreError(f"the contexts staged as {staged!r} do not match the MACs computed for {study!r}; "
                             "nothing promoted")
    drop_study(con, study)
    if staged_ids:
        con.register("_gate_promote_df", pa.table({"context_id": pa.array(staged_ids, type=pa.int64()),
                                                    "mac": pa.array([macs[c] for c in staged_ids])}))
        con.execute(f"UPDATE {STATES} SET study = ?, state_mac = p.mac FROM _gate_promote_df p "
                    f"WHERE {STATES}.context_id = p.context_id AND {STATES}.study = ?", [study, staged])
        con.unregister("_gate_promote_df")
    return len(staged_ids)


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
        raise GateStoreError(f"stored gate state of context {context_id} is invalid "
                             f"({type(exc).__name__}: {exc})") from None
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
