"""Erasing forgotten patients from ``forgetful export`` folders.

An export (``stays.parquet`` + ``hourly.parquet``, owner-only) is record-level data the project
wrote, so a forget must reach it like every other byte: :func:`erase` rewrites each registered
export without the forgotten subjects' stays. Each file is written afresh beside the old one
(never copying the removed rows), fsynced, swapped in atomically, and the old inode is zeroed
before it is released. A file that can no longer be read as an export (edited, truncated, or an
``hourly.parquet`` without its ``stays.parquet``, which maps stays to patients) cannot be shown
clean, so it is zeroed and removed (fail closed). Idempotent: rerunning finds nothing to remove,
so a forget killed half-way is completed by the next command.

Only folder paths are remembered (in the warehouse's meta table, by
:meth:`pipelines.warehouse.Warehouse.register_export`); nothing here prints an identifier.
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from .erasure import _zero_and_close, fsync_dir

FILES = ("stays.parquet", "hourly.parquet")


def _swap(frame, target: Path) -> None:
    """Replace ``target`` by ``frame`` (fresh file, fsync, atomic rename, old inode zeroed)."""
    tmp = target.parent / f".{target.name}.forget-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        frame.write_parquet(fh)
        fh.flush()
        os.fsync(fh.fileno())
    old = os.open(target, os.O_RDWR)
    os.replace(tmp, target)
    fsync_dir(target.parent)
    _zero_and_close(old)


def _remove(target: Path) -> None:
    """Zero ``target``'s bytes, then unlink it."""
    _zero_and_close(os.open(target, os.O_RDWR))
    target.unlink()
    fsync_dir(target.parent)


def erase(folders: Iterable[Path], subjects: set[int]) -> dict[str, int]:
    """Remove every row of ``subjects`` from the registered export ``folders``.

    Returns counts only: ``{"export_files_rewritten", "export_files_removed", "export_rows_removed"}``.
    """
    import polars as pl

    out = {"export_files_rewritten": 0, "export_files_removed": 0, "export_rows_removed": 0}
    subj = sorted(int(s) for s in subjects)
    for d in folders:
        stays_p, hourly_p = (Path(d) / f for f in FILES)
        # the stay -> patient map comes from stays.parquet; hourly.parquet is cleaned first, so a
        # kill between the two leaves the map in place for the rerun
        stays, drop = None, None
        if stays_p.is_file():
            try:
                stays = pl.read_parquet(stays_p)
                drop = [int(s) for s in stays.filter(pl.col("subject_id").is_in(subj))["stay_id"].to_list()]
            except Exception:  # unreadable: cannot be shown clean -> fail closed
                _remove(stays_p)
                out["export_files_removed"] += 1
        if hourly_p.is_file():
            if drop is None:  # no readable stay -> patient map beside it
                _remove(hourly_p)
                out["export_files_removed"] += 1
            elif drop:
                try:
                    hourly = pl.read_parquet(hourly_p)
                    keep = hourly.filter(~pl.col("stay_id").is_in(drop))
                    if keep.height != hourly.height:
                        _swap(keep, hourly_p)
                        out["export_files_rewritten"] += 1
                        out["export_rows_removed"] += hourly.height - keep.height
                except Exception:
                    _remove(hourly_p)
                    out["export_files_removed"] += 1
        if stays is not None and drop:
            _swap(stays.filter(~pl.col("subject_id").is_in(subj)), stays_p)
            out["export_files_rewritten"] += 1
            out["export_rows_removed"] += len(drop)
    return out
