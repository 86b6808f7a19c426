"""Packaging: one version, declared dependencies are used, lint/type configuration is live."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["sv_core", "cohort", "models", "evaluation", "pipelines", "dashboards"]
#: distribution name -> import name, where they differ
IMPORT_NAME = {"pyyaml": "yaml", "scikit-learn": "sklearn"}
#: files this suite keeps clean under ruff and mypy (other modules: see the counts in the issue)
CLEAN_FILES = [
    "sv_core/estimator.py",
    "sv_core/_version.py",
    "tests/test_sv_core_estimator.py",
    "tests/test_packaging.py",
]


def _pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)


def _imported_top_level_names() -> set[str]:
    names: set[str] = set()
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return names


def test_single_version_source():
    import sv_core

    assert sv_core.__version__ == importlib.metadata.version("forgetful-attention")
    project = _pyproject()["project"]
    assert "version" in project["dynamic"] and "version" not in project


def test_every_runtime_dependency_is_imported():
    imported = _imported_top_level_names()
    for req in _pyproject()["project"]["dependencies"]:
        dist = req.split(";")[0].split("[")[0]
        for sep in "<>=!~ ":
            dist = dist.split(sep)[0]
        assert IMPORT_NAME.get(dist, dist) in imported, f"{dist} is declared but never imported"
    assert not {"qpsolvers", "psutil"} & imported


def test_torch_is_the_models_extra_not_a_dependency():
    project = _pyproject()["project"]
    names = [re.split(r"[<>=!~ ;\[]", r)[0] for r in project["dependencies"]]
    assert "torch" not in names
    assert project["optional-dependencies"]["models"] == ["torch>=2.4"]
    makefile = (ROOT / "Makefile").read_text()
    extras = re.search(r"^EXTRAS\s*\?=\s*(\S+)", makefile, re.M).group(1).split(",")
    assert {"dev", "models", "retrieval"} <= set(extras)  # make install / test / demo bring torch
    assert re.search(r"^TORCH\s*\?=\s*torch==2\.13\.0$", makefile, re.M)


def test_metadata_is_honest_about_platforms_urls_and_types():
    project = _pyproject()["project"]
    classifiers = project["classifiers"]
    assert "Operating System :: OS Independent" not in classifiers  # fcntl locks, sigwaitinfo: POSIX/Linux
    assert "Operating System :: POSIX :: Linux" in classifiers and "Typing :: Typed" in classifiers
    assert not any(c.startswith(("Operating System :: Microsoft", "Operating System :: MacOS")) for c in classifiers)
    assert set(project["urls"]) == {"Documentation", "Source", "Issues"}
    data = _pyproject()["tool"]["setuptools"]["package-data"]
    for pkg in ("sv_core", "cohort"):  # the packages kept mypy-clean (LINTED_PACKAGES)
        assert (ROOT / pkg / "py.typed").is_file() and "py.typed" in data[pkg]
    readme = (ROOT / "docs" / "INSTALL.md").read_text()
    install = readme[readme.index("**Install options.**"):readme.index("**Platforms.**")]
    for pkg in PACKAGES:  # the six import names are documented where installing is
        assert f"`{pkg}`" in install, pkg


def test_metadata_has_classifiers_and_dev_tools():
    project = _pyproject()["project"]
    assert any(c.startswith("Programming Language :: Python :: 3.11") for c in project["classifiers"])
    dev = " ".join(project["optional-dependencies"]["dev"])
    assert "ruff" in dev and "mypy" in dev
    tool = _pyproject()["tool"]
    assert tool["ruff"]["line-length"] == 120 and "mypy" in tool


def test_importing_sv_core_does_not_import_sklearn():
    code = "import sys, sv_core; assert 'sklearn' not in sys.modules; sv_core.SVDDGate; assert 'sklearn' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def _tool(name: str) -> str:
    exe = Path(sys.executable).with_name(name)
    found = str(exe) if exe.exists() else shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed (pip install -e '.[dev]')")
    return found


def test_estimator_files_are_ruff_clean():
    out = subprocess.run([_tool("ruff"), "check", *CLEAN_FILES], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_estimator_is_mypy_clean(tmp_path):
    cmd = [
        _tool("mypy"),
        "--follow-imports=silent",
        "--cache-dir",
        str(tmp_path),
        "sv_core/estimator.py",
        "sv_core/_version.py",
    ]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


#: packages the CI keeps clean under ruff and mypy with the pyproject configuration
#: (cohort/incremental/__init__.py included: it is checked with the rest of cohort)
LINTED_PACKAGES = ["sv_core", "cohort"]


@pytest.mark.parametrize("package", LINTED_PACKAGES)
def test_package_is_ruff_clean(package):
    out = subprocess.run([_tool("ruff"), "check", "--no-cache", package], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


@pytest.mark.parametrize("package", LINTED_PACKAGES)
def test_package_is_mypy_clean(package):
    # the repository's .mypy_cache (git-ignored): a cold run takes about a minute, a warm one seconds
    out = subprocess.run([_tool("mypy"), "--cache-dir", str(ROOT / ".mypy_cache"), package], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


# ---------------------------------------------------------------- without torch (the models extra)
NO_TORCH = ROOT / "tests" / "no_torch"


def _no_torch_env(api_url: str | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(NO_TORCH), str(ROOT)])}
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


def _api_url() -> str | None:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


def test_without_torch_imports_fail_with_the_extra_named():
    """In a process where torch cannot be imported: sv_core, the estimator, cohort and every command
    module but the language model's import; sv_core.vjp says which extra to install."""
    code = (
        "import importlib, sys\n"
        "import sv_core, sv_core.estimator, sv_core.streaming, cohort, pipelines.cli\n"
        "from pipelines.cli import COMMANDS\n"
        "bad = []\n"
        "for mod in sorted({m for m, _ in COMMANDS.values()}):\n"
        "    try:\n"
        "        importlib.import_module('pipelines.flows.' + mod)\n"
        "    except ImportError as exc:\n"
        "        bad.append((mod, exc.name))\n"
        "print(bad)\n"
        "try:\n"
        "    import sv_core.vjp\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "assert 'torch' not in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_no_torch_env(None), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "[('language_model', 'torch')]", lines  # lm: refused by preflight before its import
    assert lines[1] == "sv_core.vjp needs torch (the [models] extra): pip install 'forgetful-attention[models]'"


def test_without_torch_the_estimator_and_the_clinical_commands_work(prefect_harness, tmp_path):
    """tests/no_torch/check.py in a process where ``import torch`` fails (tests/no_torch/sitecustomize):
    SVDDGate, build-cohort, retention, forget, receipts and export run; every torch command exits 3
    naming the extra; torch is never imported. (heldout-spo2 and report: the slow fresh-venv test.)"""
    out = subprocess.run([sys.executable, str(NO_TORCH / "check.py"), str(tmp_path / "work")], cwd=ROOT,
                         env=_no_torch_env(_api_url()), capture_output=True, text=True, timeout=900)
    print(out.stdout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "ok: no torch imported" in out.stdout


def _runtime_closure() -> list[importlib.metadata.Distribution]:
    """The installed distributions of forgetful-attention's runtime dependencies (no extras),
    transitively, with their environment markers evaluated here; torch must not be among them."""
    from packaging.requirements import Requirement

    seen: dict[str, importlib.metadata.Distribution] = {}
    todo = [Requirement(r) for r in _pyproject()["project"]["dependencies"]]
    while todo:
        req = todo.pop()
        key = req.name.lower().replace("_", "-")
        if key in seen or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        dist = importlib.metadata.distribution(req.name)
        seen[key] = dist
        reqs = [Requirement(r) for r in dist.requires or []]
        for extra in req.extras:  # e.g. dask[distributed]: that extra's requirements too
            todo += [r for r in reqs if r.marker and r.marker.evaluate({"extra": extra})]
        todo += [r for r in reqs if not r.marker or r.marker.evaluate({"extra": ""})]
    assert "torch" not in seen
    return list(seen.values())


@pytest.mark.slow
def test_a_fresh_venv_without_torch_runs_the_estimator_and_the_clinical_commands(prefect_harness, tmp_path):
    """A real environment without torch: a new venv (no pip, no system site-packages) holding the
    project's wheel, built here, and exactly its declared runtime dependencies (linked from this
    environment's site-packages), then tests/no_torch/check.py run by that venv's Python from a
    folder outside the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, env=env)
    py = str(venv / "bin" / "python")

    def run(code: str) -> str:
        out = subprocess.run([py, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout.strip()

    site = Path(run("import sysconfig; print(sysconfig.get_paths()['purelib'])"))
    for dist in _runtime_closure():
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            src = Path(str(dist.locate_file(top)))
            if src.exists() and not (site / top).exists():
                (site / top).symlink_to(src)
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
                    str(ROOT)], check=True, timeout=900)
    wheel = next(wheels.glob("forgetful_attention-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index", "-q",
                    str(wheel)], check=True, timeout=600, env=env)
    assert run("import importlib.util as u; print(u.find_spec('torch'))") == "None"
    # the installed wheel, not the checkout, with its typed markers
    assert run("import sv_core, cohort, pathlib as p; "
               "print(*[(p.Path(m.__file__).parent / 'py.typed').is_file() for m in (sv_core, cohort)], "
               f"p.Path(sv_core.__file__).resolve().is_relative_to({str(site.resolve())!r}))") == "True True True"
    shutil.copy(NO_TORCH / "check.py", tmp_path / "check.py")
    out = subprocess.run([py, str(tmp_path / "check.py"), str(tmp_path / "work"), "--full"], cwd=tmp_path,
                         env={**env, "PREFECT_API_URL": _api_url() or ""}, capture_output=True, text=True, timeout=900)
    print(out.stdout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


class _FakeFlow:
    """Stands in for a Prefect flow: records the keyword arguments of each call."""

    def __init__(self):
        self.calls: list[dict] = []

    def with_options(self, **kw):
        return self

    def __call__(self, *args, **kw):
        self.calls.append(kw)
        return {}


@pytest.mark.parametrize("has_torch", [True, False])
def test_run_all_skips_its_torch_steps_with_one_line_each(monkeypatch, capsys, tmp_path, has_torch):
    """Without torch run-all runs on: deterioration, audit's learned regime and the torch studies are
    skipped with one line each naming the extra; with torch nothing is skipped."""
    from pipelines import preflight
    from pipelines.flows import audit_flow, clinical_deterioration, run_all, study_learned_keys, study_synthetic

    monkeypatch.setattr(preflight, "torch_available", lambda: has_torch)
    fakes = {"deterioration": _FakeFlow(), "audit": _FakeFlow(), "learned_keys": _FakeFlow()}
    monkeypatch.setattr(clinical_deterioration, "deterioration_flow", fakes["deterioration"])
    monkeypatch.setattr(audit_flow, "audit_flow", fakes["audit"])
    monkeypatch.setattr(study_learned_keys, "learned_keys_flow", fakes["learned_keys"])
    for study in study_synthetic.FLOWS:
        fakes[study] = _FakeFlow()
        monkeypatch.setitem(study_synthetic.FLOWS, study, fakes[study])
    import evaluation.studies.retrieval_memory as rm

    def no_encoder():
        raise ImportError("retrieval extra not installed (test)")

    monkeypatch.setattr(rm, "load_encoder", no_encoder)
    run = run_all.Run("synthetic", None, str(tmp_path / "w.duckdb"), str(tmp_path), str(tmp_path / "r.html"),
                      run_all.RunAllSettings(), False, lambda: None)
    times = run_all._run_steps(["deterioration", "audit", "studies"], run).seconds  # the meter's seconds per step
    err = capsys.readouterr().err
    torch_studies = {s for c, s, *_ in study_synthetic.STUDIES if c in preflight.TORCH_COMMANDS} | {"learned_keys"}
    assert torch_studies == {"selective_copying", "capacity", "mqar_control", "learned_keys"}
    regimes = fakes["audit"].calls[0]["regimes"]
    if has_torch:
        assert "deterioration" in times and len(fakes["deterioration"].calls) == 1
        assert "learned" in regimes and all(len(fakes[s].calls) == 1 for s in torch_studies)
        assert "needs torch" not in err
    else:
        assert "deterioration" not in times and not fakes["deterioration"].calls
        assert "learned" not in regimes and set(regimes) == set(audit_flow.DEFAULT_REGIMES) - {"learned"}
        assert not any(fakes[s].calls for s in torch_studies)
        skipped = [line for line in err.splitlines() if "needs torch" in line]
        assert len(skipped) == 2 + len(torch_studies)  # deterioration, audit's regime, each torch study
        assert all("pip install 'forgetful-attention[models]'" in line for line in skipped)
    others = set(study_synthetic.FLOWS) - torch_studies
    assert others and all(len(fakes[s].calls) == 1 for s in others)  # the other studies ran either way
