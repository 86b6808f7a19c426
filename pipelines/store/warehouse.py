"""The warehouse handle, and the warehouse facts the flows need.

:class:`Warehouse` is the one seam every command goes through: ``Warehouse.open(path)`` takes the
writer lock (:mod:`pipelines.store.locking`), loads the key (:mod:`pipelines.store.keys`; created
only for a fresh configuration) and the forget registry (:mod:`pipelines.receipts.ledger`),
removes the temporary files killed commands left (beside the warehouse, in its task cache and in
its export folders: :mod:`pipelines.store.export_registry`), and *completes any pending erasure*
(a forget that died after its receipt was committed, or a patient another registry of the same
source names) before the caller sees a single row. Inside the block, tasks still receive the
warehouse *path* and its *content hash* (never DataFrames); the hash keys their cached results.

The forget registry a warehouse obeys (:meth:`Warehouse.registry`) is its own log **and** every
other log the configuration keeps for the same source (:mod:`pipelines.store.registries`): the
source key is recorded in the meta table (``source_key``) by the build and the ingest.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import duckdb

from pipelines.store import export_registry, locking, registries, runs_registry
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
    from pipelines.store.keys import check_location, key_files

    dirs = runs_registry.resolve(runs_registry.load(meta.get("runs_dirs")), warehouse.parent)
    dirs += [e.folder for e in export_registry.entries(meta)]
    check_location(key_files(), warehouse, [ledger_dir, *dirs])


class Warehouse:
    """An open warehouse: path, key, ledger (forget registry), lock. Use :meth:`open`.

    Attributes
    ----------
    path : absolute path of the DuckDB file (may not exist yet for a build).
    keys : :class:`pipelines.store.keys.Keys`
    ledger : :class:`pipelines.receipts.ledger.Ledger` (this warehouse's own receipt log)
    source_key : the source it is built from (:func:`pipelines.store.registries.source_key`), or None.
    completed : subject hashes whose pending erasure this open completed (receipt seq; None when
        another registry of the source names them).
    writable : whether this handle holds the writer lock (exclusive).
    reconciled : whether pending erasures were completed through this handle.
    """

    def __init__(self, path: Path, keys, ledger, source_key: str | None = None, writable: bool = True):
        self.path = path
        self.keys = keys
        self.ledger = ledger
        self.source_key = source_key
        self.writable = writable
        self.completed: dict[str, int | None] = {}
        self.reconciled = False
        self._others: list | None = None

    @classmethod
    @contextlib.contextmanager
    def open(cls, path: str | os.PathLike, *, write: bool = True, must_exist: bool = True,
             ledger_dir: str | os.PathLike | None = None, wait: float | None = None,
             reconcile: bool = True, on_witness_conflict: str = "refuse",
             source: str | None = None) -> Iterator[Warehouse]:
        """Lock (exclusive when ``write``), clean stale temporaries, complete pending erasures.
        ``source``: the source key of a warehouse being built (else the one it recorded).

        A writer first asks the log's witnesses, if it has any, whether they cosigned a larger or
        another tree (:func:`pipelines.receipts.witness_client.ask`): a restored or forked log is
        refused before anything is read (``on_witness_conflict="warn"``: said, not refused — a
        forget, which only removes data); the log's newest checkpoint is submitted again when
        the block ends (a forget grew the log).

        Opened once per command: inside an open of the same warehouse (and ledger, and source) in
        this process that holds at least the lock this one asks for, the outer handle is yielded as
        it is — the key is not read again, the ledger not checked again, nothing completed twice (a
        pending erasure is completed on the first writable open that finds the file: after a build
        the command's outer open made before the file existed)."""
        from pipelines.receipts import ledger as ledger_mod
        from pipelines.store import keys as keys_mod
        from pipelines.store.keys import Keys
        from pipelines.store.safe_io import refuse_link

        refuse_link(Path(path).absolute(), "warehouse")  # resolve() below would follow it
        p = Path(path).resolve()
        led_dir = Path(os.path.abspath(ledger_dir or ledger_mod.default_dir(p)))  # a link there is refused
        outer = _OPEN.get(p)
        if (outer is not None and (outer.writable or not write) and outer.ledger.dir == led_dir.resolve()
                and source in (None, outer.source_key)):
            if must_exist:
                require(p)
            if outer.source_key is None and p.is_file():  # built inside the outer open: its recorded source
                outer.source_key, outer._others = read_meta(p).get("source_key"), None
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
            keys = Keys.load(create=not ledger_mod.log_exists(led_dir))  # never a new key beside a log
            led = ledger_mod.Ledger(led_dir, keys)
            w = cls(p, keys, led, source or meta.get("source_key"), writable=write)
            led.check_recorded(meta, f"the warehouse {p.name}")  # no rollback: nothing is touched
            if write:
                from pipelines.receipts import witness_client

                if locking.depth(p) == 1:  # the outermost hold: no write of this command is in flight
                    locking.clean_stale(p)
                    export_registry.sweep(w, meta)
                led.complete()  # sign receipts an interrupted append left without a signed head
                witness_client.ask(led, refuse=on_witness_conflict == "refuse")
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
            if write:
                witness_client.ask(led, refuse=False)  # the block may have grown the log

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

    # -- the forget registry: this warehouse's log and the source's other logs ------------------
    def other_registries(self) -> list:
        """The other receipt logs this configuration keeps for the warehouse's source, each
        verified; one that cannot be read is :class:`~pipelines.errors.RegistryUnreadableError`."""
        if self._others is None:
            from pipelines.errors import PipelineError
            from pipelines.receipts.ledger import Ledger

            out = []
            for d in registries.ledgers(self.source_key):
                if d.resolve() == self.ledger.dir:
                    continue
                try:
                    led = Ledger(d, self.keys)
                    led.state()
                except (PipelineError, OSError) as exc:
                    raise registries.unreadable(self.source_key, d, exc) from None
                out.append(led)
            self._others = out
        return self._others

    def _rows(self):
        """Verified rows of every registry this warehouse obeys (its own first)."""
        for led in (self.ledger, *self.other_registries()):
            yield from led.rows()

    def registry(self) -> dict[str, int | None]:
        """Forgotten subjects: hash -> receipt seq in this warehouse's log (None: named only by
        another registry the configuration keeps for the same source)."""
        from pipelines.receipts.ledger import FORGET_KIND

        out: dict[str, int | None] = {r.subject_id_hash: None for led in self.other_registries()
                                      for r in led.rows() if r.kind == FORGET_KIND}
        out.update(self.ledger.registry())
        return out

    def bind_registry(self) -> None:
        """List this warehouse's log for its source in the configuration's index (once it holds a
        receipt), so every other warehouse of the source obeys it too."""
        from pipelines.receipts.ledger import log_exists

        if self.source_key and log_exists(self.ledger.dir):
            registries.add(self.source_key, self.ledger.dir)

    def present_registered(self, con=None) -> dict[int, str]:
        """subject id -> hash, for subjects in this warehouse that the registry says are forgotten."""
        reg = self.registry()
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

    def _payload_set(self, field: str) -> set[str]:
        from pipelines.receipts.ledger import FORGET_KIND

        return {h for r in self._rows() if r.kind == FORGET_KIND for h in r.payload.get(field, [])}

    def forgotten_stays(self) -> set[str]:
        """Keyed hashes of every stay a forget receipt names (payload ``stay_id_hashes``)."""
        return self._payload_set("stay_id_hashes")

    def exclusion(self) -> ForgetExclusion:
        """Scan-time filter for :func:`cohort.build.build_warehouse`: registered (forgotten)
        subjects, the stays their receipts name (whoever the source lists them under now) and the
        fingerprints of those stays' hourly content (payload ``content_fingerprints``)."""
        return ForgetExclusion(self.keys, set(self.registry()), self.forgotten_stays(),
                               self._payload_set("content_fingerprints"))

    def ledger_meta(self) -> dict[str, str]:
        """What this warehouse records about the registry it reflects: the log state (size,
        newest MAC, Merkle root) and the source whose registries it obeys."""
        return {**self.ledger.record(), **({"source_key": self.source_key} if self.source_key else {})}

    def record_ledger(self) -> None:
        """Record the current log state in the meta table (the warehouse reflects every receipt)."""
        con = self.connect()
        try:
            con.execute(f"CREATE TABLE IF NOT EXISTS {META} (key VARCHAR PRIMARY KEY, value VARCHAR)")
            for k, v in self.ledger_meta().items():
                con.execute(f"INSERT OR REPLACE INTO {META} VALUES (?, ?)", [k, v])
        finally:
            con.close()

    def register_runs_dir(self, runs_dir: str | os.PathLike) -> None:
        """Remember a runs directory that holds results of this warehouse (so a forget can mark
        them stale and rewrite their ledger card, wherever it is run from).

        Runs folders are registered by identity (:mod:`pipelines.store.runs_registry`): the id in the
        folder's ``.forgetful-runs-id`` plus its path relative to the warehouse, so a moved
        folder is still found and a copy is a folder of its own. A runs folder (or its
        ``ledger`` folder) that is a symbolic link is refused: nothing is written through it."""
        runs_registry.check_links([Path(os.path.abspath(runs_dir))])
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

    def export_entries(self) -> list[export_registry.ExportEntry]:
        """The registered export folders with the content identities of the files the project
        wrote in them (:mod:`pipelines.store.export_registry`)."""
        return export_registry.entries(read_meta(self.path)) if self.path.is_file() else []

    def remember_export_version(self, folder: Path, rel: str, sha: str) -> None:
        """Record a version of an export file a forget writes (before it is swapped in)."""
        export_registry.add_version(self, folder, rel, sha)


#: resolved path -> the handle an active :meth:`Warehouse.open` holds in this process
_OPEN: dict[Path, Warehouse] = {}


class ForgetExclusion:
    """The forget registry as :func:`cohort.build.exclude_stays` reads it: called on an int64
    array of subject ids, a boolean mask of forgotten subjects; :meth:`stays` the same for stay
    ids (keyed hashes compared; no id is stored); ``contents`` the same for the hourly content of
    candidate stays (None when the registry keeps no content fingerprint)."""

    def __init__(self, keys, subject_hashes: set[str], stay_hashes: set[str], content: set[str] = frozenset()):
        self._keys, self._subjects, self._stays, self._content = keys, subject_hashes, stay_hashes, set(content)
        #: :func:`cohort.build.content.drop_forgotten_content` runs only when there is a fingerprint to match
        self.contents = self._contents if self._content else None

    def __call__(self, subject_ids):
        import numpy as np

        ids = np.asarray(subject_ids, dtype=np.int64)
        return np.fromiter((self._keys.subject_hash(int(s)) in self._subjects for s in ids), dtype=bool,
                           count=ids.size)

    def stays(self, stay_ids):
        import numpy as np

        ids = np.asarray(stay_ids, dtype=np.int64)
        return np.fromiter((self._keys.stay_hash(int(s)) in self._stays for s in ids), dtype=bool, count=ids.size)

    def _contents(self, per_stay: list[list[bytes]]):
        """One boolean per stay: does any block of its content (:func:`cohort.build.content.blocks`)
        carry a forgotten stay's fingerprint?"""
        import numpy as np

        return np.fromiter((any(self._keys.content_hash(b) in self._content for b in blocks) for blocks in per_stay),
                           dtype=bool, count=len(per_stay))


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
    led_dir = Path(os.path.abspath(ledger_dir or ledger_mod.default_dir(p)))
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
        w = Warehouse(p, led.keys, led, meta.get("source_key"))
        w.record_ledger()
    lost = max(recorded - st.size, 1)
    return {"accepted": True, "receipt_seq": row.seq, "recorded_size": recorded, "log_size": st.size,
            "message": f"rollback accepted as receipt #{row.seq}: the warehouse had recorded {recorded} receipts, the "
                       f"log held {st.size}; at least {lost} deletion(s) are missing from the registry. The warehouse "
                       "still holds none of those patients: forget each again (forgetful forget --subject-id ID "
                       "--allow-absent) before the next build, which would otherwise bring them back"}
