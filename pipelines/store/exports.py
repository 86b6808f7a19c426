"""Erasing forgotten patients from ``forgetful export`` folders.

An export (``stays.parquet`` + ``hourly.parquet``, owner-only; or a MEDS dataset,
:mod:`cohort.meds_export`) is record-level data the project wrote, so a forget must reach it like
every other byte: :func:`erase` rewrites each registered export without the forgotten subjects'
rows. In a MEDS export every data shard (``data/**/*.parquet``) and
``metadata/subject_splits.parquet`` lose the subjects' rows; ``codes.parquet`` and
``dataset.json`` hold no record and are left as they are. Each file is written afresh beside the old one
(never copying the removed rows), fsynced, swapped in atomically, and the old inode is zeroed
before it is released. A file that can no longer be read as an export (edited, truncated, an
``hourly.parquet`` without its ``stays.parquet``, which maps stays to patients, or a MEDS shard
without an integer ``subject_id``) cannot be shown clean, so it is zeroed and removed (fail
closed). Idempotent: rerunning finds nothing to remove, so a forget killed half-way is completed
by the next command.

Links are never followed (:mod:`pipelines.store.safe_io`): a registered folder, ``stays.parquet`` or
``hourly.parquet``, or a MEDS export's ``data``/``metadata`` folder, any folder or file under
``data``, or its split file, that is a symbolic link is refused with one typed line before anything is
changed (:func:`check_links`, also run by ``forget`` before its receipt is committed), and every
file is opened with ``O_NOFOLLOW``.

Only folder paths are remembered (in the warehouse's meta table, by
:meth:`pipelines.store.warehouse.Warehouse.register_export`); nothing here prints an identifier.
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from pipelines.errors import UnsafePathError
from pipelines.store.erasure import fsync_dir, zero_and_close
from pipelines.store.safe_io import open_nofollow, refuse_link, storage_errno

FILES = ("stays.parquet", "hourly.parquet")
#: the top-level names of a MEDS export and its one record-level metadata file
MEDS_TOP = ("data", "metadata")
MEDS_SPLITS = Path("metadata") / "subject_splits.parquet"
WHAT = "export file"


class MedsFolder(type(Path())):  # type: ignore[misc]
    """The path of a registered MEDS export folder (:meth:`pipelines.store.warehouse.Warehouse.export_dirs`):
    only in such a folder are ``data/**/*.parquet`` and ``metadata/subject_splits.parquet`` the
    export's own files (a Parquet export folder's other files are never touched)."""


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


def check_links(folders: Iterable[Path]) -> None:
    """Refuse (:class:`~pipelines.errors.UnsafePathError`) a registered export folder or export
    file that is a symbolic link (a :class:`MedsFolder`: its ``data`` and ``metadata`` folders,
    every entry under ``data`` and the split file); nothing is changed."""
    for d in folders:
        refuse_link(Path(d), "export folder")
        if isinstance(d, MedsFolder):
            for f in MEDS_TOP:
                refuse_link(d / f, "MEDS export folder")
            refuse_link(d / MEDS_SPLITS, WHAT)
            meds_shards(d)
        else:
            for f in FILES:
                refuse_link(Path(d) / f, WHAT)


def _swap(frame, target: Path) -> None:
    """Replace ``target`` by ``frame`` (fresh file, fsync, atomic rename, old inode zeroed);
    ``frame`` is a Polars frame or a pyarrow table (MEDS files keep their exact Arrow schema)."""
    tmp = target.parent / f".{target.name}.forget-{os.getpid()}"
    tmp.unlink(missing_ok=True)  # a killed run's leftover (or a planted link: unlinking never follows)
    old = open_nofollow(target, os.O_RDWR, WHAT)
    try:
        fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, WHAT)
        try:
            with os.fdopen(fd, "wb") as fh:
                if hasattr(frame, "write_parquet"):
                    frame.write_parquet(fh)
                else:
                    import pyarrow.parquet as pq

                    pq.write_table(frame, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(target.parent)
    except BaseException:
        os.close(old)
        raise
    zero_and_close(old)


def _remove(target: Path) -> None:
    """Zero ``target``'s bytes, then unlink it (the link itself if one was planted meanwhile)."""
    zero_and_close(open_nofollow(target, os.O_RDWR, WHAT))
    target.unlink()
    fsync_dir(target.parent)


def _read(target: Path):
    """Read a Parquet export file through a descriptor opened with ``O_NOFOLLOW``."""
    import polars as pl

    with os.fdopen(open_nofollow(target, os.O_RDONLY, WHAT), "rb") as fh:
        return pl.read_parquet(fh)


def remove_partial(folder: str | os.PathLike, fmt: str = "parquet") -> str:
    """After a failed ``forgetful export``: zero and remove the export files it left in
    ``folder`` (the export refuses a folder that already holds them, so they are its own; MEDS:
    every file under ``data`` and ``metadata``, then those folders). Returns what was done, for
    the error message."""
    gone = []
    d = Path(folder)
    if fmt == "meds":
        files = [p for top in MEDS_TOP if (d / top).is_dir() and not (d / top).is_symlink()
                 for p in sorted((d / top).rglob("*"), reverse=True)]
    else:
        files = [d / f for f in FILES]
    for p in files:
        if p.is_file() and not p.is_symlink():
            try:
                _remove(p)
                gone.append(str(p.relative_to(d)))
            except OSError:
                return f"the partial export in {folder} could not be removed: delete {p} yourself"
    if fmt == "meds":
        for p in [*files, *(d / t for t in MEDS_TOP)]:
            if p.is_dir() and not p.is_symlink():
                try:
                    p.rmdir()
                except OSError:
                    pass
    done = f"the partial file(s) {', '.join(gone)} were removed" if gone else "no export file was written"
    return f"{done}; the warehouse is unchanged; rerun once the disk allows"


def _readable(target: Path):
    """The frame in ``target``, or None when it cannot be read as Parquet (fail closed). A link
    or a storage failure raises instead: neither says anything about the file's content."""
    try:
        return _read(target)
    except UnsafePathError:
        raise
    except Exception as exc:
        if storage_errno(exc) is not None:
            raise
        return None


def _readable_table(target: Path):
    """A MEDS file as a pyarrow table, or None when it cannot be shown clean (not Parquet, or no
    integer ``subject_id``); a link or a storage failure raises (see :func:`_readable`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with os.fdopen(open_nofollow(target, os.O_RDONLY, WHAT), "rb") as fh:
            table = pq.read_table(fh)
    except UnsafePathError:
        raise
    except Exception as exc:
        if storage_errno(exc) is not None:
            raise
        return None
    if "subject_id" not in table.column_names or not pa.types.is_integer(table.schema.field("subject_id").type):
        return None
    return table


def _erase_meds(d: Path, subj: list[int], out: dict[str, int]) -> None:
    """Remove ``subj``'s rows from every data shard and the split file of the MEDS export ``d``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    targets = meds_shards(d) + ([d / MEDS_SPLITS] if (d / MEDS_SPLITS).is_file() else [])
    ids = pa.array(subj, pa.int64())
    for f in targets:
        table = _readable_table(f)
        if table is None:  # cannot be shown clean -> fail closed
            _remove(f)
            out["export_files_removed"] += 1
            continue
        hit = pc.fill_null(pc.is_in(pc.cast(table.column("subject_id"), pa.int64()), value_set=ids), False)
        n = pc.sum(hit).as_py() or 0
        if n:
            _swap(table.filter(pc.invert(hit)), f)
            out["export_files_rewritten"] += 1
            out["export_rows_removed"] += n


def erase(folders: Iterable[Path], subjects: set[int]) -> dict[str, int]:
    """Remove every row of ``subjects`` from the registered export ``folders``.

    Returns counts only: ``{"export_files_rewritten", "export_files_removed", "export_rows_removed"}``.
    Raises :class:`~pipelines.errors.UnsafePathError` (a link, nothing changed) or a storage
    error (the files are left as they were or already clean; rerunning completes it).
    """
    import polars as pl

    out = {"export_files_rewritten": 0, "export_files_removed": 0, "export_rows_removed": 0}
    subj = sorted(int(s) for s in subjects)
    folders = [d if isinstance(d, MedsFolder) else Path(d) for d in folders]
    check_links(folders)
    for d in folders:
        if isinstance(d, MedsFolder):
            _erase_meds(d, subj, out)
            continue
        stays_p, hourly_p = (d / f for f in FILES)
        # the stay -> patient map comes from stays.parquet; hourly.parquet is cleaned first, so a
        # kill between the two leaves the map in place for the rerun
        stays, drop = None, None
        if stays_p.is_file():
            stays = _readable(stays_p)
            if stays is None:  # unreadable: cannot be shown clean -> fail closed
                _remove(stays_p)
                out["export_files_removed"] += 1
            else:
                drop = [int(s) for s in stays.filter(pl.col("subject_id").is_in(subj))["stay_id"].to_list()]
        if hourly_p.is_file() and (drop is None or drop):
            hourly = None if drop is None else _readable(hourly_p)  # no readable stay -> patient map beside it
            if hourly is None:
                _remove(hourly_p)
                out["export_files_removed"] += 1
            else:
                keep = hourly.filter(~pl.col("stay_id").is_in(drop))
                if keep.height != hourly.height:
                    _swap(keep, hourly_p)
                    out["export_files_rewritten"] += 1
                    out["export_rows_removed"] += hourly.height - keep.height
        if stays is not None and drop:
            _swap(stays.filter(~pl.col("subject_id").is_in(subj)), stays_p)
            out["export_files_rewritten"] += 1
            out["export_rows_removed"] += len(drop)
    return out
