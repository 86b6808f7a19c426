"""sv_core.jsonfile: the one result-file writer (atomic, parent folders made)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from sv_core.jsonfile import write_json


def test_write_json_makes_folders_and_writes_the_whole_file(tmp_path):
    out = write_json(tmp_path / "a" / "b" / "r.json", {"x": [1, 2.5], "n": np.float64(0.25)}, indent=1, default=float)
    assert out == tmp_path / "a" / "b" / "r.json" and out.read_text().endswith("}\n")
    assert json.loads(out.read_text()) == {"x": [1, 2.5], "n": 0.25}
    assert [p.name for p in out.parent.iterdir()] == ["r.json"]  # no temporary file left


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    p = tmp_path / "r.json"
    write_json(p, {"old": True})

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError):
        write_json(p, {"new": True})
    with pytest.raises(TypeError):  # not serialisable: nothing is written
        write_json(p, {"new": object()})
    assert json.loads(p.read_text()) == {"old": True} and [x.name for x in tmp_path.iterdir()] == ["r.json"]
