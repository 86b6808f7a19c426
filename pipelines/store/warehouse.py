"""The warehouse handle, and the warehouse facts the flows need.

:class:`Warehouse` is the one seam every command goes through: ``Warehouse.open(path)`` takes the
writer lock (:mod:`pipelines.store.locking`), loads the key (:mod:`pipelines.store.keys`) and the forget
registry (:mod:`pipelines.receipts.ledger`), removes stale temporary files of killed processes, and
*completes any pending erasure* (a forget that died after its receipt was committed) before the
caller sees a single row. Inside the block, tasks still receive the warehouse *path* and its
*content hash* (never DataFrames); the hash keys their cached results.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import duckdb

from pipelines.store import locking, runs_registry
from pipelines.store.warehouse_files import (
    META,
    cache_dir,
    content_hash,
    data_kind,
    get_meta,
    in_transaction,
    put_meta,
    read_meta,
    require,
    set_data_kind,
    stays,
    subjects_present,
    table_names,
    transaction,
)

# the warehouse facts of pipelines.store.warehouse_files are part of this module's public API
__all__ = ["META", "ForgetExclusion", "Warehouse", "cache_dir", "check_key_location", "content_hash", "data_kind",
           "get_meta", "in_transaction", "put_meta", "read_meta", "require", "set_data_kind", "stays",
           "subjects_present", "table_names", "transaction"]

def check_key_location(warehouse: Path, ledger_dir: Path, meta: dict[str, str]) -> None:
    """No key file beside the warehouse or inside its ledger, runs or export folders
    (:func:`pipelines.store.keys.check_location`)."""
    import json

    from pipelines.store.keys import check_location, key_files

    dirs = runs_registry.resolve(runs_registry.load(meta.get("runs_dirs")), warehouse.parent)
    dirs += [Path(d) for key in ("exports", "meds_exports") for d in json.loads(meta.get(key) or "[]")]
    check_location(key_files(), warehouse, [ledger_dir, *dirs])


class Warehouse:
    """An open warehouse: path, key, ledger (forget registry), lock. Use :meth:`open`.

    Attributes
    ----------
    path : absolute path of the DuckDB file (may not exist yet for a build).
    keys : :class:`pipelines.store.keys.Keys`
    ledger : :class:`pipelines.receipts.ledger.Ledger`
    completed : subject hashes whose pending erasure this open completed.
    writable : whether this handle holds the writer lock (exclusive).
    reconciled : whether pending erasures were completed through this handle.
    """

    def __init__(self, path: Path, keys, ledger, writable: bool = True):
        self.path = path
        self.keys = keys
        self.ledger = ledger
        self.writable = writable
        self.completed: dict[str, int] = {}
        self.reconciled = False

    @classmethod
    @contextlib.contextmanager
    def open(cls, path: str | os.PathLike, *, write: bool = True, must_exist: bool = True,
             ledger_dir: str | os.PathLike | None = None, wait: float | None = None,
             reconcile: bool = True) -> Iterator[Warehouse]:
        """Lock (exclusive when ``write``), clean stale temporaries, complete pending erasures.

        Opened once per command: inside an open of the same warehouse (and ledger) in this process
        that holds at least the lock this one asks for, the outer handle is yielded as it is — the
        key is not read again, the ledger not checked again, nothing completed twice (a pending
        erasure is completed on the first writable open that finds the file: after a build the
        command's outer open made before the file existed)."""
        from pipelines.receipts import ledger as ledger_mod
        from pipelines.store import keys as keys_mod
        from pipelines.store.keys import Keys
        from pipelines.store.safe_io import refuse_link

        refuse_link(Path(path).absolute(), "warehouse")  # resolve() below would follow it
        p = Path(path).resolve()
        led_dir = Path(ledger_dir or ledger_mod.default_dir(p)).resolve()
        outer = _OPEN.get(p)
        if outer is not None and (outer.writable or not write) and outer.ledger.dir == led_dir:
            if must_exist:
                require(p)
            if reconcile and write and not outer.reconciled and p.is_file():
                outer.reconcile()
            yield outer
            return
        refuse_link(p.parent / (p.name + ".wal"), "warehouse WAL")
        if must_exist:
            require(p)
        with locking.hold(p, exclusive=write, wait=wait):
            meta = read_meta(p) if p.is_file() else {}
            check_key_location(p, led_dir, meta)  # before a key is read or created
            keys = Keys.load()
            led = ledger_mod.Ledger(led_dir, keys)
            w = cls(p, keys, led, writable=write)
            led.check_recorded(meta, f"the warehouse {p.name}")  # no rollback: nothing is touched
            if write:
                locking.clean_stale(p)
                led.complete()  # sign receipts an interrupted append left without a signed head
            if reconcile and p.is_file():
                if write:
                    w.reconcile()
                else:
                    led.verify()
            _OPEN[p], keys_mod.HELD[p] = w, keys
            try:
                yield w
            finally:
                if outer is None:
                    _OPEN.pop(p, None)
                    keys_mod.HELD.pop(p, None)
                else:
                    _OPEN[p], keys_mod.HELD[p] = outer, outer.keys

    def reconcile(self) -> None:
        """Complete any pending erasure (:func:`pipelines.store.forget_apply.complete_pending`), once."""
        from pipelines.store.forget_apply import complete_pending

        self.completed = complete_pending(self)
        self.reconciled = True

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
        from pipelines.receipts.ledger import FORGET_KIND

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

        Runs folders are registered by identity (:mod:`pipelines.store.runs_registry`): the id in the
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
        MEDS dataset) into; a forget erases the patient from it too (:mod:`pipelines.store.exports`)."""
        self._remember("meds_exports" if fmt == "meds" else "exports", folder)

    def export_dirs(self) -> list[Path]:
        """The registered export folders: Parquet exports, then MEDS exports (typed
        :class:`pipelines.store.exports.MedsFolder`, so the erasure knows which files are its own)."""
        from pipelines.store.exports import MedsFolder

        return self._remembered("exports") + [MedsFolder(p) for p in self._remembered("meds_exports")]


#: resolved path -> the handle an active :meth:`Warehouse.open` holds in this process
_OPEN: dict[Path, Warehouse] = {}


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


def accept_rollback(warehouse: str | os.PathLike, ledger_dir: str | os.PathLike | None = None,
                    wait: float | None = None) -> dict:
    """Recovery after a restored (shorter or replaced) log when no newer copy exists: append a
    ``rollback_accepted`` receipt that states what the warehouse had recorded, and record the new
    log in the warehouse. The warehouse's rows stay as they are (the patients forgotten after
    the backup stay absent), but the registry no longer names them: forget each of them again
    (``forget --subject-id ID --allow-absent``) before the next build. Auditors who kept a newer
    head see the fork; the receipt tells them why. Operator only (needs both keys)."""
    from pipelines.errors import LedgerRollbackError
    from pipelines.receipts import ledger as ledger_mod
    from pipelines.receipts import logaudit, signing
    from pipelines.store.keys import Keys

    p = require(warehouse).resolve()
    led_dir = Path(ledger_dir or ledger_mod.default_dir(p)).resolve()
    with locking.hold(p, exclusive=True, wait=wait):
        meta = read_meta(p)
        led = ledger_mod.Ledger(led_dir, Keys.load(create=False))
        st = led.state(check_anchor=False)  # every row MAC'd, every head chained: the log itself is genuine
        recorded, reasons = int(meta.get("ledger_seq") or 0), []
        try:
            led.check_recorded(meta, f"the warehouse {p.name}", st)
        except LedgerRollbackError as exc:
            reasons.append(exc.reason)
        a = led.anchor()
        if isinstance(a, signing.TreeHead):
            try:
                logaudit.check_kept_head(st, a, led.public_key(), "the anchor")
            except LedgerRollbackError as exc:
                reasons.append(exc.reason)
                recorded = max(recorded, a.tree_size)
                logaudit.anchor_path(led.path).unlink()  # replaced by the next append's signed head
        if not reasons:
            return {"accepted": False, "message": "nothing to accept: the log extends what the warehouse and the "
                                                  "anchor recorded"}
        payload = {"recorded_size": recorded, "recorded_root": meta.get("ledger_root"), "log_size": st.size,
                   "log_root": st.root().hex(), "reasons": reasons}
        row = led.append(ledger_mod.ROLLBACK_KIND, ledger_mod.GENESIS, payload)
        w = Warehouse(p, led.keys, led)
        w.record_ledger()
    lost = max(recorded - st.size, 1)
    return {"accepted": True, "receipt_seq": row.seq, "recorded_size": recorded, "log_size": st.size,
            "message": f"rollback accepted as receipt #{row.seq}: the warehouse had recorded {recorded} receipts, the "
                       f"log held {st.size}; at least {lost} deletion(s) are missing from the registry. The warehouse "
                       "still holds none of those patients: forget each again (forgetful forget --subject-id ID "
                       "--allow-absent) before the next build, which would otherwise bring them back"}
