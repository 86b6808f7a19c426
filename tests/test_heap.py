"""pipelines.runtime.heap: freed heap pages go back to the kernel between run-all's steps (glibc's
malloc_trim), a guarded no-op where the C library is not glibc."""
import subprocess
import sys
import textwrap

import pytest

from pipelines.runtime import heap

GLIBC = heap._find_trim(sys.platform, __import__("platform").libc_ver()[0]) is not None

# fragmented free memory below the heap's top: 2,400 blocks of 64 KB (below glibc's mmap
# threshold, so they sit in the heap) written and freed, all but the last one, which pins the top,
# so glibc's automatic top-trim cannot give them back
FRAGMENT = textwrap.dedent("""
    import ctypes
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    def fragment(n=2400, size=64 * 1024):
        ps = [libc.malloc(size) for _ in range(n)]
        for p in ps:
            ctypes.memset(p, 1, size)
        for p in ps[:-1]:
            libc.free(p)
        return ps[-1]
    def rss_mb():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
""")


def _run(body: str) -> str:
    r = subprocess.run([sys.executable, "-c", FRAGMENT + textwrap.dedent(body)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


@pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's")
def test_release_returns_fragmented_free_pages_on_glibc():
    before, freed, after = (float(x) for x in _run("""
        base = rss_mb()
        keep = fragment()
        freed = rss_mb()
        from pipelines.runtime import heap
        assert heap.release() is True
        print(base, freed, rss_mb())
    """))
    assert freed - before > 120  # the freed blocks stayed resident (150 MB written)
    assert freed - after > 120  # and release gave them back


def test_no_trim_where_the_c_library_is_not_glibc():
    assert heap._find_trim("darwin", "") is None
    assert heap._find_trim("win32", "") is None
    assert heap._find_trim("linux", "") is None  # musl: platform.libc_ver() names no glibc
    if GLIBC:
        assert callable(heap._find_trim("linux", "glibc"))


def test_release_is_a_no_op_without_malloc_trim(monkeypatch):
    monkeypatch.setattr(heap, "_LOOKED", True)
    monkeypatch.setattr(heap, "_TRIM", None)
    assert heap.release() is False
    calls = []
    monkeypatch.setattr(heap, "_TRIM", lambda pad: calls.append(pad) or 1)
    assert heap.release() is True and calls == [0]


@pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's")
def test_run_all_frees_what_a_finished_step_left_before_the_next_starts():
    """A stand-in step leaves 150 MB of freed, fragmented heap; the next step's start RSS does not
    count it (it would without the release between steps)."""
    out = _run("""
        from pipelines.flows import run_all
        keep = []
        def fake_step(step, *a, **k):
            if step == "retention":
                keep.append(fragment())
            return True
        run_all._run_step = fake_step
        run = run_all.Run("demo", None, "w.duckdb", "runs", "r.html", run_all.RunAllSettings(), False, lambda: None)
        m = run_all._run_steps(["build-cohort", "retention", "heldout-spo2"], run)
        print(m.start_rss_mb["retention"], m.start_rss_mb["heldout-spo2"], m.peak_rss_mb["retention"])
    """)
    start_ret, start_next, peak_ret = (float(x) for x in out)
    assert peak_ret - start_ret > 120  # the step did hold the memory
    assert start_next - start_ret < 40  # and the next step does not start with it
