"""A generated block of a document against the committed result file it is rendered from."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def assert_block_renders(result: str, begin: str, end: str, render, doc: str = "docs/COMMANDS.md") -> dict:
    """``doc`` holds ``render(result file)`` between ``begin`` and ``end``; returns the result (skips the
    test when the result file is not committed)."""
    path = ROOT / result
    if not path.is_file():
        pytest.skip(f"{result} not present")
    out = json.loads(path.read_text())
    assert f"{begin}\n{render(out)}\n{end}" in (ROOT / doc).read_text()
    return out
