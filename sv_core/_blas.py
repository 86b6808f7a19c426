"""Cap BLAS threads inside solver calls (threadpoolctl), not globally.

The maintained path does many small matrix-vector products; on a loaded machine, letting
OpenBLAS spread each of them over all cores costs far more in synchronisation than it saves
(a deletion at n = 1024 went from ~0.5 ms to 16-18 ms). ``single_thread(n)`` limits BLAS to one
thread for the duration of a solver call when ``n`` is large enough for BLAS to thread at all,
and restores the previous setting afterwards.
"""
from __future__ import annotations

import contextlib

#: below this many keys BLAS calls are too small for OpenBLAS to thread; no limit is applied
MIN_KEYS = 192

_libs = None


def _controllers():
    global _libs
    if _libs is None:
        try:
            from threadpoolctl import ThreadpoolController

            _libs = [lc for lc in ThreadpoolController().select(user_api="blas").lib_controllers]
        except Exception:  # noqa: BLE001 - threadpoolctl is optional; no limiting without it
            _libs = []
    return _libs


@contextlib.contextmanager
def single_thread(n: int):
    """Context manager: BLAS limited to one thread while it is open (if ``n >= MIN_KEYS``)."""
    if n < MIN_KEYS:
        yield
        return
    libs = _controllers()
    old = []
    for lc in libs:
        k = lc.get_num_threads()
        old.append(k)
        if k != 1:
            lc.set_num_threads(1)
    try:
        yield
    finally:
        for lc, k in zip(libs, old):
            if k != 1:
                lc.set_num_threads(k)
