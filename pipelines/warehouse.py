"""The warehouse handle, and the warehouse facts the flows need.

:class:`Warehouse` is the one seam every command goes through: ``Warehouse.open(path)`` takes the
writer lock (:mod:`pipelines.locking`), loads the key (:mod:`pipelines.keys`) and the forget
registry (:mod:`pipelines.ledger`), removes stale temporary files of killed processes, and
*completes any pending erasure* (a forget that died after its receipt was committed) before the
caller sees a single row. Inside the block, tasks still receive the warehouse *path* and its
*content hash* (never DataFrames); the hash keys their cached results.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

import duckdb

from . import locking, runs_registry
from .errors import WarehouseMissingError

META = "forgetful_meta"


def cache_dir(warehouse: str | os.PathLike) -> Path:
    """The task cache of a warehouse: ``.<name>.cache`` beside it (located from the warehouse,
    never from the current directory), removed by every forget."""
    p = Path(warehouse).resolve()
    return p.parent / f".{p.name}.cache"


def subjects_present(con) -> set[int]:
    """Every subject id held by any table of the warehouse (connection ``con``)."""
    out: set[int] = set()
    for (t,) in con.execute("SELECT table_name FROM duckdb_columns() WHERE column_name = 'subject_id' "
                            "AND schema_name = current_schema() AND database_name = current_database()").fetchall():
        out.update(int(r[0]) for r in con.execute(f"SELECT DISTINCT subject_id FROM {t}").fetchall() if r[0] is not None)
    return out


def read_meta(warehouse: str | os.PathLike) -> dict[str, str]:
    """Every key of the warehouse's meta table (empty when it has none)."""
    con = duckdb.connect(str(warehouse), read_only=True)
    try:
        if META not in table_names(con):
            return {}
        return {str(k): str(v) for k, v in con.execute(f"SELECT key, value FROM {META}").fetchall()}
    finally:
        con.close()


def check_key_location(warehouse: Path, ledger_dir: Path, meta: dict[str, str]) -> None:
    """No key file beside the warehouse or inside its ledger, runs or export folders
    (:func:`pipelines.keys.check_location`)."""
    import json

    from .keys import check_location, key_files

    dirs = runs_registry.resolve(runs_registry.load(meta.get("runs_dirs")), warehouse.parent)
    dirs += [Path(d) for key in ("exports", "meds_exports") for d in json.loads(meta.get(key) or "[]")]
    check_location(key_files(), warehouse, [ledger_dir, *dirs])


def put_meta(con, key: str, value: str) -> None:
    con.execute(f"CREATE TABLE IF NOT EXISTS {META} (key VARCHAR PRIMARY KEY, value VARCHAR)")
    con.execute(f"INSERT OR REPLACE INTO {META} VALUES (?, ?)", [key, value])


def get_meta(con, key: str) -> str | None:
    if META not in table_names(con):
        return None
    row = con.execute(f"SELECT value FROM {META} WHERE key = ?", [key]).fetchone()
    return None if row is None else str(row[0])


class Warehouse:
    """An open warehouse: path, key, ledger (forget registry), lock. Use :meth:`open`.

    Attributes
    ----------
    path : absolute path of the DuckDB file (may not exist yet for a build).
    keys : :class:`pipelines.keys.Keys`
    ledger : :class:`pipelines.ledger.Ledger`
    completed : subject hashes whose pending erasure this open completed.
    """

    def __init__(self, path: Path, keys, ledger):
        self.path = path
        self.keys = keys
        self.ledger = ledger
        self.completed: dict[str, int] = {}

    @classmethod
    @contextlib.contextmanager
    def open(cls, path: str | os.PathLike, *, write: bool = True, must_exist: bool = True,
             ledger_dir: str | os.PathLike | None = None, wait: float | None = None,
             reconcile: bool = True) -> Iterator["Warehouse"]:
        """Lock (exclusive when ``write``), clean stale temporaries, complete pending erasures."""
        from . import ledger as ledger_mod
        from .keys import Keys
        from .safe_io import refuse_link

        refuse_link(Path(path).absolute(), "warehouse")  # resolve() below would follow it
        p = Path(path).resolve()
        refuse_link(p.parent / (p.name + ".wal"), "warehouse WAL")
        if must_exist:
            require(p)
        led_dir = Path(ledger_dir or ledger_mod.default_dir(p)).resolve()
        with locking.hold(p, exclusive=write, wait=wait):
            meta = read_meta(p) if p.is_file() else {}
            check_key_location(p, led_dir, meta)  # before a key is read or created
            keys = Keys.load()
            led = ledger_mod.Ledger(led_dir, keys)
            w = cls(p, keys, led)
            led.check_recorded(meta, f"the warehouse {p.name}")  # no rollback: nothing is touched
            if write:
                locking.clean_stale(p)
                led.complete()  # sign receipts an interrupted append left without a signed head
            if reconcile and p.is_file():
                if write:
                    from .forget import complete_pending

                    w.completed = complete_pending(w)
                else:
                    led.verify()
            yield w

    def connect(self, read_only: bool = False) -> duckdb.DuckDBPyConnection:
        return duckdb.connect(str(require(self.path)), read_only=read_only)

    @property
    def cache_dir(self) -> Path:
        return cache_dir(self.path)

    def present_registered(self, con=None) -> dict[int, str]:
        """subject id -> hash, for subjects in this warehouse that the registry says are forgotten."""
        reg = self.ledger.registry()
        if not reg or not self.path.is_file():
            return {}
        own = con is None
        con = con or self.connect(read_only=True)
        try:
            out = {}
            for s in subjects_present(con):
                h = self.keys.subject_hash(s)
                if h in reg:
                    out[s] = h
            return out
        finally:
            if own:
                con.close()

    def forgotten_stays(self) -> set[str]:
        """Keyed hashes of every stay a forget receipt names (payload ``stay_id_hashes``)."""
        from .ledger import FORGET_KIND

        return {h for r in self.ledger.rows() if r.kind == FORGET_KIND for h in r.payload.get("stay_id_hashes", [])}

    def exclusion(self) -> ForgetExclusion:
        """Scan-time filter for :func:`cohort.build.build_warehouse`: registered (forgotten)
        subjects, and the stays their receipts name (whoever the source lists them under now)."""
        return ForgetExclusion(self.keys, set(self.ledger.registry()), self.forgotten_stays())

    def ledger_meta(self) -> dict[str, str]:
        """The log state this warehouse records (size, newest MAC, Merkle root)."""
        return self.ledger.record()

    def record_ledger(self) -> None:
        """Record the current log state in the meta table (the warehouse reflects every receipt)."""
        con = self.connect()
        try:
            con.execute(f"CREATE TABLE IF NOT EXISTS {META} (key VARCHAR PRIMARY KEY, value VARCHAR)")
            for k, v in self.ledger_meta().items():
                con.execute(f"INSERT OR REPLACE INTO {META} VALUES (?, ?)", [k, v])
        finally:
            con.close()

    def _remember(self, key: str, path: str | os.PathLike) -> None:
        """Add a resolved path to the JSON list ``key`` of the warehouse's meta table."""
        import json

        d = str(Path(path).resolve())
        con = self.connect()
        try:
            con.execute(f"CREATE TABLE IF NOT EXISTS {META} (key VARCHAR PRIMARY KEY, value VARCHAR)")
            cur = json.loads(get_meta(con, key) or "[]")
            if d not in cur:
                con.execute(f"INSERT OR REPLACE INTO {META} VALUES (?, ?)", [key, json.dumps(sorted(cur + [d]))])
        finally:
            con.close()

    def _remembered(self, key: str) -> list[Path]:
        import json

        if not self.path.is_file():
            return []
        con = self.connect(read_only=True)
        try:
            return [Path(d) for d in json.loads(get_meta(con, key) or "[]")]
        finally:
            con.close()

    def register_runs_dir(self, runs_dir: str | os.PathLike) -> None:
        """Remember a runs directory that holds results of this warehouse (so a forget can mark
        them stale and rewrite their ledger card, wherever it is run from).

        Runs folders are registered by identity (:mod:`pipelines.runs_registry`): the id in the
        folder's ``.forgetful-runs-id`` plus its path relative to the warehouse, so a moved
        folder is still found and a copy is a folder of its own."""
        con = self.connect()
        try:
            entries = runs_registry.load(get_meta(con, "runs_dirs"))
            new = runs_registry.register(entries, runs_dir, self.path.parent)
            if new != entries:
                put_meta(con, "runs_dirs", runs_registry.dump(new))
        finally:
            con.close()

    def runs_registry(self) -> list[dict]:
        """The stored registrations (for :func:`cohort build <pipelines.flows.clinical_cohort.build_task>`
        to carry over into a rebuilt warehouse with :meth:`restore_runs_registry`)."""
        if not self.path.is_file():
            return []
        con = self.connect(read_only=True)
        try:
            return runs_registry.load(get_meta(con, "runs_dirs"))
        finally:
            con.close()

    def restore_runs_registry(self, entries: list[dict]) -> None:
        con = self.connect()
        try:
            put_meta(con, "runs_dirs", runs_registry.dump(entries))
        finally:
            con.close()

    def runs_dirs(self) -> list[Path]:
        """The registered runs folders that exist now, each found by its id (never a copy of one)."""
        return runs_registry.resolve(self.runs_registry(), self.path.parent)

    def register_export(self, folder: str | os.PathLike, fmt: str = "parquet") -> None:
        """Remember a folder ``forgetful export`` wrote record-level Parquet (``fmt="meds"``: a
        MEDS dataset) into; a forget erases the patient from it too (:mod:`pipelines.exports`)."""
        self._remember("meds_exports" if fmt == "meds" else "exports", folder)

    def export_dirs(self) -> list[Path]:
        """The registered export folders: Parquet exports, then MEDS exports (typed
        :class:`pipelines.exports.MedsFolder`, so the erasure knows which files are its own)."""
        from .exports import MedsFolder

        return self._remembered("exports") + [MedsFolder(p) for p in self._remembered("meds_exports")]


class ForgetExclusion:
    """The forget registry as :func:`cohort.build.exclude_stays` reads it: called on an int64
    array of subject ids, a boolean mask of forgotten subjects; :meth:`stays` the same for stay
    ids (keyed hashes compared; no id is stored)."""

    def __init__(self, keys, subject_hashes: set[str], stay_hashes: set[str]):
        self._keys, self._subjects, self._stays = keys, subject_hashes, stay_hashes

    def __call__(self, subject_ids):
        import numpy as np

        ids = np.asarray(subject_ids, dtype=np.int64)
        return np.fromiter((self._keys.subject_hash(int(s)) in self._subjects for s in ids), dtype=bool,
                           count=ids.size)

    def stays(self, stay_ids):
        import numpy as np

        ids = np.asarray(stay_ids, dtype=np.int64)
        return np.fromiter((self._keys.stay_hash(int(s)) in self._stays for s in ids), dtype=bool, count=ids.size)


def require(warehouse: str | os.PathLike) -> Path:
    p = Path(warehouse)
    if not p.is_file():
        raise WarehouseMissingError.at(p)
    return p


def table_names(con) -> set[str]:
    return {r[0] for r in con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()").fetchall()}


def content_hash(warehouse: str | os.PathLike) -> str:
    """The stored content hash (``build_info``), recomputed when absent."""
    p = require(warehouse)
    con = duckdb.connect(str(p), read_only=True)
    try:
        if "build_info" in table_names(con):
            row = con.execute("SELECT value FROM build_info WHERE key = 'content_hash'").fetchone()
            if row is not None:
                return str(row[0])
        from cohort.build import content_hash as compute

        return compute(con)
    finally:
        con.close()


def set_data_kind(warehouse: str | os.PathLike, kind: str) -> None:
    """Record what the warehouse holds ("demo", "synthetic", "mimic") for the report."""
    con = duckdb.connect(str(require(warehouse)))
    try:
        con.execute(f"CREATE TABLE IF NOT EXISTS {META} (key VARCHAR PRIMARY KEY, value VARCHAR)")
        con.execute(f"INSERT OR REPLACE INTO {META} VALUES ('data_kind', ?)", [kind])
    finally:
        con.close()


def data_kind(warehouse: str | os.PathLike) -> str:
    """"demo" | "synthetic" | "mimic" (from :func:`set_data_kind`, else from the build source)."""
    con = duckdb.connect(str(require(warehouse)), read_only=True)
    try:
        t = table_names(con)
        if META in t:
            row = con.execute(f"SELECT value FROM {META} WHERE key = 'data_kind'").fetchone()
            if row is not None:
                return str(row[0])
        if "build_info" in t:
            import json

            row = con.execute("SELECT value FROM build_info WHERE key = 'params'").fetchone()
            if row is not None:
                src = json.loads(row[0]).get("source")
                return "demo" if src == "demo" else "mimic"
        return "mimic"
    finally:
        con.close()


def stays(warehouse: str | os.PathLike, split: str | None = None) -> list[tuple[int, int, str, int]]:
    """(stay_id, subject_id, split, n_hours) ascending by stay_id (kept in memory, never logged)."""
    con = duckdb.connect(str(require(warehouse)), read_only=True)
    try:
        q = "SELECT stay_id, subject_id, split, n_hours FROM cohort_stays"
        args = []
        if split is not None:
            q += " WHERE split = ?"
            args.append(split)
        return [(int(a), int(b), str(c), int(d)) for a, b, c, d in con.execute(q + " ORDER BY stay_id", args).fetchall()]
    finally:
        con.close()


@contextlib.contextmanager
def in_transaction(con: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    """``BEGIN`` … ``COMMIT`` on an open connection; ``ROLLBACK`` on any error."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield con
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


@contextlib.contextmanager
def transaction(warehouse: str | os.PathLike) -> Iterator[duckdb.DuckDBPyConnection]:
    """A read-write connection inside one transaction: COMMIT on success, ROLLBACK on any error."""
    con = duckdb.connect(str(warehouse))
    try:
        with in_transaction(con):
            yield con
    finally:
        con.close()
