"""One writer at a time per warehouse: an advisory ``flock`` on ``<warehouse>.lock``.

Commands that change a warehouse (build, forget, every study flow) take it exclusively; read-only
commands (``receipts verify|list``) take it shared. A second command waits up to ``wait``
seconds, saying so once on stderr, then raises :class:`WarehouseBusyError` (one typed line).
The lock is re-entrant within a process (a flow calling another flow) and is released by the
kernel when a process dies, so a ``kill -9`` never leaves it held. Temporary files that a
killed command left (``.<name>.building-PID``, ``.<name>.forget-PID``, ``.<name>.ingest-init-PID``
…, and half-written task-cache entries) are removed by the next exclusive holder
(:func:`clean_stale`) whatever their pid, but this process's own: under the exclusive lock no other
command writes this warehouse, so every such file is an orphan (a pid, once dead, may be reused
by an unrelated process, which must not keep an orphan alive).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import sys
import threading
import time
from pathlib import Path

from pipelines.errors import WarehouseBusyError

WAIT_ENV = "FORGETFUL_LOCK_WAIT"
DEFAULT_WAIT_S = 300.0
_held: dict[str, list] = {}  # path -> [fd, mode, depth]
_mutex = threading.RLock()
_CACHE_TEMP = re.compile(r"^\..+\.json\.tmp(?P<pid>\d+)-\d+$")
_TEMP = re.compile(r"^\.(?P<name>.+)\.(building|forget|ingest-init)-(?P<pid>\d+)(\.wal|\.spill|\.buckets|\.tmp)?$")


def lock_path(warehouse: str | os.PathLike) -> Path:
    p = Path(warehouse).resolve()
    return p.parent / (p.name + ".lock")


@contextlib.contextmanager
def hold(warehouse: str | os.PathLike, exclusive: bool = True, wait: float | None = None):
    """Hold the warehouse lock for the ``with`` block (re-entrant; shared → exclusive upgrades)."""
    wait = float(os.environ.get(WAIT_ENV, DEFAULT_WAIT_S)) if wait is None else float(wait)
    lp = lock_path(warehouse)
    key = str(lp)
    with _mutex:
        ent = _held.get(key)
        if ent is not None and (ent[1] or not exclusive):
            ent[2] += 1
            try:
                yield
            finally:
                ent[2] -= 1
            return
    lp.parent.mkdir(parents=True, exist_ok=True)
    if ent is None:
        from pipelines.store.safe_io import open_nofollow

        fd = open_nofollow(lp, os.O_RDWR | os.O_CREAT, "warehouse lock file")
    else:
        fd = ent[0]
    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    t0 = time.monotonic()
    said = False
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() - t0 >= wait:
                if ent is None:
                    os.close(fd)
                raise WarehouseBusyError(
                    f"another forgetful command is using {Path(warehouse).name} (waited {wait:.0f} s); "
                    "retry when it finishes, or raise FORGETFUL_LOCK_WAIT / --wait") from None
            if not said:
                print(f"[forgetful] waiting for {Path(warehouse).name}: another command holds it "
                      f"(up to {wait:.0f} s)", file=sys.stderr, flush=True)
                said = True
            time.sleep(0.1)
    prev_mode = None if ent is None else ent[1]
    with _mutex:
        if ent is None:
            ent = _held[key] = [fd, exclusive, 1]
        else:
            ent[1], ent[2] = True, ent[2] + 1
    try:
        yield
    finally:
        with _mutex:
            ent[2] -= 1
            if prev_mode is not None:  # an upgrade inside a shared hold: go back to shared
                fcntl.flock(fd, fcntl.LOCK_SH)
                ent[1] = prev_mode
            elif ent[2] == 0:
                del _held[key]
                os.close(fd)


def depth(warehouse: str | os.PathLike) -> int:
    """How many nested holds of ``warehouse``'s lock this process has (0: none)."""
    with _mutex:
        ent = _held.get(str(lock_path(warehouse)))
        return 0 if ent is None else int(ent[2])


def clean_stale(warehouse: str | os.PathLike) -> int:
    """Remove the temporary build/forget files beside ``warehouse`` and the task cache's
    half-written entries, of every process but this one (call with the exclusive lock held:
    see the module docstring). Returns how many were removed."""
    p = Path(warehouse).resolve()
    n = 0
    if not p.parent.is_dir():
        return 0
    for q in p.parent.iterdir():
        m = _TEMP.match(q.name)
        if not m or m["name"] != p.name or int(m["pid"]) == os.getpid():
            continue
        if q.is_dir() and not q.is_symlink():
            shutil.rmtree(q, ignore_errors=True)
        else:
            q.unlink(missing_ok=True)  # a file, or a link (removed itself, never followed)
        n += 1
    cache = p.parent / f".{p.name}.cache"  # pipelines.runtime.task_cache: ``.<entry>.tmp<PID>-<n>`` of a killed writer
    if cache.is_dir() and not cache.is_symlink():
        for q in cache.iterdir():
            m = _CACHE_TEMP.match(q.name)
            if m and int(m["pid"]) != os.getpid():
                q.unlink(missing_ok=True)
                n += 1
    return n
