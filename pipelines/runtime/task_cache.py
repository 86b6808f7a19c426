"""Resumable task results without pickles: a keyed, authenticated JSON cache per warehouse.

Prefect's own result persistence stores cloudpickle payloads, and the serializer a stored record
names is the one used to read it back (``ResultRecord.deserialize``), so a file planted in the
result folder runs code on the next cache hit (a crafted record executed ``os.system``).
Record-level task results are therefore kept out of Prefect's result store
(``persist_result=False``) and cached here instead (:func:`cached`): beside the warehouse, keyed on
the task's source and parameters, canonical JSON with typed NumPy arrays (nothing can execute
code), each file authenticated by an HMAC, links never followed; a study served from the cache
reports the original computation's run time (:func:`take_tally`).
"""
from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import inspect
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

PATH_PARAMS = ("warehouse", "runs_dir")
_SAFE_KINDS = "biuf"


def _enc(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in _SAFE_KINDS:
            raise TypeError(f"array dtype {x.dtype} is not cacheable")
        a = np.ascontiguousarray(x)
        return {"__ndarray__": [a.dtype.str, list(a.shape), base64.b64encode(a.tobytes()).decode("ascii")]}
    if isinstance(x, dict):
        if "__ndarray__" in x:
            raise TypeError("reserved key __ndarray__")
        return {str(k): _enc(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_enc(v) for v in x]
    if isinstance(x, (np.bool_,)):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    if x is None or isinstance(x, (str, int, float, bool)):
        return x
    if dataclasses.is_dataclass(x) and not isinstance(x, type):  # settings in a key: type and every field
        return {"__dataclass__": type(x).__qualname__,
                **{f.name: _enc(getattr(x, f.name)) for f in dataclasses.fields(x)}}
    raise TypeError(f"{type(x).__name__} is not cacheable")


def _dec(x: Any) -> Any:
    if isinstance(x, dict):
        if set(x) == {"__ndarray__"}:
            dt, shape, data = x["__ndarray__"]
            dtype = np.dtype(str(dt))
            if dtype.kind not in _SAFE_KINDS:
                raise ValueError("unsafe dtype")
            return np.frombuffer(base64.b64decode(data), dtype=dtype).reshape([int(s) for s in shape]).copy()
        return {k: _dec(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_dec(v) for v in x]
    return x


def dumps(obj: Any) -> str:
    return json.dumps(_enc(obj), sort_keys=True, separators=(",", ":"))


def loads(text: str) -> Any:
    return _dec(json.loads(text))


def _source_digest(fn: Callable) -> str:
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        src = fn.__qualname__
    return hashlib.sha256(src.encode()).hexdigest()


def _pack(out: Any, start: float, end: float) -> str:
    """An entry's body: the result and when its computation ran (epoch seconds)."""
    return dumps({"computed": [float(start), float(end)], "result": out})


def _unpack(body: str) -> tuple[Any, tuple[float, float]]:
    d = loads(body)
    start, end = d["computed"]
    return d["result"], (float(start), float(end))


#: the entry layout, part of every key (an entry written by another :func:`_pack` is never read)
_LAYOUT = hashlib.sha256((inspect.getsource(_pack) + inspect.getsource(_unpack)).encode()).hexdigest()


@dataclass
class Tally:
    """The cached tasks of one flow run: how many were served from the cache and computed, the
    wall-clock spans (epoch seconds) of this run's cache hits and of their original computations."""

    hits: int = 0
    computed: int = 0
    hit_spans: list[tuple[float, float]] = field(default_factory=list)
    original_spans: list[tuple[float, float]] = field(default_factory=list)


_tallies: dict[str | None, Tally] = {}
_tally_lock = threading.Lock()


def run_key() -> str | None:
    """The flow run a cached task (or a flow body) belongs to: a task's ``flow_run_id``, else the
    current flow run; None outside Prefect."""
    if "prefect" not in sys.modules:
        return None
    try:
        from prefect.context import FlowRunContext, TaskRunContext

        t = TaskRunContext.get()
        if t is not None and t.task_run.flow_run_id is not None:
            return str(t.task_run.flow_run_id)
        f = FlowRunContext.get()
        if f is not None and f.flow_run is not None:
            return str(f.flow_run.id)
    except Exception:  # noqa: BLE001 - no context: the process-wide tally
        pass
    return None


def _record(hit: bool, span: tuple[float, float], original: tuple[float, float] | None = None) -> None:
    key = run_key()
    with _tally_lock:
        t = _tallies.setdefault(key, Tally())
        if hit:
            t.hits += 1
            t.hit_spans.append(span)
            t.original_spans.append(original)
        else:
            t.computed += 1


def take_tally(key: str | None) -> Tally | None:
    """The tally of the flow run ``key`` (see :func:`run_key`), removed; None if it had no cached task."""
    with _tally_lock:
        return _tallies.pop(key, None)


def covered(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of ``spans`` (tasks that ran side by side count once)."""
    total, end = 0.0, -float("inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def cached(fn: Callable) -> Callable:
    """Decorate a task body: results are cached per (task source, non-path parameters) in the
    cache of the ``warehouse`` parameter. Tasks without a warehouse run uncached.

    * location: :func:`pipelines.store.warehouse.cache_dir` — beside the warehouse, found from the
      warehouse path (never the current directory), removed by every forget;
    * key: task name + SHA-256 of the task's **source** + its parameters except paths (inputs +
      task source; the warehouse content hash is a parameter, so a changed warehouse never hits; a
      settings dataclass counts with its type and every field);
    * format: canonical JSON; NumPy arrays as ``{"__ndarray__": [dtype, shape, base64]}`` restricted
      to bool/int/uint/float dtypes and read with :func:`numpy.frombuffer`;
    * integrity: each file starts with an HMAC (cache sub-key, :mod:`pipelines.store.keys`) of its
      body; a file that fails it is deleted and recomputed (a forged result can never be served);
    * links: a cache folder found as a symbolic link is never followed — the link itself is removed
      (said on stderr) and a real owner-only folder made; entries are written owner-only with
      ``O_EXCL | O_NOFOLLOW`` (:mod:`pipelines.store.safe_io`);
    * run time: each entry records when its computation ran (start, end; :func:`_pack`). Every hit
      and miss is tallied per flow run (:func:`take_tally`), and
      :func:`pipelines.runtime.runner.write_study_result` puts the original seconds in ``runtime_s``
      and says so. The layout of an entry is part of the key (the source of :func:`_pack`), so an
      entry written in another layout is never read;
    * re-reading: ``fn.lookup(*args)`` of a cached ``fn`` returns ``(True, result)`` for an authentic
      entry without computing or tallying anything — a flow that returns only a small part of a
      task's result through the scheduler reads the rest back from here, batch by batch.
    """
    sig = inspect.signature(fn)
    digest = _source_digest(fn)

    def entry(args, kwargs):
        """(warehouse, cache folder, entry path, keys) of a call; warehouse None: uncached."""
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        warehouse = bound.arguments.get("warehouse")
        if not warehouse:
            return None, None, None, None
        from pipelines.store.keys import for_warehouse
        from pipelines.store.warehouse_files import cache_dir

        params = {k: v for k, v in bound.arguments.items() if k not in PATH_PARAMS}
        key = hashlib.sha256(dumps([fn.__qualname__, digest, _LAYOUT, params]).encode()).hexdigest()[:40]
        d = cache_dir(warehouse)
        return warehouse, d, d / f"{fn.__name__}-{key}.json", for_warehouse(warehouse)

    def read(p: Path, keys) -> tuple[bool, Any, tuple[float, float] | None]:
        if not p.is_file():
            return False, None, None
        try:
            mac, body = p.read_text().split("\n", 1)
            if keys.equal(keys.mac("cache", body.encode()), mac):
                out, original = _unpack(body)
                return True, out, original
        except (ValueError, OSError, KeyError, TypeError):
            pass
        p.unlink(missing_ok=True)  # tampered or truncated: recompute
        return False, None, None

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        warehouse, d, p, keys = entry(args, kwargs)
        if not warehouse:
            return fn(*args, **kwargs)
        t0 = time.time()
        hit, out, original = read(p, keys)
        if hit:
            _record(True, (t0, time.time()), original)
            return out
        t0 = time.time()
        out = fn(*args, **kwargs)
        t1 = time.time()
        _record(False, (t0, t1))
        body = _pack(out, t0, t1)
        from pipelines.store.safe_io import is_link, open_nofollow, remove_own_dir

        if is_link(d):
            remove_own_dir(d, "task cache folder")
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = d / f".{p.name}.tmp{os.getpid()}-{id(out)}"
        fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, "task cache entry")
        with os.fdopen(fd, "w") as fh:
            fh.write(keys.mac("cache", body.encode()) + "\n" + body)
        os.replace(tmp, p)
        return out

    def lookup(*args, **kwargs) -> tuple[bool, Any]:
        """``(True, result)`` when the call's authenticated entry is in the cache, else
        ``(False, None)``; computes nothing and is not tallied (a flow re-reading the entries its
        own tasks wrote, e.g. to persist them batch by batch, is not a cache hit)."""
        warehouse, _, p, keys = entry(args, kwargs)
        if not warehouse:
            return False, None
        hit, out, _ = read(p, keys)
        return hit, out

    wrapper.lookup = lookup  # type: ignore[attr-defined]
    return wrapper


def clear(warehouse: str | os.PathLike) -> None:
    """Remove the warehouse's task cache (a link in its place: the link only, never its target)."""
    from pipelines.store.safe_io import remove_own_dir
    from pipelines.store.warehouse_files import cache_dir

    remove_own_dir(cache_dir(Path(warehouse)), "task cache folder")
