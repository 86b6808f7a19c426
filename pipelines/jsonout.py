"""``--json PATH``, the same on every ``forgetful`` command: write the command's machine-readable
result (the dict it prints or the study result it stores) to PATH as JSON. Nothing else changes:
the console output, the stored ``runs/<study>/result.json`` and the exit code stay as they are.

Imports nothing heavy (no torch, no Prefect), so commands that need no server stay light.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

HELP = "also write the machine-readable result to PATH (JSON; the console output is unchanged)"


def add_json_arg(p) -> None:
    """Add ``--json PATH`` to the (sub)parser ``p``."""
    p.add_argument("--json", default=None, metavar="PATH", type=Path, help=HELP)


def _plain(x: Any) -> Any:
    """JSON-safe: numpy scalars/arrays to Python, NaN/inf to null, paths and tuples to str/list."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if hasattr(x, "tolist") and callable(x.tolist):  # numpy arrays and scalars
        return _plain(x.tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


def emit(args, obj: Any) -> Path | None:
    """Write ``obj`` to ``args.json`` (atomically) when the option was given; returns the path."""
    path = getattr(args, "json", None)
    if not path:
        return None
    from sv_core.jsonfile import write_json

    return write_json(Path(path), _plain(obj))


def emit_file(args, result_path: str | Path) -> Path | None:
    """``--json PATH`` for a command whose result is already a JSON file (a study result)."""
    if not getattr(args, "json", None):
        return None
    return emit(args, json.loads(Path(result_path).read_text(encoding="utf-8")))
