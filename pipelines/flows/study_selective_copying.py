"""``forgetful selective-copying``: selective copying, 8 informative + F filler."""
from __future__ import annotations

from pathlib import Path

from prefect import flow, task

from pipelines.flows.study_common import add_common_args, print_summary, write_result

STUDY = "selective_copying"


@task(name="selective-copying-trials")
def _compute(trials: int, seed: int, progress: bool) -> dict:
    from evaluation.studies.recall_tasks import run_selective_copying

    return run_selective_copying(trials=trials, seed=seed, progress=progress)


@flow(name="study-selective-copying")
def selective_copying_flow(trials: int = 100, seed: int = 0, out: str | Path = f"runs/{STUDY}/result.json",
                        progress: bool = True) -> str:
    result = _compute(trials, seed, progress)
    return str(write_result(result, Path(out)))


def _cli(args) -> int:
    path = selective_copying_flow(args.trials, args.seed, args.out, not args.no_progress)
    import json

    print_summary(json.loads(Path(path).read_text()), Path(path))
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("selective-copying", help="study: selective copying, 8 informative + F filler")
    add_common_args(p, STUDY, 100)
    p.set_defaults(func=_cli)
