"""Which folders ``forgetful export`` wrote, and which files in them are the project's own.

A forget erases the patient from every export the project wrote (:mod:`pipelines.store.exports`)
and from nothing else: a folder is registered only once an export into it has completed
(:func:`begin`, :func:`finish`), and a file in it is rewritten only when its content is one the
project wrote there (every version is recorded: :class:`ExportEntry`). A failed or killed export
is undone (:func:`abandon`, :func:`sweep`). Folders registered before content identities (meta
keys ``exports`` / ``meds_exports``, a list of paths) are still honoured: their files are
recognised by name, as then.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.store.erasure import fsync_dir, zero_and_close
from pipelines.store.safe_io import is_link, open_nofollow, refuse_link
from pipelines.store.warehouse_files import get_meta, put_meta, read_meta

KEY, PENDING = "export_files", "export_pending"
LEGACY = {"exports": "parquet", "meds_exports": "meds"}
#: meta keys a rebuilt warehouse carries over (:func:`pipelines.flows.clinical_cohort.build_task`)
META_KEYS = (KEY, PENDING, *LEGACY)
STAGING = ".forgetful-export-"
PARQUET_FILES = ("stays.parquet", "hourly.parquet")
MEDS_TOP = ("data", "metadata")
_SWAP_TEMP = re.compile(r"^\.(?P<name>.+)\.forget-\d+$")


@dataclass
class ExportEntry:
    """One registered export folder. ``files``: path in the folder -> every sha256 the project
    wrote there (None: registered before content identities, recognised by name).

    The warehouse's meta table keeps, under ``export_files``::

        {"<folder>": {"format": "parquet" | "meds", "files": {"<path in the folder>": ["<sha256>", ...]}}}

    every version of every file: the one the export wrote, and each one a later forget wrote in its
    place (recorded *before* it is swapped in, so a kill never leaves a file of ours unrecognised). A
    restored copy of any earlier version is therefore still the project's (and is cleaned against
    the whole registry); a file whose content is no recorded version — a user's own file under an
    export's name, an edited export — is left byte for byte and reported. Each entry also keeps, under
    ``seen``, every file's ``(size, mtime, inode)`` when the project last looked at it: a writing
    command stats the files (no read) and re-checks only a folder where one changed
    (:func:`changed`; a copy put back after a forget is cleaned by the next writing command).
    """

    folder: Path
    fmt: str
    files: dict[str, list[str]] | None = None
    seen: dict[str, list[int]] | None = None

    @property
    def meds(self) -> bool:
        return self.fmt == "meds"

    def own(self, rel: str, sha: str) -> bool:
        """Is content ``sha`` at ``rel`` one the project wrote there?"""
        return self.files is None or sha in self.files.get(rel, ())


def entries(meta: dict[str, str]) -> list[ExportEntry]:
    """The registered export folders of a warehouse (its meta table as a dict)."""
    out = [ExportEntry(Path(d), fmt) for key, fmt in LEGACY.items() for d in json.loads(meta.get(key) or "[]")]
    for d, e in sorted(json.loads(meta.get(KEY) or "{}").items()):
        out.append(ExportEntry(Path(d), e["format"], {k: list(v) for k, v in e["files"].items()},
                               e.get("seen", {})))
    return out


def _stat(p: Path) -> list[int] | None:
    """``[size, mtime_ns, inode]`` of ``p`` (the link itself, never its target); None if absent."""
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def changed(e: ExportEntry) -> bool:
    """Has any file the project wrote in ``e`` changed since it last looked (stat only)? A folder
    registered before content identities is never re-checked this way."""
    return e.files is not None and any(_stat(e.folder / rel) != (e.seen or {}).get(rel) for rel in e.files)


def note_seen(w: Any, folders: list[ExportEntry]) -> None:
    """Record how the project's files in ``folders`` look now (after a check or a rewrite)."""
    def change(cur):
        for f in folders:
            e = cur[KEY].get(str(f.folder))
            if e is not None:
                e["seen"] = {rel: _stat(f.folder / rel) for rel in e["files"]}
    _update(w, change)


def pending(meta: dict[str, str]) -> dict[str, dict]:
    return json.loads(meta.get(PENDING) or "{}")


def sha256_file(path: Path) -> str:
    """sha256 of a file read through a descriptor opened with ``O_NOFOLLOW``."""
    h = hashlib.sha256()
    with os.fdopen(open_nofollow(path, os.O_RDONLY, "export file"), "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _update(w: Any, change) -> None:
    """Apply ``change(dict of the meta JSON values)`` to the warehouse's meta table."""
    con = w.connect()
    try:
        cur = {k: json.loads(get_meta(con, k) or "{}") for k in (KEY, PENDING)}
        change(cur)
        for k, v in cur.items():
            put_meta(con, k, json.dumps(v, sort_keys=True))
    finally:
        con.close()


def add_version(w: Any, folder: Path, rel: str, sha: str) -> None:
    """Record ``sha`` as a version of ``rel`` the project wrote in registered ``folder``."""
    def change(cur):
        e = cur[KEY].get(str(folder))
        if e is not None and sha not in e["files"].setdefault(rel, []):
            e["files"][rel].append(sha)
    _update(w, change)


def _walk_files(top: Path) -> list[str]:
    """Every file under ``top`` (paths relative to it), never following a link."""
    out = []
    for d, dirs, files in os.walk(top, followlinks=False):
        for name in dirs + files:
            refuse_link(Path(d) / name, "export entry")
        out += [(Path(d) / f).relative_to(top).as_posix() for f in files]
    return sorted(out)


def begin(w: Any, folder: str | os.PathLike, fmt: str) -> Path:
    """Record an export into ``folder`` as pending and create its (owner-only) staging folder."""
    folder = Path(os.path.abspath(folder))
    refuse_link(folder, "export folder")
    created = not folder.exists()
    stage = folder / f"{STAGING}{os.getpid()}"
    _update(w, lambda cur: cur[PENDING].__setitem__(str(folder), {"format": fmt, "staging": stage.name, "files": {},
                                                                  "created": created}))
    folder.mkdir(parents=True, exist_ok=True)
    _remove_tree(stage)  # a killed export's leftover under this pid
    os.mkdir(stage, 0o700)
    return stage


def finish(w: Any, folder: str | os.PathLike, fmt: str, stage: Path) -> dict[str, str]:
    """Move a complete staged export into ``folder`` and register it (path -> sha256 returned)."""
    from cohort.errors import BadParameterError
    from pipelines.store import killpoint

    folder = Path(os.path.abspath(folder))
    files = {rel: sha256_file(stage / rel) for rel in _walk_files(stage)}
    _update(w, lambda cur: cur[PENDING][str(folder)].__setitem__("files", files))
    killpoint.hit("export.staged")
    tops = MEDS_TOP if fmt == "meds" else PARQUET_FILES
    taken = [t for t in tops if os.path.lexists(folder / t)]
    if taken:
        raise BadParameterError(f"{folder} now holds {', '.join(taken)} (created while exporting); choose an empty "
                                "folder")
    for t in tops:
        if os.path.lexists(stage / t):
            os.rename(stage / t, folder / t)
    killpoint.hit("export.moved")
    fsync_dir(folder)
    os.rmdir(stage)

    def change(cur):
        cur[PENDING].pop(str(folder), None)
        cur[KEY][str(folder)] = {"format": fmt, "files": {rel: [sha] for rel, sha in files.items()},
                                 "seen": {rel: _stat(folder / rel) for rel in files}}
    _update(w, change)
    return files


def zero_remove(p: Path) -> None:
    """Zero a file's bytes, then unlink it (a link in its place is unlinked itself)."""
    if is_link(p):
        p.unlink()
        return
    zero_and_close(open_nofollow(p, os.O_RDWR, "export file"))
    p.unlink()


def _remove_tree(top: Path) -> int:
    """Zero and remove every file under ``top``, then the folders (a link is removed, never entered)."""
    try:
        st = os.lstat(top)
    except FileNotFoundError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        zero_remove(top)
        return 1
    n = 0
    for d, dirs, files in os.walk(top, topdown=False, followlinks=False):
        for f in files:
            zero_remove(Path(d) / f)
            n += 1
        for x in dirs:
            q = Path(d) / x
            q.unlink() if is_link(q) else q.rmdir()
    top.rmdir()
    return n


def _rmdir_empty(folder: Path, tops) -> None:
    for t in tops:
        q = folder / t
        if q.is_dir() and not is_link(q):
            for d, _, _ in sorted(os.walk(q, followlinks=False), reverse=True):
                try:
                    os.rmdir(d)
                except OSError:
                    pass  # not empty: someone else's files


def _undo(folder: Path, p: dict) -> int:
    """Remove what a pending export left: its staging folder, and each file already moved into
    ``folder`` whose content is the one it staged (a file with other content is not its own)."""
    n = _remove_tree(folder / p["staging"])
    for rel, sha in p.get("files", {}).items():
        f = folder / rel
        if f.is_file() and not is_link(f) and sha256_file(f) == sha:
            zero_remove(f)
            n += 1
    _rmdir_empty(folder, MEDS_TOP if p.get("format") == "meds" else ())
    if p.get("created"):
        _rmdir_empty(folder.parent, (folder.name,))  # the folder the export made, if nothing else is in it
    return n


def abandon(w: Any, folder: str | os.PathLike, stage: Path) -> str:
    """After a failed export: remove the staging folder and the pending record; returns what was
    done (for the error message). A failure here leaves the record for the next command's sweep."""
    folder = Path(os.path.abspath(folder))
    try:
        p = pending(read_meta(w.path)).get(str(folder))
        n = _remove_tree(stage)
        if p is not None and p.get("created"):
            _rmdir_empty(folder.parent, (folder.name,))
        _update(w, lambda cur: cur[PENDING].pop(str(folder), None))
    except OSError:
        return (f"the partial export in {stage} is removed by the next forgetful command that writes this warehouse; "
                "the warehouse is unchanged")
    done = f"{n} partial file(s) were removed" if n else "no export file was written"
    return f"{done}; {folder} was not registered and holds nothing new; the warehouse is unchanged"


def _swap_temps(e: ExportEntry) -> list[Path]:
    """Temporary files a forget's swap leaves in a registered folder (``.<name>.forget-<pid>``)."""
    dirs = [e.folder]
    if e.meds:
        dirs.append(e.folder / "metadata")
        if (e.folder / "data").is_dir() and not is_link(e.folder / "data"):
            dirs += [Path(d) for d, _, _ in os.walk(e.folder / "data", followlinks=False)]
    out = []
    for d in dirs:
        try:
            names = os.listdir(d)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in names:
            m = _SWAP_TEMP.match(name)
            if m and (m["name"] in PARQUET_FILES if not e.meds else m["name"].endswith(".parquet")):
                out.append(d / name)
    return out


def sweep(w: Any, meta: dict[str, str]) -> int:
    """Under the writer lock: remove what killed exports and forgets left in the folders they
    write (see the module docstring). Returns how many files were removed.

    An export writes into a staging folder ``<folder>/.forgetful-export-<pid>`` recorded under
    ``export_pending`` (folder, format, staging name, and, once written, each staged file's sha256),
    moves the files into place, and only then registers them. A killed export is undone here: the
    staging folder and any file already moved whose content it recorded are zeroed and removed. The
    temporary files (``.<name>.forget-<pid>``, of any pid) a killed forget left in registered folders
    are removed too.
    """
    n = 0
    for e in entries(meta):
        if is_link(e.folder):
            continue  # refused by the next forget (check_links); never entered
        for q in _swap_temps(e):
            zero_remove(q)
            n += 1
    todo = pending(meta)
    for folder, p in todo.items():
        if not is_link(Path(folder)):
            n += _undo(Path(folder), p)
    if todo:
        _update(w, lambda cur: [cur[PENDING].pop(f, None) for f in todo])
    return n
