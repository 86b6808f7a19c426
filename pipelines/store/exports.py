"""Erasing forgotten patients from ``forgetful export`` folders, and scanning them (counts only).

An export (``stays.parquet`` + ``hourly.parquet``, owner-only; or a MEDS dataset,
:mod:`cohort.meds_export`) is record-level data the project wrote, so a forget reaches it like
every other byte: :func:`erase` rewrites every file the project wrote in each registered export
(:mod:`pipelines.store.export_registry`) without **every** patient the forget registry names, so
a restored copy of an older version is cleaned too; a file that is no version the project wrote
is left byte for byte and counted. :func:`scan` (``receipts verify --warehouse``) counts forgotten
subjects in every export-named file; nothing is written. Links are never followed
(:func:`check_links`, ``O_NOFOLLOW``). Nothing here prints an identifier. docs/DELETION.md.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from pipelines.store import killpoint
from pipelines.store.erasure import fsync_dir, zero_and_close
from pipelines.store.export_registry import MEDS_TOP, PARQUET_FILES, ExportEntry, sha256_file, zero_remove
from pipelines.store.safe_io import open_nofollow, refuse_link, storage_errno

FILES = PARQUET_FILES
MEDS_SPLITS = Path("metadata") / "subject_splits.parquet"
WHAT = "export file"
__all__ = ["FILES", "MEDS_TOP", "ExportEntry", "SubjectSet", "check_links", "erase", "meds_shards", "scan"]


class SubjectSet:
    """An exclusion given as plain subject ids (the shape of
    :class:`pipelines.store.warehouse.ForgetExclusion`: a subject mask, no stays)."""

    stays = None

    def __init__(self, subject_ids: Iterable[int]):
        self._ids = np.asarray(sorted(int(s) for s in subject_ids), dtype=np.int64)

    def __call__(self, ids) -> np.ndarray:
        return np.isin(np.asarray(ids, dtype=np.int64), self._ids)


def _mask(fn, ids) -> np.ndarray:
    """One boolean per id (``fn`` None: all False)."""
    ids = np.asarray(ids, dtype=np.int64)
    return np.zeros(ids.size, dtype=bool) if fn is None else np.asarray(fn(ids), dtype=bool)


def meds_shards(folder: Path) -> list[Path]:
    """The data shards of a MEDS export folder (``data/**/*.parquet``), walking without following
    a link; a link anywhere under ``data`` is :class:`~pipelines.errors.UnsafePathError`."""
    data = Path(folder) / "data"
    refuse_link(data, "MEDS data folder")
    if not data.is_dir():
        return []
    out = []
    for top, dirs, files in os.walk(data, followlinks=False):
        for name in dirs + files:
            refuse_link(Path(top) / name, "MEDS export entry")
        out += [Path(top) / f for f in files if f.endswith(".parquet") and not f.startswith(".")]
    return sorted(out)


def check_links(entries: Iterable[ExportEntry]) -> None:
    """Refuse (:class:`~pipelines.errors.UnsafePathError`) a registered export folder or export
    file that is a symbolic link (MEDS: its ``data`` and ``metadata`` folders, every entry under
    ``data`` and the split file); nothing is changed.

    Run before anything is changed, also by ``forget`` before its receipt is committed.
    """
    for e in entries:
        refuse_link(e.folder, "export folder")
        if e.meds:
            for f in MEDS_TOP:
                refuse_link(e.folder / f, "MEDS export folder")
            refuse_link(e.folder / MEDS_SPLITS, WHAT)
            meds_shards(e.folder)
        else:
            for f in FILES:
                refuse_link(e.folder / f, WHAT)


def _read(target: Path) -> tuple[bytes, str]:
    """The file's bytes (read through ``O_NOFOLLOW``) and their sha256."""
    with os.fdopen(open_nofollow(target, os.O_RDONLY, WHAT), "rb") as fh:
        data = fh.read()
    return data, hashlib.sha256(data).hexdigest()


def _table(data: bytes):
    """The Parquet table in ``data``, or None when it is not one (it cannot be shown clean)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(pa.BufferReader(data))
    except Exception as exc:  # noqa: BLE001 - any parse failure: not an export we can read
        if storage_errno(exc) is not None:
            raise
        return None


def _ids(table, col: str):
    import pyarrow as pa

    if col not in table.column_names or not pa.types.is_integer(table.schema.field(col).type):
        return None
    return table.column(col).to_numpy(zero_copy_only=False)


def _swap(table, target: Path, recorded: Callable[[str], None]) -> None:
    """Replace ``target`` by ``table`` (fresh file, fsync, its sha256 recorded, atomic rename,
    old inode zeroed); the table keeps its exact Arrow schema."""
    import pyarrow.parquet as pq

    tmp = target.parent / f".{target.name}.forget-{os.getpid()}"
    tmp.unlink(missing_ok=True)  # a killed run's leftover (or a planted link: unlinking never follows)
    old = open_nofollow(target, os.O_RDWR, WHAT)
    try:
        fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, WHAT)
        try:
            with os.fdopen(fd, "wb") as fh:
                pq.write_table(table, fh)
                fh.flush()
                os.fsync(fh.fileno())
            recorded(sha256_file(tmp))
            killpoint.hit("export.written")
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(target.parent)
        killpoint.hit("export.swapped")
    except BaseException:
        os.close(old)
        raise
    zero_and_close(old)


def _remove(target: Path) -> None:
    """Zero ``target``'s bytes, then unlink it, fsynced (a link is refused, never followed)."""
    refuse_link(target, WHAT)
    zero_remove(target)
    fsync_dir(target.parent)


class _Eraser:
    """One pass of :func:`erase` over one registered folder (counts in ``out``)."""

    def __init__(self, e: ExportEntry, excl, out: dict[str, int], remember):
        self.e, self.excl, self.out, self.remember = e, excl, out, remember

    def own_table(self, f: Path):
        """The file's table if it is the project's and readable; None otherwise (left alone, or —
        legacy folders only — zeroed and removed when unreadable)."""
        if not f.is_file():
            return None
        rel = f.relative_to(self.e.folder).as_posix()
        data, sha = _read(f)
        if not self.e.own(rel, sha):
            self.out["export_files_left_alone"] += 1
            return None
        table = _table(data)
        if table is None:  # a legacy folder's unreadable file: it cannot be shown clean -> fail closed
            _remove(f)
            self.out["export_files_removed"] += 1
        return table

    def keep(self, f: Path, table, drop: np.ndarray) -> None:
        """Rewrite ``f`` without the rows ``drop`` marks (nothing when none)."""
        import pyarrow as pa

        n = int(drop.sum())
        if not n:
            return
        rel = f.relative_to(self.e.folder).as_posix()
        _swap(table.filter(pa.array(~drop)), f, lambda sha: self.remember(self.e.folder, rel, sha))
        self.out["export_files_rewritten"] += 1
        self.out["export_rows_removed"] += n

    def meds(self) -> None:
        targets = meds_shards(self.e.folder) + [self.e.folder / MEDS_SPLITS]
        for f in targets:
            table = self.own_table(f)
            if table is None:
                continue
            ids = _ids(table, "subject_id")
            if ids is None:  # no integer subject_id: cannot be shown clean -> fail closed
                _remove(f)
                self.out["export_files_removed"] += 1
                continue
            self.keep(f, table, _mask(self.excl, ids))

    def parquet(self) -> None:
        stays_p, hourly_p = (self.e.folder / f for f in FILES)
        stays = self.own_table(stays_p)
        drop_stays, dropped = None, np.zeros(0, dtype=np.int64)
        if stays is not None:
            sid, subj = _ids(stays, "stay_id"), _ids(stays, "subject_id")
            if sid is None or subj is None:
                _remove(stays_p)
                self.out["export_files_removed"] += 1
                stays = None
            else:
                drop_stays = _mask(self.excl, subj) | _mask(self.excl.stays, sid)
                dropped = sid[drop_stays]
        legacy_blind = self.e.files is None and stays is None  # no stay -> patient map beside it
        if hourly_p.is_file():
            if legacy_blind:
                _remove(hourly_p)
                self.out["export_files_removed"] += 1
            else:
                hourly = self.own_table(hourly_p)
                hid = None if hourly is None else _ids(hourly, "stay_id")
                if hid is not None:
                    self.keep(hourly_p, hourly, np.isin(hid, dropped) | _mask(self.excl.stays, hid))
        if stays is not None:
            self.keep(stays_p, stays, drop_stays)


def _counts() -> dict[str, int]:
    return {"export_files_rewritten": 0, "export_files_removed": 0, "export_rows_removed": 0,
            "export_files_left_alone": 0}


def erase(entries: Iterable[ExportEntry], excl, remember: Callable[[Path, str, str], None] | None = None
          ) -> dict[str, int]:
    """Remove every row of the forgotten patients from the registered exports.

    excl : the registry (:class:`pipelines.store.warehouse.ForgetExclusion`: called on subject
        ids, ``excl.stays`` on stay ids), or a :class:`SubjectSet`.
    remember : ``f(folder, path in folder, sha256)`` records a version the project wrote, before
        it is swapped in (:func:`pipelines.store.export_registry.add_version`).

    Returns counts only: ``export_files_rewritten``, ``export_files_removed`` (unreadable, legacy
    folders), ``export_rows_removed``, ``export_files_left_alone`` (not the project's). Raises
    :class:`~pipelines.errors.UnsafePathError` (a link, nothing changed) or a storage error (the
    files are left as they were or already clean; rerunning completes it).

    Subjects are matched by keyed hash (the registry), stays by the keyed hashes their receipts
    name. In a Parquet export ``hourly.parquet`` is cleaned first and ``stays.parquet`` (which maps
    stays to patients) last; in a MEDS export every data shard (``data/**/*.parquet``) and
    ``metadata/subject_splits.parquet``; ``codes.parquet`` and ``dataset.json`` hold no record and are
    left as they are. Each rewrite is a fresh file beside the old one (``.<name>.forget-<pid>``, never
    copying the removed rows), fsynced, recorded as a version the project wrote (before the swap, so a
    kill never leaves a file of ours unrecognised), swapped in atomically; the old inode is zeroed
    before it is released. A file whose content is no version the project wrote (edited, or the
    user's own file under an export's name) is left byte for byte and counted
    (``export_files_left_alone``). In a folder registered before content identities (recognised by
    name) a file that cannot be read as an export is zeroed and removed, as then (fail closed).
    Idempotent: rerunning finds nothing to remove, so a forget killed half-way is completed by the
    next command, and the temporary file it left is removed by the next writing command
    (:func:`pipelines.store.export_registry.sweep`).
    """
    entries = list(entries)
    out = _counts()
    check_links(entries)
    for e in entries:
        er = _Eraser(e, excl, out, remember or (lambda folder, rel, sha: None))
        er.meds() if e.meds else er.parquet()
    return out


def scan(entries: Iterable[ExportEntry], excl) -> dict[str, int]:
    """Counts of forgotten subjects in every export-named file of the registered folders (the
    project's or not; read only, links refused): ``export_files_scanned``,
    ``export_files_not_ours``, ``export_files_unreadable``, ``export_forgotten_rows``."""
    entries = list(entries)
    check_links(entries)
    out = {"export_folders": len(entries), "export_files_scanned": 0, "export_files_not_ours": 0,
           "export_files_unreadable": 0, "export_forgotten_rows": 0}
    for e in entries:
        files = (meds_shards(e.folder) + [e.folder / MEDS_SPLITS]) if e.meds else [e.folder / f for f in FILES]
        for f in files:
            if not f.is_file():
                continue
            data, sha = _read(f)
            out["export_files_scanned"] += 1
            out["export_files_not_ours"] += not e.own(f.relative_to(e.folder).as_posix(), sha)
            table = _table(data)
            subj = None if table is None else _ids(table, "subject_id")
            sid = None if table is None else _ids(table, "stay_id")
            if subj is None and sid is None:
                out["export_files_unreadable"] += 1
                continue
            hit = np.zeros(table.num_rows, dtype=bool)
            if subj is not None:
                hit |= _mask(excl, subj)
            if sid is not None:
                hit |= _mask(excl.stays, sid)
            out["export_forgotten_rows"] += int(hit.sum())
    return out
