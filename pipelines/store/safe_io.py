"""File-system safety where forgetful erases or rewrites, and typed storage failures.

**Links are never followed where the project erases or rewrites.** A path the project rewrites
in place (the warehouse, its WAL, an export file or folder) that is a symbolic link is refused
with one typed line (:class:`UnsafePathError`): :func:`refuse_link` checks with ``lstat`` before
anything is changed, and :func:`open_nofollow` opens with ``O_NOFOLLOW`` so a link planted after
the check fails the open instead of redirecting a write. The project's own task-cache folder
found as a link is not followed either: :func:`remove_own_dir` removes the link itself (its
target is never touched) and says so on stderr.

**Storage failures are typed.** :func:`storage_errno` recognises a full disk, an exhausted quota,
a read-only file system, a refused permission or an I/O error, whether Python raised it
(``OSError.errno``) or DuckDB, Polars or Arrow did (their message carries the C library's text,
e.g. "No space left on device"); :func:`storage_errors` turns such an error into :class:`StorageError` (exit 4) with
what was being done and what state was left. Everything else is re-raised unchanged.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import sys
from collections.abc import Callable
from pathlib import Path

from pipelines.errors import StorageError, UnsafePathError

#: errno -> what it means for the user
STORAGE_ERRNOS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exhausted",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EIO: "an input/output error",
}


#: libraries whose I/O errors carry the errno only as text ("No space left on device")
_TEXT_ERRORS = ("duckdb", "_duckdb", "polars", "pyarrow")


def storage_errno(exc: BaseException) -> int | None:
    """The storage errno behind ``exc`` (see :data:`STORAGE_ERRNOS`), or None."""
    if isinstance(exc, StorageError):
        return exc.errno
    if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
        return int(exc.errno)
    if type(exc).__module__.split(".")[0] in _TEXT_ERRORS:  # the C library's text inside their message
        text = str(exc)
        for code in STORAGE_ERRNOS:
            if os.strerror(code) in text:
                return code
    return None


def describe(exc: BaseException) -> str:
    """``"the disk is full (ENOSPC)"`` for a storage error."""
    code = storage_errno(exc)
    if code is None:
        return type(exc).__name__
    return f"{STORAGE_ERRNOS[code]} ({errno.errorcode.get(code, code)})"


@contextlib.contextmanager
def storage_errors(doing: str, state: str | Callable[[], str]):
    """Turn a storage failure inside the block into one :class:`StorageError` line:
    ``"<doing>: <what happened>; <state>"``. ``state`` (or its callable, evaluated at failure
    time) says what was left, e.g. "nothing was changed". Other errors pass unchanged."""
    try:
        yield
    except StorageError:
        raise
    except Exception as exc:
        code = storage_errno(exc)
        if code is None:
            raise
        where = getattr(exc, "filename", None)
        st = state() if callable(state) else state
        raise StorageError(f"{doing}: {describe(exc)}{f' at {where}' if where else ''}; {st}", code) from exc


# ------------------------------------------------------------------------------ links
def is_link(path: str | os.PathLike) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def refuse_link(path: str | os.PathLike, what: str) -> None:
    """Raise :class:`UnsafePathError` if ``path`` itself (its last component) is a symbolic link."""
    if is_link(path):
        raise UnsafePathError(f"{what} {path} is a symbolic link; forgetful never erases or rewrites through a "
                              "link (its target could be any file): replace the link by the real file or folder, "
                              "or remove it, and rerun; nothing was changed")


def open_nofollow(path: str | os.PathLike, flags: int, what: str, mode: int = 0o600) -> int:
    """``os.open`` with ``O_NOFOLLOW``: a link in place of ``path`` is :class:`UnsafePathError`."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            refuse_link(path, what)
        raise


def remove_own_dir(path: str | os.PathLike, what: str) -> bool:
    """Remove a folder the project owns (the task cache). A symbolic link in its place is
    removed itself — its target is never entered — and said once on stderr. Errors raise
    (a storage failure is for the caller to type). Returns whether anything was removed."""
    p = Path(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode):
        os.unlink(p)
        print(f"[forgetful] {what} {p} was a symbolic link: removed the link only, its target was not touched "
              "(delete the target yourself if it holds this warehouse's cache)", file=sys.stderr)
    elif stat.S_ISDIR(st.st_mode):
        shutil.rmtree(p)  # never follows a link inside (fd-based)
    else:
        os.unlink(p)
    return True


def replace_private(path: Path, data: bytes) -> None:
    """Replace ``path`` by ``data`` atomically (a 0600 temporary file, fsynced, renamed over it,
    the folder fsynced): a reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
