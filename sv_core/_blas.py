"""Cap BLAS threads inside solver calls (threadpoolctl), not globally.

The maintained path does many small matrix-vector products; on a loaded machine, letting
OpenBLAS spread each of them over all cores costs far more in synchronisation than it saves
(``python -m sv_core.bench.delete --threads`` compares). ``single_thread(n)`` limits BLAS to one
thread for the duration of a solver call when ``n`` is large enough for BLAS to thread at all,
and restores the previous setting afterwards.

The limiter is a plain object (no generator-based context manager, no ``threadpool_limits``
re-discovery of the loaded libraries per call): the BLAS controllers are found once, and a call
costs a get and at most two sets of the thread count.
"""
from __future__ import annotations

import contextlib
from typing import Any

#: below this many keys BLAS calls are too small for OpenBLAS to thread; no limit is applied
MIN_KEYS = 192

_libs: list[Any] | None = None
_NULL = contextlib.nullcontext()


def _controllers() -> list[Any]:
    global _libs
    if _libs is None:
        try:
            from threadpoolctl import ThreadpoolController

            _libs = list(ThreadpoolController().select(user_api="blas").lib_controllers)
        except Exception:  # noqa: BLE001 - threadpoolctl is optional; no limiting without it
            _libs = []
    return _libs


class _SingleThread:
    """BLAS limited to one thread between ``__enter__`` and ``__exit__`` (re-entrant safe:
    each use restores what it found)."""

    __slots__ = ("_old",)

    def __init__(self) -> None:
        self._old: list[tuple[Any, int]] = []

    def __enter__(self) -> _SingleThread:
        old = []
        for lc in _controllers():
            k = lc.get_num_threads()
            if k is not None and k != 1:
                lc.set_num_threads(1)
                old.append((lc, k))
        self._old = old
        return self

    def __exit__(self, *exc: object) -> None:
        for lc, k in self._old:
            lc.set_num_threads(k)
        self._old = []


def single_thread(n: int) -> contextlib.AbstractContextManager[Any]:
    """Context manager: BLAS limited to one thread while it is open (if ``n >= MIN_KEYS``)."""
    if n < MIN_KEYS:
        return _NULL
    return _SingleThread()
