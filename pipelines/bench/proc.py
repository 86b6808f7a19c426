"""One command measured as a benchmark measures it (:mod:`pipelines.bench.scale`): wall seconds,
CPU seconds of the command and the children it waited for, its own peak RSS, the sampled RSS
of its process group, the load average, its exit code; a timeout stops its process group."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def group_rss(pgid: int, leave_out: int | None = None) -> int | None:
    """Sum of the resident set sizes (bytes) of the processes in process group ``pgid`` (from
    ``/proc``; None where there is none), ``leave_out`` (e.g. the launcher) not counted."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for d in proc.iterdir():
        if not d.name.isdigit() or int(d.name) == leave_out:
            continue
        try:
            stat = (d / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, pgrp, ...
            if int(fields[2]) != pgid:
                continue
            total += int((d / "statm").read_text().split()[1]) * page
        except (OSError, ValueError, IndexError):  # the process ended meanwhile
            continue
    return total


#: Launches a command by fork + exec and reports the command's own rusage. A child started straight
#: from this (large) process would inherit its peak RSS: Linux records the old address space's
#: high-water mark at exec, and subprocess may vfork. The launcher is a small interpreter, so the
#: command's ``ru_maxrss`` is its own (floor: the launcher's small interpreter).
LAUNCHER = """
import json, os, sys
pid = os.fork()
if pid == 0:
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    finally:
        os._exit(127)
_, status, ru = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    json.dump({"maxrss_kb": ru.ru_maxrss, "cpu_s": ru.ru_utime + ru.ru_stime}, f)
code = os.waitstatus_to_exitcode(status)
sys.exit(code if code >= 0 else 128 - code)
"""


def measure(argv: list[str], env: dict, cwd: Path, log_stem: Path, timeout: float | None = None) -> dict:
    """Run ``argv`` in its own process group through :data:`LAUNCHER`; wall seconds, CPU (user +
    system of the command and the children it waited for), peak RSS (the command's
    ``ru_maxrss``: its largest process), tree RSS (largest sampled sum over its process group,
    from ``/proc`` every 0.25 s), load at start and end, exit code. Its stdout and stderr go to
    ``<log_stem>.out`` / ``.err``; after ``timeout`` seconds the group gets SIGTERM, 15 s later
    SIGKILL."""
    log_stem.parent.mkdir(parents=True, exist_ok=True)
    ru_file = Path(f"{log_stem}.rusage.json")
    ru_file.unlink(missing_ok=True)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    with open(f"{log_stem}.out", "wb") as out, open(f"{log_stem}.err", "wb") as err:
        p = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(ru_file), *argv], env=env or None, cwd=cwd,
                             stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
    tree, timed_out, killed_at = None, False, None
    try:
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            g = group_rss(p.pid, leave_out=p.pid)  # the command's process group, launcher left out
            if g is not None:
                tree = max(tree or 0, g)
            el = time.perf_counter() - t0
            if timeout and el > timeout and killed_at is None:
                timed_out, killed_at = True, el
                os.killpg(p.pid, signal.SIGTERM)
            elif killed_at is not None and el > killed_at + 15:
                os.killpg(p.pid, signal.SIGKILL)
            time.sleep(0.25)
    except BaseException:
        os.killpg(p.pid, signal.SIGKILL)
        os.waitpid(p.pid, 0)
        p.returncode = -9
        raise
    p.returncode = rc = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    own = json.loads(ru_file.read_text()) if ru_file.is_file() else None
    ru_file.unlink(missing_ok=True)
    maxrss_kb = own["maxrss_kb"] if own else ru.ru_maxrss  # killed launcher: the inherited figure
    return {"wall_s": round(wall, 2), "cpu_s": round(ru.ru_utime + ru.ru_stime, 2),
            "peak_rss_mb": round(maxrss_kb / 1024, 1), "tree_rss_mb": None if tree is None else round(tree / 2**20, 1),
            "load_start": round(load0, 2), "load_end": round(os.getloadavg()[0], 2),
            "rc": rc, "timed_out": timed_out}


def last_json(path: str | Path) -> dict | None:
    """The last JSON object line a command printed (None if there is none)."""
    try:
        lines = Path(path).read_text(errors="replace").strip().splitlines()
    except OSError:
        return None
    for ln in reversed(lines):
        if ln.startswith("{"):
            try:
                return json.loads(ln)
            except ValueError:
                return None
    return None
