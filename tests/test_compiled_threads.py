"""How the compiled loops split a batch over threads (sv_core._batchfast)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from sv_core.batched.common import compiled_build

#: OpenMP runtimes by their sonames (wheels' private copies carry a hash in the name and serve only
#: their own package, e.g. scikit-learn's libgomp-<hash>.so)
RUNTIME = re.compile(r"^lib(gomp|omp|iomp5)\.so(\.\d+)*$")


def _openmp_runtimes() -> set[str]:
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("no /proc/self/maps on this platform")
    names = {line.split()[-1] for line in maps.read_text().splitlines() if "/" in line}
    return {n for n in names if RUNTIME.match(Path(n).name)}


def test_the_build_says_how_it_splits_a_batch():
    info = compiled_build()
    assert set(info) == {"built", "openmp"}
    assert info["openmp"] <= info["built"]


def test_an_openmp_build_shares_torchs_runtime():
    """Built with OpenMP, the loops must run in torch's own OpenMP runtime: a second runtime would
    bring a second pool of spinning workers onto the same cores."""
    if not compiled_build()["openmp"]:
        pytest.skip("sv_core._batchfast built without OpenMP (POSIX helper threads)")
    import sv_core._batchfast  # noqa: F401  (loaded by sv_core.batched.common already)

    assert torch.__config__.parallel_info().count("OpenMP") >= 1
    runtimes = _openmp_runtimes()
    assert len(runtimes) == 1, f"more than one OpenMP runtime mapped: {sorted(runtimes)}"
