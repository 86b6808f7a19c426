"""Per-step wall time, CPU time and peak resident memory of a long job (``forgetful run-all``).

:class:`StepMeter` measures one step at a time. Peak RSS per step:

* ``"VmHWM"`` (Linux): before each step the kernel's high-water mark is reset by writing ``5`` to
  ``/proc/<pid>/clear_refs`` (of this process and of its live child processes), and after it
  ``VmHWM`` is read from ``/proc/<pid>/status`` — so each step's figure is that step's own peak;
* ``"ru_maxrss"`` (elsewhere, or where ``clear_refs`` cannot be written): ``resource.getrusage``'s
  high-water mark, which cannot be reset — a step's figure is then the peak of the process *so far*
  (an upper bound on the step's own peak).

Child processes: the peak of each child alive at the end of the step (its ``VmHWM``, reset with the
parent's) plus ``RUSAGE_CHILDREN``'s ``ru_maxrss`` when it rose during the step (the largest child
that ended in the step) are reported as ``children_peak_mb``; ``peak_mb`` is this process's peak
plus that; ``peak_rss_mb_max`` is the largest step's. ``start_rss_mb``: this process's resident
set when the step began — memory an earlier step left allocated (e.g. an allocator that has not
returned a large build's pages yet) counts in the next step's peak, so a step whose peak is its
start figure did not itself grow. CPU time is user + system of this process
and its ended children (``os.times``).

Resetting the high-water mark also resets what the kernel reports as the process's peak when it
exits, so an outer ``/usr/bin/time -v`` ("Maximum resident set size") then shows only the peak
since the last reset (the last step's): read the run's peak from ``peak_rss_mb_max``.
"""
from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

METHODS = {
    "VmHWM": "per-step peak: /proc/<pid>/status VmHWM after resetting it (/proc/<pid>/clear_refs = 5) "
             "before each step, this process plus its live children",
    "ru_maxrss": "process high-water mark so far (resource.getrusage ru_maxrss; cannot be reset between "
                 "steps, so a step's figure is an upper bound on its own peak)",
}


def _ru_maxrss_mb(who: int) -> float:
    v = resource.getrusage(who).ru_maxrss
    return v / 2**20 if sys.platform == "darwin" else v / 1024  # bytes on macOS, KiB on Linux


def children(pid: int | str = "self") -> list[int]:
    """Live descendant process ids of ``pid`` (Linux ``/proc/<pid>/task/*/children``; [] elsewhere)."""
    out: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for t in tasks:
        try:
            kids = [int(x) for x in (t / "children").read_text().split()]
        except (OSError, ValueError):
            continue
        for k in kids:
            out += [k, *children(k)]
    return out


def vm_hwm_mb(pid: int | str = "self") -> float | None:
    """``VmHWM`` of ``/proc/<pid>/status`` in MiB; None where it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def rss_mb() -> float:
    """This process's resident set now (``VmRSS``; the high-water mark so far where it cannot be read)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return _ru_maxrss_mb(resource.RUSAGE_SELF)


def reset_hwm(pid: int | str = "self") -> bool:
    """Reset the peak-RSS high-water mark of ``pid`` (``5`` into ``/proc/<pid>/clear_refs``)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class StepMeter:
    """Measure steps one after another: ``with meter.step(name): ...``; then :meth:`as_json`.

    ``seconds``, ``cpu_seconds``, ``peak_rss_mb`` and ``children_peak_rss_mb`` map step -> figure;
    ``method`` is ``"VmHWM"`` or ``"ru_maxrss"`` (see the module docstring)."""

    def __init__(self, method: str | None = None):
        if method is None:
            method = "VmHWM" if vm_hwm_mb() is not None and reset_hwm() else "ru_maxrss"
        if method not in METHODS:
            raise ValueError(f"method must be one of {sorted(METHODS)}; got {method!r}")
        self.method = method
        self.seconds: dict[str, float] = {}
        self.cpu_seconds: dict[str, float] = {}
        self.peak_rss_mb: dict[str, float] = {}
        self.children_peak_rss_mb: dict[str, float] = {}
        self.start_rss_mb: dict[str, float] = {}

    def _start(self, name: str):
        self.start_rss_mb[name] = round(rss_mb(), 1)
        if self.method == "VmHWM":
            for pid in ("self", *children()):
                reset_hwm(pid)
        t = os.times()
        return time.perf_counter(), t.user + t.system + t.children_user + t.children_system, \
            _ru_maxrss_mb(resource.RUSAGE_CHILDREN)

    def _stop(self, name: str, start) -> None:
        wall0, cpu0, kids0 = start
        t = os.times()
        self.seconds[name] = round(time.perf_counter() - wall0, 2)
        self.cpu_seconds[name] = round(t.user + t.system + t.children_user + t.children_system - cpu0, 2)
        kids_ended = _ru_maxrss_mb(resource.RUSAGE_CHILDREN)
        kids = kids_ended if kids_ended > kids0 else 0.0
        if self.method == "VmHWM":
            own = vm_hwm_mb() or 0.0
            kids += sum(vm_hwm_mb(p) or 0.0 for p in children())
        else:
            own = _ru_maxrss_mb(resource.RUSAGE_SELF)
        self.children_peak_rss_mb[name] = round(kids, 1)
        self.peak_rss_mb[name] = round(own + kids, 1)

    def step(self, name: str):
        """Context manager measuring the step ``name`` (recorded also when the step raises)."""
        meter = self

        class _Step:
            def __enter__(self):
                self.start = meter._start(name)
                return meter

            def __exit__(self, *exc):
                meter._stop(name, self.start)
                return False

        return _Step()

    def drop(self, name: str) -> None:
        """Forget a step that turned out not to run (e.g. skipped without torch)."""
        for d in (self.seconds, self.cpu_seconds, self.peak_rss_mb, self.children_peak_rss_mb, self.start_rss_mb):
            d.pop(name, None)

    def as_json(self) -> dict:
        """The figures for run-all's ``--json`` (beside its ``seconds``)."""
        return {"cpu_seconds": dict(self.cpu_seconds), "peak_rss_mb": dict(self.peak_rss_mb),
                "children_peak_rss_mb": dict(self.children_peak_rss_mb), "start_rss_mb": dict(self.start_rss_mb),
                "peak_rss_mb_max": max(self.peak_rss_mb.values(), default=0.0), "rss_method": self.method,
                "rss_method_note": METHODS[self.method]}
