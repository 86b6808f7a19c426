"""Runs folders registered with a warehouse, by identity rather than by absolute path.

A forget marks the results of every runs folder that holds results of the warehouse stale and
rewrites their ledger card (:mod:`pipelines.store.forget`). Those folders are remembered in the
warehouse's meta table (key ``runs_dirs``) as entries ``{"id", "rel", "abs"}``:

* ``id`` — a random id stored in the folder itself, ``<runs>/.forgetful-runs-id`` (created owner-only
  on first registration);
* ``rel`` — the folder's path relative to the warehouse's folder; ``abs`` — its absolute path
  when registered (a hint).

A registered folder is found at ``rel`` (first) or ``abs`` only if the id file there holds its
id. So a runs folder moved together with its warehouse is still found; a *copy* of a runs folder
(``cp -r runs runs2``) is a different folder: the copied warehouse finds ``runs2`` through
``rel``, the original finds ``runs``, and a forget on either touches only its own. Registering a
folder whose id is already registered for another folder that still exists (a copy registered
with the same warehouse) gives the copy a fresh id. Entries written before identities existed (a
bare absolute path) are still honoured and are upgraded when that folder is registered again.

A runs folder, or its ``ledger`` folder, found as a symbolic link is refused
(:class:`~pipelines.errors.UnsafePathError`, :func:`check_links`): a forget would otherwise write
its stale marks and ledger card into whatever the link points at (e.g. a copy).
"""
from __future__ import annotations

import json
import os
import re
import secrets
from pathlib import Path

from pipelines.store import safe_io

__all__ = ["ID_FILE", "check_links", "folder_id", "load", "dump", "locate", "register", "resolve"]

ID_FILE = ".forgetful-runs-id"
_ID = re.compile(r"^[0-9a-f]{32}$")


def _read_id(folder: Path) -> str | None:
    f = folder / ID_FILE
    if safe_io.is_link(f):  # a planted link is never read through (it is replaced on registration)
        return None
    try:
        text = f.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if _ID.match(text) else None


def _write_id(folder: Path, fresh: str) -> None:
    """Write (or replace) the id file atomically, owner-only, never through a link."""
    tmp = folder / f"{ID_FILE}.tmp{os.getpid()}"
    tmp.unlink(missing_ok=True)
    fd = safe_io.open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, "runs folder id", 0o600)
    try:
        os.write(fd, (fresh + "\n").encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, folder / ID_FILE)  # replaces a link in its place, never its target


def folder_id(folder: str | os.PathLike, *, create: bool = False) -> str | None:
    """The runs folder's id; with ``create``, a new random one is written when it has none
    (or an unreadable one). None when absent and not created."""
    p = Path(folder)
    fid = _read_id(p)
    if fid is None and create:
        fid = secrets.token_hex(16)
        _write_id(p, fid)
    return fid


def load(text: str | None) -> list[dict]:
    """Entries from the stored JSON (a bare string is a legacy absolute path: ``id`` None)."""
    out = []
    for e in json.loads(text or "[]"):
        if isinstance(e, str):
            out.append({"id": None, "rel": None, "abs": e})
        elif isinstance(e, dict) and isinstance(e.get("abs"), str):
            out.append({"id": e.get("id"), "rel": e.get("rel"), "abs": e["abs"]})
    return out


def dump(entries: list[dict]) -> str:
    return json.dumps(sorted(entries, key=lambda e: (e["abs"], e["id"] or "")))


def _rel(p: Path, base: Path) -> str | None:
    try:
        return os.path.relpath(p, base)
    except ValueError:  # another drive (Windows)
        return None


def check_links(folders) -> None:
    """Refuse a runs folder, or its ``ledger`` folder, that is a symbolic link (nothing written)."""
    for d in folders:
        safe_io.refuse_link(d, "runs folder")
        safe_io.refuse_link(Path(d) / "ledger", "runs folder's ledger folder")


def locate(entry: dict, base: str | os.PathLike) -> Path | None:
    """Where the registered folder is now (``base``: the warehouse's folder), or None. A
    candidate place that is a symbolic link is refused, never followed (:func:`check_links`)."""
    if entry["id"] is None:  # legacy: the absolute path, as before identities
        p = Path(entry["abs"])
        check_links([p])
        return p.resolve() if p.is_dir() else None
    cands = ([Path(os.path.abspath(Path(base) / entry["rel"]))] if entry.get("rel") else []) + [Path(entry["abs"])]
    for c in cands:
        check_links([c])
        if c.is_dir() and _read_id(c) == entry["id"]:
            return c.resolve()
    return None


def register(entries: list[dict], runs_dir: str | os.PathLike, base: str | os.PathLike) -> list[dict]:
    """The entries with ``runs_dir`` registered (created, and given an id, if needed); see the
    module docstring for moved and copied folders. ``entries`` is not modified."""
    p = Path(runs_dir).resolve()
    base = Path(base).resolve()
    try:
        p.mkdir(parents=True, exist_ok=True)
        fid = folder_id(p, create=True)
    except OSError:  # a folder we may not write into: remembered by path, as before identities
        legacy = {"id": None, "rel": None, "abs": str(p)}
        return [dict(e) for e in entries] + ([] if legacy in entries else [legacy])
    out = [dict(e) for e in entries if not (e["id"] is None and Path(e["abs"]).resolve() == p)]
    here = {"rel": _rel(p, base), "abs": str(p)}
    for e in out:
        if e["id"] != fid:
            continue
        at = locate(e, base)
        if at is None or at == p:  # this folder (perhaps moved): refresh where it is
            e.update(here)
            return out
        fid = secrets.token_hex(16)  # the id's folder still exists elsewhere: this one is a copy
        _write_id(p, fid)
        break
    out.append({"id": fid, **here})
    return out


def resolve(entries: list[dict], base: str | os.PathLike) -> list[Path]:
    """The registered folders that exist now, each once, in registration order."""
    found: list[Path] = []
    for e in entries:
        p = locate(e, base)
        if p is not None and p not in found:
            found.append(p)
    return found
