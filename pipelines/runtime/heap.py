"""Give memory a finished step freed back to the operating system.

CPython and NumPy return freed blocks to the C allocator, not to the kernel. With glibc, blocks
below the mmap threshold (which grows up to 32 MB as large blocks are freed: most per-stay n × n
matrices) live in malloc arenas — one per thread that allocated, so the study's worker threads
each keep their own — and an arena's free pages stay resident until glibc trims them, which it does
only at the top of the main heap. So a step of ``forgetful run-all`` can leave freed memory
resident, and the next step's peak counts it; how much varies from step to step. The rest of
what a step leaves is not free heap (imported modules, native libraries' own caches, live objects).

:func:`release` collects Python garbage and then asks glibc to return every arena's free pages
(``malloc_trim(0)``; glibc ≥ 2.8 releases whole free pages inside each arena with
``madvise(MADV_DONTNEED)``, not only the heap's top). Elsewhere (macOS, musl, Windows) it is a
no-op that says so: those allocators return memory on their own terms and have no such call.
"""
from __future__ import annotations

import ctypes
import gc
import platform
import sys
from collections.abc import Callable

_TRIM: Callable[[int], int] | None = None
_LOOKED = False


def malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` of this process, or None where the C library is not glibc."""
    global _TRIM, _LOOKED
    if not _LOOKED:
        _LOOKED = True
        _TRIM = _find_trim(sys.platform, platform.libc_ver()[0])
    return _TRIM


def _find_trim(system: str, libc: str) -> Callable[[int], int] | None:
    if not system.startswith("linux") or libc != "glibc":
        return None
    try:
        fn = ctypes.CDLL(None).malloc_trim  # the C library already loaded into the interpreter
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def release() -> bool:
    """Collect garbage, then return free heap pages to the kernel (glibc only).

    Returns True when ``malloc_trim`` ran (whether or not it found pages to release), False where
    there is no such call (a no-op apart from the garbage collection)."""
    gc.collect()
    fn = malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True
