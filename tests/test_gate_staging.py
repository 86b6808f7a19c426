"""Gates staged as the worker serialised them (issue 21): the writer stores the worker's bytes,
checked against their digest, without re-validating; a corrupt record is a typed error and
writes nothing; what is stored loads (MAC and full validation) as the gate that was built."""
from __future__ import annotations

import duckdb
import numpy as np
import pytest

from pipelines.errors import GateStoreError
from pipelines.runtime import task_cache
from pipelines.store import gate_store
from pipelines.store.keys import Keys
from sv_core import Gate

KEYS = Keys(b"k" * 32)


def _gate(seed: int = 0, n: int = 40) -> Gate:
    from sv_core import solve

    X = np.random.default_rng(seed).normal(size=(n, 3))
    C, sigma = 1.0 / (0.3 * n), 3.0
    return Gate.from_solution(X, solve(X, C=C, sigma=sigma).alpha, C=C, sigma=sigma)


def _record(g: Gate) -> dict:
    return task_cache.loads(task_cache.dumps(gate_store.staged_record(g)))  # as read back from the cache


def test_a_staged_record_stores_the_same_bytes_and_loads_as_the_built_gate(tmp_path):
    g = _gate()
    rec = _record(g)
    st = gate_store.staged_state(rec, 7, 70, np.arange(g.n))
    import hashlib

    assert st.blob == rec["blob"].tobytes() and st.digest == hashlib.sha256(st.blob).digest()
    want, got = g.to_state(), gate_store.npz_to_state(st.blob)
    assert sorted(got) == sorted(want) and all(np.array_equal(got[k], np.asarray(want[k])) for k in want)
    con = duckdb.connect(str(tmp_path / "w.duckdb"))
    ref = gate_store.StoredContext(g, np.full(g.n, 7), np.full(g.n, 70), np.arange(g.n))
    (c1, m1), = gate_store.append_contexts(con, "s", [st], KEYS, promote_to="t")
    (c2, m2), = gate_store.append_contexts(con, "s", [ref], KEYS, promote_to="t")
    assert gate_store.token_rows(con, c1) == gate_store.token_rows(con, c2)
    back = gate_store.load_gate(con, c1, KEYS)  # MAC and full validation (Gate.from_state) on use
    assert np.array_equal(back.ids, g.ids) and np.array_equal(back.alpha, g.alpha)
    X = np.random.default_rng(1).normal(size=(5, 3))
    assert np.array_equal(back.score(X), g.score(X))
    assert gate_store.unauthentic_contexts(con, KEYS) == {}
    con.close()


@pytest.mark.parametrize("edit", ["flip a blob byte", "digest", "C", "sigma", "ids length", "ids dtype",
                                  "blob dtype", "no digest", "empty"])
def test_a_corrupt_staged_record_is_refused_and_writes_nothing(edit, tmp_path):
    g = _gate()
    rec, hours = _record(g), np.arange(g.n)
    if edit == "flip a blob byte":
        b = rec["blob"].copy()
        b[len(b) // 2] ^= 1
        rec["blob"] = b
    elif edit == "digest":
        rec["sha256"] = "0" * 64
    elif edit == "C":
        rec["C"] = float("nan")
    elif edit == "sigma":
        rec["sigma"] = -1.0
    elif edit == "ids length":
        rec["ids"] = rec["ids"][:-1]
    elif edit == "ids dtype":
        rec["ids"] = rec["ids"].astype(np.float64)
    elif edit == "blob dtype":
        rec["blob"] = rec["blob"].astype(np.int64)
    elif edit == "no digest":
        del rec["sha256"]
    elif edit == "empty":
        rec["ids"], hours = rec["ids"][:0], hours[:0]
    con = duckdb.connect(str(tmp_path / "w.duckdb"))
    gate_store.ensure_tables(con)

    def contexts():
        yield gate_store.staged_state(rec, 7, 70, hours)
    with pytest.raises(GateStoreError, match="staged gate state"):
        gate_store.append_contexts(con, "s", contexts(), KEYS)
    assert con.execute("SELECT count(*) FROM gate_states").fetchone()[0] == 0
    con.close()


def test_a_forged_blob_with_a_matching_digest_is_still_refused_when_used(tmp_path):
    """The digest guards transport; the stored blob is still MAC-checked and validated in full when
    a gate is loaded: an edited alpha with its digest recomputed stores, then never loads."""
    import hashlib

    g = _gate()
    rec = _record(g)
    state = gate_store.npz_to_state(rec["blob"].tobytes())
    state["alpha"] = state["alpha"] * 2
    blob = gate_store.state_to_npz(state)
    rec["blob"], rec["sha256"] = np.frombuffer(blob, dtype=np.uint8), hashlib.sha256(blob).hexdigest()
    con = duckdb.connect(str(tmp_path / "w.duckdb"))
    (cid, _), = gate_store.append_contexts(con, "s", [gate_store.staged_state(rec, 7, 70, np.arange(g.n))], KEYS)
    with pytest.raises(GateStoreError, match="invalid"):
        gate_store.load_gate(con, cid, KEYS)
    con.close()
