"""The forget registries of one configuration, by source: which receipt logs every build,
export and ingest of a source consults, wherever its warehouse lives.

A forget registry is the receipt log of one warehouse (:mod:`pipelines.receipts.ledger`, by
default ``<warehouse folder>/forget-registry``). A second warehouse built from the same source by
the same user must still keep every patient out that the first one's registry names, so the
configuration (the config folder that holds the keys, :func:`pipelines.store.keys.config_dir`)
keeps an index, ``<config dir>/registries.json``::

    {"version": 1, "sources": {"<source key>": ["<log folder>", ...]}}

A log folder joins its source's list when a forget commits a receipt to it (or a build finds
receipts in it). :meth:`pipelines.store.warehouse.Warehouse.registry` is then the union of the
warehouse's own log and every other log listed for its source; each is verified like the
warehouse's own (MACs, signed heads, anchor), and one that cannot be read is
:class:`~pipelines.errors.RegistryUnreadableError` (one line, exit 3): nothing is built without it.

The *source key* (:func:`source_key`) names the data, not a warehouse: ``demo``; ``synthetic``
with its size and seed; otherwise the adapter and the resolved source folder
(``mimic:/data/mimiciv/3.1``). The index is written atomically, owner-only, never through a
link, under its own lock (two forgets on two warehouses may add at once).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

from pipelines.errors import RegistryUnreadableError
from pipelines.store.keys import config_dir
from pipelines.store.safe_io import open_nofollow, refuse_link

INDEX = "registries.json"
INDEX_FORMAT = 1


def source_key(source: str, root: str | os.PathLike | None = None, *, stays: int | None = None,
               seed: int | None = None) -> str:
    """The data a build reads, as a key of the index (see the module docstring)."""
    if source == "demo":
        return "demo"
    if source == "synthetic":
        return f"synthetic:stays={int(stays or 0)}:seed={int(seed or 0)}"
    return f"{source}:{os.path.realpath(root) if root is not None else ''}"


def index_path() -> Path:
    return config_dir() / INDEX


def load() -> dict[str, list[str]]:
    """Source key -> log folders (empty without an index). An unreadable index, or one that is a
    link, is refused: it is what keeps forgotten patients out of every other warehouse."""
    p = index_path()
    refuse_link(p, "registry index")
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise RegistryUnreadableError(f"the registry index {p} cannot be read ({type(exc).__name__}); "
                                      "restore it from your backup (docs/DELETION.md)") from None
    try:
        d = json.loads(text)
        sources = d["sources"]
        if d.get("version") != INDEX_FORMAT or not isinstance(sources, dict) or not all(
                isinstance(k, str) and isinstance(v, list) and all(isinstance(x, str) for x in v)
                for k, v in sources.items()):
            raise ValueError("shape")
    except (ValueError, KeyError, TypeError, AttributeError):
        raise RegistryUnreadableError(f"the registry index {p} is not a forgetful index (edited or truncated); "
                                      "restore it from your backup (docs/DELETION.md)") from None
    return sources


def ledgers(key: str | None) -> list[Path]:
    """The log folders the configuration keeps for source ``key``."""
    return [Path(x) for x in load().get(key, [])] if key else []


@contextlib.contextmanager
def _locked():
    d = config_dir()
    refuse_link(d, "configuration folder")
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = open_nofollow(d / f".{INDEX}.lock", os.O_RDWR | os.O_CREAT, "registry index lock file")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def add(key: str | None, ledger_dir: str | os.PathLike) -> bool:
    """List ``ledger_dir`` for source ``key`` (idempotent); returns whether the index changed."""
    if not key:
        return False
    d = str(Path(ledger_dir).resolve())
    with _locked():
        cur = load()
        if d in cur.get(key, []):
            return False
        cur[key] = [*cur.get(key, []), d]
        p = index_path()
        tmp = p.parent / f".{INDEX}.tmp{os.getpid()}"
        tmp.unlink(missing_ok=True)
        fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, "registry index")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps({"version": INDEX_FORMAT, "sources": cur}, indent=1, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)  # replaces a link in its place, never its target
    return True


def unreadable(key: str, ledger_dir: Path, exc: BaseException) -> RegistryUnreadableError:
    """The refusal for a listed log that cannot be read (verified)."""
    reason = getattr(exc, "reason", None) or str(exc)
    return RegistryUnreadableError(
        f"the forget registry {ledger_dir} that this configuration keeps for source {key!r} cannot be read "
        f"({type(exc).__name__}: {reason}); nothing was changed: restore it from your backup (docs/DELETION.md); "
        f"only to let its forgotten patients back deliberately, remove it from {index_path()}")
