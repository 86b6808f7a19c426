"""Result files, written once and whole: a text or JSON file goes to a temporary file beside its
target, then :func:`os.replace` — a reader sees the old file or the complete new one, never a
half-written one; parent folders are made. The one writer of every command's result file
(``--json``), the report and the generated documents.
"""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["atomic_write_text", "write_json", "write_marked_block"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` via a temporary file in the same directory and
    :func:`os.replace`; the file gets ordinary permissions (``0o666`` minus the umask)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return out


def write_json(path: str | os.PathLike, obj: Any, indent: int = 2,
               default: Callable[[Any], Any] | None = None) -> Path:
    """``obj`` as indented JSON (and a final newline) to ``path``, atomically; returns the path.
    ``default`` converts what JSON cannot hold (``float`` for NumPy scalars)."""
    return atomic_write_text(path, json.dumps(obj, indent=indent, default=default) + "\n")


def write_marked_block(path: str | os.PathLike, begin: str, end: str, text: str) -> Path:
    """Replace what lies between the one ``begin`` … ``end`` marker pair of the document ``path``
    with ``text`` (a generated table), atomically. Raises ``SystemExit`` naming the markers when the
    document lacks exactly one ordered pair (left as it was)."""
    doc = Path(path).read_text(encoding="utf-8")
    if doc.count(begin) != 1 or doc.count(end) != 1 or doc.index(begin) > doc.index(end):
        raise SystemExit(f"{path}: needs one {begin} … {end} pair")
    head, rest = doc.split(begin)
    return atomic_write_text(path, f"{head}{begin}\n{text}\n{end}{rest.split(end, 1)[1]}")
