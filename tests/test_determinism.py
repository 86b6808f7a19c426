"""The seeded synthetic studies print the same figures on any machine (issue 32): run them in two child
processes whose BLAS kernels and numpy SIMD paths differ (OpenBLAS core type, thread count, AVX-512
dispatch off) — what another CPU changes — and compare the generated docs at the precision they print.
Residuals print as their bound (``"< 1e-12"``), so their rounding digits cannot differ; a figure that
did depend on summation order would show here.

The audit's completion-path split and its ill-conditioned residual statistics do move with BLAS order;
they carry tolerances instead (``evaluation.studies.deletion_audit``), checked in the last test."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "a": {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "2"},
    "b": {"OPENBLAS_CORETYPE": "Sandybridge", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
          "NPY_DISABLE_CPU_FEATURES": "AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL"},
}
SCRIPT = """
import sys
from pathlib import Path
from dashboards.schema import write_result
from pipelines.flows.study_synthetic import STUDIES, _study_fn
out = Path(sys.argv[1])
for _cmd, study, target, trials, _ in STUDIES:
    write_result(_study_fn(target)(trials=trials, seed=0, progress=False), out / study / "result.json")
from sv_core import audit
from evaluation.studies.deletion_audit import audit_result
res = audit.run_audit(trials=50, regimes=["gaussian", "redundant"], progress=False)
r = audit_result(res["regimes"], trials=50, seed=0, protocol=res["protocol"])
r["seed_figure"] = {}
write_result(r, out / "deletion_audit" / "result.json")
"""


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    base = tmp_path_factory.mktemp("det")
    out = {}
    for name, env in VARIANTS.items():
        d = base / name / "runs"
        e = {**os.environ, **env, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        subprocess.run([sys.executable, "-c", SCRIPT, str(d)], check=True, env=e, cwd=ROOT, timeout=1800)
        out[name] = d
    return out


@pytest.mark.slow
def test_synthetic_studies_print_the_same_figures_under_other_blas_kernels(variants):
    from dashboards import reproduce

    cheap = sorted({s for _, names in reproduce.ORDER for s in names
                    if s != "deletion_audit" and (variants["a"] / s / "result.json").exists()})
    assert len(cheap) == 6
    docs = {k: reproduce.render_figures([d], studies=cheap) for k, d in variants.items()}
    assert "runtime" not in docs["a"]
    diff = reproduce.figure_differences(docs["a"], docs["b"], limit=20)  # at printed precision, no tolerance
    assert not diff, "\n".join(diff)


@pytest.mark.slow
def test_audit_figures_that_move_with_blas_order_stay_within_their_stated_tolerance(variants):
    from dashboards.numbers import fmt

    a, b = (json.loads((variants[k] / "deletion_audit" / "result.json").read_text()) for k in ("a", "b"))
    tol = a["tables"][0]["tolerances"]
    cols = a["tables"][0]["columns"]
    for ra, rb in zip(a["tables"][0]["rows"], b["tables"][0]["rows"]):
        for c, x, y in zip(cols, ra, rb):
            if fmt(x) == fmt(y):  # equal at the precision the documents print
                continue
            t = tol.get(c)
            assert t is not None, f"{ra[0]} {c}: {x} vs {y} moved but has no tolerance"
            if "abs" in t:
                assert abs(x - y) <= t["abs"], (c, x, y, t)
            else:  # a residual printed as its bound on one side counts as the bound
                lx, ly = (math.log10(t["bound"] if isinstance(v, str) else v) for v in (x, y))
                assert abs(lx - ly) <= t["decades"], (c, x, y, t)
    assert [c["status"] for c in a["claims"]] == [c["status"] for c in b["claims"]]
