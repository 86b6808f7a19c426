"""Per-stay study results in the warehouse, so a forget erases them like every other row.

Table ``stay_results(study, stay_id, subject_id, name, value)``: one row per stay and per-stay
value (retention of each policy, ``n``, ``k``, event hours, the solve's certificate fields …; long
format, so a study may add a value without a schema change). It carries ``subject_id`` and
``stay_id``, so :func:`pipelines.store.erasure.rewrite` drops a forgotten patient's rows and
:func:`pipelines.store.warehouse.subjects_present` sees them. Record-level: it never leaves the
warehouse (result files hold aggregates only). :func:`replace` runs inside the caller's
transaction.

:func:`write_study` stores a study's output at the end of a run, in memory that does not grow
with the number of stays: the gates batch by batch under a staging study name (the chunks' batches
joined up to :data:`GROUP_BYTES` of blobs per committed transaction — one transaction holding every
gate would keep them all in memory until its commit), then one short transaction promotes them
(:func:`pipelines.store.gate_store.promote_study`:
old contexts removed, staged ones renamed with MACs computed at staging time) and replaces the
per-stay values. A crash before that commit leaves the study's previous gates and values whole;
the staged contexts it leaves are authentic (a forget decrements them like any other) and the
next run removes them first.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import duckdb
import numpy as np
import pyarrow as pa

from pipelines.errors import StudyInputError
from pipelines.store import gate_store
from pipelines.store.warehouse import in_transaction as transaction

TABLE = "stay_results"
DDL = (f"CREATE TABLE IF NOT EXISTS {TABLE} (study VARCHAR NOT NULL, stay_id BIGINT NOT NULL, "
       "subject_id BIGINT NOT NULL, name VARCHAR NOT NULL, value DOUBLE)")
#: the columns that identify a stay (not stored as values)
ID_COLUMNS = ("stay_id", "subject_id")


def replace(con: duckdb.DuckDBPyConnection, study: str, columns: Mapping[str, np.ndarray]) -> int:
    """Replace every row of ``study`` by ``columns`` (``stay_id``, ``subject_id`` and numeric
    per-stay columns of one length; NaN stored as NULL). Returns the number of stays written."""
    if any(c not in columns for c in ID_COLUMNS):
        raise StudyInputError(f"per-stay columns need {ID_COLUMNS}")
    stay = np.asarray(columns["stay_id"], dtype=np.int64)
    subj = np.asarray(columns["subject_id"], dtype=np.int64)
    names = [c for c in columns if c not in ID_COLUMNS]
    m = stay.size
    for c in names:
        if np.asarray(columns[c]).shape != (m,):
            raise StudyInputError(f"per-stay column {c!r} has shape {np.shape(columns[c])}, expected ({m},)")
    con.execute(DDL)
    con.execute(f"DELETE FROM {TABLE} WHERE study = ?", [study])
    if m == 0 or not names:
        return int(m)
    vals = np.concatenate([np.asarray(columns[c], dtype=np.float64) for c in names])
    tbl = pa.table({"study": pa.array([study] * (m * len(names))),
                    "stay_id": pa.array(np.tile(stay, len(names))),
                    "subject_id": pa.array(np.tile(subj, len(names))),
                    "name": pa.array(np.repeat(np.asarray(names, dtype=object), m)),
                    "value": pa.array(vals, mask=np.isnan(vals))})
    con.register("_stay_results_df", tbl)
    con.execute(f"INSERT INTO {TABLE} SELECT * FROM _stay_results_df")
    con.unregister("_stay_results_df")
    return int(m)


def read(con: duckdb.DuckDBPyConnection, study: str) -> dict[str, np.ndarray]:
    """The per-stay columns of ``study`` (ascending stay id; NULL read back as NaN; ``{}`` when
    the study has no rows)."""
    tables = {r[0] for r in con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()").fetchall()}
    if TABLE not in tables:
        return {}
    d = con.execute(f"SELECT stay_id, subject_id, name, value FROM {TABLE} WHERE study = ? ORDER BY name, stay_id",
                    [study]).fetchnumpy()
    if len(d["stay_id"]) == 0:
        return {}
    name = np.asarray(d["name"], dtype=object)
    stay = np.asarray(d["stay_id"], dtype=np.int64)
    val = np.ma.filled(np.ma.asarray(d["value"]).astype(np.float64), np.nan)
    names = sorted(set(name.tolist()))
    first = name == names[0]
    out: dict[str, np.ndarray] = {"stay_id": stay[first], "subject_id": np.asarray(d["subject_id"],
                                                                                    dtype=np.int64)[first]}
    for c in names:
        sel = name == c
        if not np.array_equal(stay[sel], out["stay_id"]):
            raise StudyInputError(f"stay_results of {study!r}: value {c!r} does not cover the same stays")
        out[c] = val[sel]
    return out


def staging_name(study: str) -> str:
    return f"{study}.staging"


#: staged gate blobs written per transaction (the chunks' batches are joined up to this size): every
#: commit has a fixed cost, and one chunk of small stays holds few blobs
GROUP_BYTES = 32 * 2**20


def grouped(batches: Iterable[list], limit: int = GROUP_BYTES) -> Iterable[list]:
    """The lists of ``batches`` joined in order into lists of at most ``limit`` bytes of staged
    ``.blob`` (a list that alone passes the limit is kept whole; a list with an object that has no
    blob yet, a :class:`gate_store.StoredContext`, is never joined: its size is not known)."""
    group: list = []
    size = 0
    for batch in batches:
        staged = all(isinstance(x, gate_store.StagedState) for x in batch)
        b = sum(len(x.blob) for x in batch) if staged else limit + 1
        if group and size + b > limit:
            yield group
            group, size = [], 0
        group.extend(batch)
        size += b
    if group:
        yield group


def write_study(warehouse, study: str, columns: Mapping[str, np.ndarray],
                context_batches: Callable[[duckdb.DuckDBPyConnection], Iterable[list]] | None = None, *,
                memory_limit: str = "256MB", keys=None) -> int:
    """Store a study's per-stay values and (optionally) its gates (module docstring).

    columns : per-stay columns for :func:`replace`.
    context_batches : ``f(con)`` yielding lists of :class:`pipelines.store.gate_store.StoredContext`
        (it may read the warehouse through ``con``); None: the study stores no gates and its
        stored contexts are left as they are.
    memory_limit : DuckDB's cap on this connection's instance (its buffer pool would otherwise
        keep every written block cached).

    Returns the number of contexts stored.
    """
    if keys is None:
        from pipelines.store.keys import Keys

        keys = Keys.load()
    staged, macs = staging_name(study), {}
    con = duckdb.connect(str(warehouse))
    try:
        con.execute(f"SET memory_limit = '{memory_limit}'")
        if context_batches is not None:
            with transaction(con):
                gate_store.drop_study(con, staged)  # a crashed run's staging, if any
            for ctxs in grouped(context_batches(con), GROUP_BYTES):
                with transaction(con):
                    macs.update(gate_store.append_contexts(con, staged, ctxs, keys, promote_to=study))
        with transaction(con):
            if context_batches is not None:
                gate_store.promote_study(con, staged, study, macs)
            replace(con, study, columns)
    finally:
        con.close()
    return len(macs)
