"""``forgetful capacity``: capacity sweep (SV vs DeltaNet vs linear)."""
from __future__ import annotations

from pathlib import Path

from prefect import flow, task

from pipelines.flows.study_common import add_common_args, print_summary, write_result

STUDY = "capacity"


@task(name="capacity-trials")
def _compute(trials: int, seed: int, progress: bool) -> dict:
    from evaluation.studies.recall_tasks import run_capacity

    return run_capacity(trials=trials, seed=seed, progress=progress)


@flow(name="study-capacity")
def capacity_flow(trials: int = 100, seed: int = 0, out: str | Path = f"runs/{STUDY}/result.json",
                        progress: bool = True) -> str:
    result = _compute(trials, seed, progress)
    return str(write_result(result, Path(out)))


def _cli(args) -> int:
    path = capacity_flow(args.trials, args.seed, args.out, not args.no_progress)
    import json

    print_summary(json.loads(Path(path).read_text()), Path(path))
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("capacity", help="study: capacity sweep (SV vs DeltaNet vs linear)")
    add_common_args(p, STUDY, 100)
    p.set_defaults(func=_cli)
