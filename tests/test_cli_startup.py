"""Start-up cost of a ``forgetful`` command: what is (not) imported, the paused collector, and the
API server child's launcher (timings are measured by ``python -m pipelines.bench.cli``, never here)."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines import cli
from pipelines.runtime import signals

ROOT = Path(__file__).resolve().parents[1]


def _py(code: str, *argv: str, cwd: Path = ROOT, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "FORGETFUL_API_SERVER")}
    e.update(PYTHONPATH=str(ROOT), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    return subprocess.run([sys.executable, *flags, "-c", code, *argv], cwd=cwd, env=e, capture_output=True,
                          text=True, timeout=300)


def test_help_imports_no_sv_core_and_version_still_prints_it():
    code = ("import sys, contextlib, io\nfrom pipelines.cli import main\n"
            "try:\n    with contextlib.redirect_stdout(io.StringIO()):\n        main(sys.argv[1:])\n"
            "except SystemExit:\n    pass\n"
            "print(sorted(m for m in ('sv_core', 'numpy', 'prefect') if m in sys.modules))")
    for argv in (["--help"], ["-q", "--help"]):
        out = _py(code, *argv)
        assert out.stdout.strip().splitlines()[-1] == "[]", (argv, out.stdout[-300:], out.stderr[-500:])
    from sv_core import __version__

    out = _py("import sys; from pipelines.cli import main; sys.exit(main())", "--version")
    assert out.returncode == 0 and out.stdout.strip() == f"forgetful {__version__}", (out.stdout, out.stderr)


@pytest.fixture
def collector():
    was = gc.isenabled()
    yield
    gc.unfreeze()  # what a test froze goes back to the scanned generations
    (gc.enable if was else gc.disable)()


def test_gc_paused_pauses_then_freezes_and_resumes(collector):
    gc.enable()
    gc.unfreeze()
    with cli.gc_paused():
        assert not gc.isenabled()
        kept = [[] for _ in range(1000)]
    assert gc.isenabled() and gc.get_freeze_count() >= len(kept)
    with pytest.raises(RuntimeError):
        with cli.gc_paused():
            raise RuntimeError("an import failed")
    assert gc.isenabled(), "the collector must resume after a failed import"


def test_gc_paused_leaves_a_disabled_collector_disabled(collector):
    gc.disable()
    gc.unfreeze()
    with cli.gc_paused():
        pass
    assert not gc.isenabled() and gc.get_freeze_count() == 0


def test_a_call_of_main_from_python_leaves_the_collector_alone(collector, capsys):
    gc.enable()
    gc.unfreeze()
    with pytest.raises(SystemExit):
        cli.main(["gate-demo", "--help"])
    capsys.readouterr()
    assert gc.isenabled() and gc.get_freeze_count() == 0 and cli._in_process is False


def test_server_argv_is_recognisable_and_puts_prefect_first():
    argv = signals.server_argv("/some/site-packages", 4242)
    assert argv[0] == sys.executable and argv[1] == "-c" and argv[-2:] == ["/some/site-packages", "4242"]
    assert "uvicorn" in " ".join(argv)  # what process checks (tests, ps) look for
    compile(signals.SERVER_MAIN, "<server>", "exec")
    code = signals.SERVER_MAIN
    assert code.index("sys.path.insert(0, sys.argv[1])") < code.index("import uvicorn")
    assert code.index("gc.disable()") < code.index("import uvicorn") < code.index("gc.enable()")


def test_the_server_starts_from_a_folder_that_shadows_prefect_and_uvicorn(tmp_path):
    """The child puts site-packages first: a ``prefect`` package or ``uvicorn.py`` in the working
    folder (sys.path[0] of the child's ``python -c``) must not be what it imports. The command runs
    with ``-P`` here, as an installed ``forgetful`` script has no working folder on its path."""
    (tmp_path / "prefect").mkdir()
    (tmp_path / "prefect" / "__init__.py").write_text("raise SystemExit('shadowed prefect imported')\n")
    (tmp_path / "uvicorn.py").write_text("raise SystemExit('shadowed uvicorn imported')\n")
    code = ("from pipelines.runtime.signals import ApiServer\n"
            "s = ApiServer().start()\n"
            "try:\n    s.wait_ready(timeout=240)\n    import urllib.request\n"
            "    print('VERSION', urllib.request.urlopen(s.api_url + '/admin/version', timeout=30).read().decode())\n"
            "finally:\n    s.stop()\n"
            "print('ALIVE', s.proc)")
    out = _py(code, cwd=tmp_path, flags=("-P",))
    assert out.returncode == 0, out.stderr[-1500:]
    lines = out.stdout.strip().splitlines()
    assert any(ln.startswith("VERSION ") for ln in lines) and lines[-1] == "ALIVE None", out.stdout[-500:]
