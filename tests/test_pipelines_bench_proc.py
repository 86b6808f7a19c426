"""The process measurement of the scale benchmark (:mod:`pipelines.bench.proc`): the process-group
RSS from /proc, the command's own CPU and peak RSS against a process tree whose sizes the test
sets, and the result line a command prints."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from pipelines.bench.proc import group_rss, last_json, measure

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="process-group RSS reads /proc")

#: a process that touches MB megabytes, says so on stdout and sleeps
HOLD = ("import sys, time; b = bytearray({mb} * 2**20); b[::4096] = b'x' * len(b[::4096]); "
        "print('ready', flush=True); time.sleep({sleep})")


def test_group_rss_counts_every_process_of_the_group_and_leaves_out_one():
    p = subprocess.Popen([sys.executable, "-c", HOLD.format(mb=120, sleep=30)], stdout=subprocess.PIPE,
                         start_new_session=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
        total = group_rss(p.pid)
        assert total is not None and total >= 120 * 2**20
        assert group_rss(p.pid, leave_out=p.pid) == 0  # the only member left out
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    assert group_rss(p.pid) == 0  # the group is gone


def test_measure_peak_is_the_largest_process_tree_rss_the_sum(tmp_path):
    """A parent of 60 MB that waits for a child of 200 MB: ru_maxrss is the child's (the largest
    process), the sampled group sum holds both, CPU includes the waited-for child."""
    code = textwrap.dedent(f"""
        import subprocess, sys
        b = bytearray(60 * 2**20); b[::4096] = b'x' * len(b[::4096])
        child = {HOLD.format(mb=200, sleep=1.5)!r} + "; sum(range(3_000_000))"
        sys.exit(subprocess.call([sys.executable, "-c", child], stdout=subprocess.DEVNULL) + 5)
    """)
    run = measure([sys.executable, "-c", code], {}, tmp_path, tmp_path / "tree")
    assert run["rc"] == 5 and not run["timed_out"]
    assert 200 <= run["peak_rss_mb"] < 260  # the child, not parent + child
    assert run["tree_rss_mb"] >= 260  # both at once, sampled while the child slept
    assert run["cpu_s"] > 0 and run["wall_s"] >= 1.5
    assert run["load_start"] >= 0 and run["load_end"] >= 0
    assert not (tmp_path / "tree.rusage.json").exists()  # the launcher's file is cleaned up


def test_measure_timeout_stops_the_whole_group(tmp_path):
    marker = tmp_path / "grandchild.pid"
    code = textwrap.dedent(f"""
        import subprocess, sys, time
        g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open({str(marker)!r}, "w").write(str(g.pid))
        time.sleep(120)
    """)
    t = time.perf_counter()
    run = measure([sys.executable, "-c", code], {}, tmp_path, tmp_path / "slow", timeout=3)
    assert run["timed_out"] and run["rc"] != 0 and time.perf_counter() - t < 60
    pid = int(marker.read_text())
    for _ in range(50):  # the grandchild got the group's SIGTERM too
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the command's child outlived the timeout")


def test_measure_output_goes_to_the_logs(tmp_path):
    run = measure([sys.executable, "-c", "import sys; print('{\"a\": 1}'); print('oops', file=sys.stderr)"], {},
                  tmp_path, tmp_path / "logs" / "x")
    assert run["rc"] == 0
    assert last_json(tmp_path / "logs" / "x.out") == {"a": 1}
    assert (tmp_path / "logs" / "x.err").read_text().strip() == "oops"


def test_last_json_takes_the_last_object_line(tmp_path):
    f = tmp_path / "out.txt"
    f.write_text('{"n": 1}\nprogress 50%\n{"n": 2, "s": "x"}\ndone\n')
    assert last_json(f) == {"n": 2, "s": "x"}
    f.write_text('{"n": 1}\n{"n": 2, broken\n')
    assert last_json(f) is None  # the last object line is broken: no figure rather than an older one
    f.write_text("no json here\n")
    assert last_json(f) is None
    assert last_json(tmp_path / "missing.txt") is None
