"""The ``forgetful`` command line.

Every flow module in :mod:`pipelines.flows` exposes ``add_cli(subparsers)``; this module discovers
them, so a new study is a new file, never an edit here.
"""
from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

# Local, offline use: no telemetry calls (the machine may have no network at all).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# Progress bars and the printed summaries carry the run; Prefect's per-task INFO lines would bury
# them. Set PREFECT_LOGGING_LEVEL=INFO to see every flow and task run.
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

from pipelines import flows as _flows


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="forgetful",
        description="Auditable support-vector memory: certified retention, verified deletion, "
        "clinical and synthetic studies as Prefect flows.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for info in sorted(pkgutil.iter_modules(_flows.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        try:
            module = importlib.import_module(f"pipelines.flows.{info.name}")
        except ImportError as exc:  # an optional extra is missing: say so, keep the rest usable
            print(f"forgetful: command module {info.name!r} unavailable ({exc})", file=sys.stderr)
            continue
        add = getattr(module, "add_cli", None)
        if add is not None:
            add(sub)
    return parser


def _quiet_run_failures() -> None:
    """Typed project errors are printed as one line by each command; Prefect's own ERROR log of
    the failed run (with a traceback) would repeat them. Unexpected errors still raise."""
    import logging

    for name in ("prefect.flow_runs", "prefect.task_runs"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if os.environ.get("PREFECT_LOGGING_LEVEL", "WARNING") != "INFO":
        _quiet_run_failures()
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    result = func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
