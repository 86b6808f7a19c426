"""Shared plumbing of the ``study_*`` flows: arguments, result writing, console tables.

No ``add_cli`` here; the study flows import it.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def default_out(study: str) -> Path:
    return Path("runs") / study / "result.json"


def add_common_args(p: argparse.ArgumentParser, study: str, trials: int | None) -> None:
    p.add_argument("--out", type=Path, default=default_out(study), help=f"result JSON (default {default_out(study)})")
    p.add_argument("--seed", type=int, default=0, help="random seed of the trials (default %(default)s)")
    if trials is not None:
        p.add_argument("--trials", type=int, default=trials, help=f"trials (full run: {trials})")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    from pipelines.jsonout import add_json_arg

    add_json_arg(p)  # a copy of the study result


def write_result(result: dict[str, Any], out: Path) -> Path:
    """Validate against dashboards/SCHEMA.md and write atomically."""
    from dashboards.schema import write_result as _write

    return _write(result, out)


def print_summary(result: dict[str, Any], path: Path) -> None:
    print(f"{result['title']}  ({result['runtime_s']:.1f} s)")
    for tab in result.get("tables", []):
        print(f"\n{tab['title']}")
        print(" | ".join(tab["columns"]))
        for row in tab["rows"]:
            print(" | ".join(f"{c:.4g}" if isinstance(c, float) else str(c) for c in row))
    for c in result.get("claims", []):
        print(f"\nclaim: {c['statement']} -> holds={c.get('holds')} value={json.dumps(c.get('value'))}")
    print(f"\nwrote {path}")


def finish(args: argparse.Namespace, path: str | Path) -> int:
    """Print the stored result's summary and honour ``--json PATH``."""
    from pipelines.jsonout import emit_file

    p = Path(path)
    print_summary(json.loads(p.read_text()), p)
    emit_file(args, p)
    return 0
