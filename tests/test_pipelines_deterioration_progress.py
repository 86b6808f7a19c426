"""Long model training shows per-epoch progress (issue 18: on a 2,000-stay root the deterioration
bar sat still for 11 minutes): every epoch of every model × seed reaches the bar with its losses
and seconds, each finished model × seed prints one line, a cached one says so, ``progress=False``
prints nothing. (The epoch listener itself: tests/test_clinical_deterioration.py.)"""
from __future__ import annotations

import re
import shutil


def test_the_flow_shows_each_epoch_and_each_model_seed(prefect_harness, tmp_path, capsys):
    from cohort.synthetic import make_small_warehouse
    from pipelines.flows.clinical_deterioration import deterioration_flow
    from pipelines.runtime import runner

    w = make_small_warehouse(tmp_path / "src", stays=24, seed=3)
    runs = tmp_path / "runs"
    runs.mkdir()
    dst = runs / "warehouse.duckdb"
    shutil.copy(w, dst)
    from pipelines.settings import DeteriorationSettings

    kw = dict(warehouse=str(dst), runs_dir=str(runs),
              settings=DeteriorationSettings(models=("lstm",), seeds=2, max_epochs=2, n_boot=20, size={"hidden": 4},
                                             window=24, context=12))

    def run(progress: bool) -> str:
        with runner.results_context(str(runs)):
            deterioration_flow.with_options(task_runner=runner.make_task_runner(None, 2))(**kw, progress=progress)
        return capsys.readouterr().err

    err = run(True)
    for seed in (0, 1):
        for ep in (1, 2):  # no early stop within 2 epochs (patience 3)
            assert re.search(rf"LSTM seed {seed} epoch {ep}/2: loss \d+\.\d+, val \d+\.\d+, \d+ s", err), err[-2000:]
        line = re.search(rf"LSTM seed {seed}: 2 epochs, best val loss \d+\.\d+, "
                         rf"test AUROC \d\.\d+ \(trained in \d+ s\)", err)
        assert line, err[-2000:]
    assert "4/4" in err  # the bar counts model x seed x epoch
    cached = run(True)  # the same inputs again: both from the task cache
    assert len(re.findall(r"LSTM seed \d: 2 epochs, .*\(from the task cache; trained in \d+ s then\)", cached)) == 2
    assert "epoch 1/2" not in cached
    assert run(False) == ""


def test_quiet_hides_every_progress_bar_of_the_process(tmp_path):
    """``forgetful -q``: libraries' own tqdm bars (e.g. transformers' "Loading weights") are off too;
    a call of ``main([...])`` from Python leaves the caller's environment alone."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import os, sys\nfrom pipelines import cli\nsys.argv = ['forgetful', *sys.argv[1:]]\n"
            "rc = cli.main()\nfrom tqdm.auto import tqdm\n"
            "print(rc, os.environ.get('TQDM_DISABLE'), os.environ.get('HF_HUB_DISABLE_PROGRESS_BARS'), "
            "tqdm(range(2)).disable)")
    env = {k: v for k, v in os.environ.items() if k not in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    for argv, want in ((["-q", "gate-demo", "--n", "40"], "0 1 1 True"),
                       (["gate-demo", "--n", "40"], "0 None None False")):
        out = subprocess.run([sys.executable, "-c", code, *argv], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert out.stdout.strip().splitlines()[-1] == want, (argv, out.stdout[-500:], out.stderr[-500:])
    from pipelines.cli import main

    assert main(["-q", "gate-demo", "--n", "40"]) == 0 and "TQDM_DISABLE" not in os.environ
