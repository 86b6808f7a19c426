"""Test hooks for kill -9 at named points of a command (the kill-point machinery of the
issue-19 and ingest kill tests).

:func:`hit` is called at each point: when the environment variable ``env`` names the point
(``name``, or ``name#n`` for its n-th hit in this process) the process sends itself SIGKILL
there; with ``$FORGETFUL_KILL_TRACE`` set, every hit is appended to that file as ``name#n`` (a
dry run lists the points a test then kills at, one by one). Without either variable a hit is one
dictionary look-up. The forget's points (``$FORGETFUL_FORGET_KILL``) sit at every step of the
erasure: after the receipt, around each export file's swap, after the cache and stale marks,
around the warehouse's swap (:mod:`pipelines.store.forget`, :mod:`pipelines.store.exports`,
:mod:`pipelines.store.erasure`).
"""
from __future__ import annotations

import os
import signal
import sys

FORGET_KILL_ENV = "FORGETFUL_FORGET_KILL"
TRACE_ENV = "FORGETFUL_KILL_TRACE"
_counts: dict[str, int] = {}


def hit(name: str, env: str = FORGET_KILL_ENV) -> None:
    """Kill point ``name`` (see the module docstring)."""
    spec, trace = os.environ.get(env), os.environ.get(TRACE_ENV)
    if not spec and not trace:
        return
    n = _counts[name] = _counts.get(name, 0) + 1
    if trace:
        with open(trace, "a", encoding="ascii") as fh:
            fh.write(f"{name}#{n}\n")
    if spec in (name, f"{name}#{n}"):
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
