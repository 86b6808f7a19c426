"""What works without torch (the optional ``models`` extra), run in a process that has no torch:

    PYTHONPATH=tests/no_torch:. python tests/no_torch/check.py WORKDIR [--full]   # torch blocked
    /path/to/venv-without-torch/bin/python tests/no_torch/check.py WORKDIR [--full]

``SVDDGate`` fit/predict/pickle/forget (against the independent refit), then the commands
``build-cohort`` (synthetic), ``retention``, ``forget``, ``receipts verify`` and ``export`` on a
fresh warehouse under WORKDIR (``--full``: also ``heldout-spo2`` and ``report``), each exit code
0; every command that needs torch exits 3 with one line naming the extra; torch is never
imported. Prints one line per check; exits non-zero on the first failure. Flows need a Prefect
API: ``PREFECT_API_URL`` if set, else Prefect's own ephemeral server.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import pickle
import sys
import time
from pathlib import Path

#: torch commands and their arguments (each must exit 3 naming the extra)
TORCH_COMMANDS = [["deterioration"], ["lm"], ["throughput"], ["learned-keys"], ["capacity"],
                  ["selective-copying"], ["mqar-control"], ["audit", "--regimes", "learned"]]
HINT = "pip install 'forgetful-attention[models]'"


def torch_absent() -> bool:
    try:
        return importlib.util.find_spec("torch") is None
    except ImportError:
        return True


def estimator() -> None:
    import numpy as np

    from sv_core import SVDDGate, rbf_kernel, refit

    rng = np.random.default_rng(0)
    X, P = rng.normal(size=(80, 3)), rng.normal(scale=2.0, size=(200, 3))
    est = SVDDGate(nu=0.3, gamma=0.5).fit(X)
    assert set(np.unique(est.predict(P))) <= {-1, 1}
    again = pickle.loads(pickle.dumps(est))
    assert np.array_equal(again.decision_function(P), est.decision_function(P))
    again.forget([0, 1], verify=True)
    a, rho = refit(X[2:], C=again.C_, sigma=again.sigma_)
    dev = float(np.abs(again.gate_score(P) - (2.0 * rbf_kernel(P, X[2:], again.sigma_) @ a - rho)).max())
    assert dev < 1e-8, dev
    print(f"ok: SVDDGate fit/predict/pickle/forget; max |score - refit| {dev:.1e}")


def command(argv: list[str], expect: int = 0) -> str:
    from pipelines.cli import main

    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    if rc != expect:
        sys.stderr.write(out.getvalue()[-4000:] + err.getvalue()[-4000:])
        raise SystemExit(f"FAILED: forgetful {' '.join(map(str, argv))} -> exit {rc}, expected {expect}")
    print(f"ok: forgetful {' '.join(map(str, argv[:2]))} -> exit {rc} ({time.perf_counter() - t0:.1f} s)")
    return err.getvalue()


def commands(work: Path, full: bool) -> None:
    import duckdb

    w, runs = work / "warehouse.duckdb", work / "runs"
    command(["build-cohort", "--source", "synthetic", "--stays", 60, "--warehouse", w, "--runs", runs,
             "--no-progress"])
    for study in ("retention", "heldout-spo2") if full else ("retention",):
        command([study, "--warehouse", w, "--runs", runs, "--n-boot", 100, "--no-progress"])
    with duckdb.connect(str(w), read_only=True) as con:
        sid = con.execute("SELECT min(subject_id) FROM cohort_stays").fetchone()[0]
    command(["forget", "--subject-id", sid, "--warehouse", w])
    command(["receipts", "verify", "--warehouse", w])
    command(["export", "--out", work / "export", "--warehouse", w])
    if full:
        command(["report", "--runs", runs, "--out", work / "report.html"])
    for argv in TORCH_COMMANDS:
        lines = command([*argv, "--warehouse", w], expect=3).strip().splitlines()
        assert len(lines) == 1 and HINT in lines[0], lines


def main(work: str, full: bool = False) -> int:
    if not torch_absent():
        raise SystemExit("torch is importable here: run this without torch (see the module docstring)")
    Path(work).mkdir(parents=True, exist_ok=True)
    estimator()
    commands(Path(work), full)
    assert "torch" not in sys.modules
    print("ok: no torch imported")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], full="--full" in sys.argv[2:]))
