"""``forgetful mqar-control``: distinct-key recall control (gate vs ungated vs softmax)."""
from __future__ import annotations

from pathlib import Path

from prefect import flow, task

from pipelines.flows.study_common import add_common_args, print_summary, write_result

STUDY = "mqar_control"


@task(name="mqar-control-trials")
def _compute(trials: int, seed: int, progress: bool) -> dict:
    from evaluation.studies.recall_tasks import run_mqar_control

    return run_mqar_control(trials=trials, seed=seed, progress=progress)


@flow(name="study-mqar-control")
def mqar_control_flow(trials: int = 200, seed: int = 0, out: str | Path = f"runs/{STUDY}/result.json",
                        progress: bool = True) -> str:
    result = _compute(trials, seed, progress)
    return str(write_result(result, Path(out)))


def _cli(args) -> int:
    path = mqar_control_flow(args.trials, args.seed, args.out, not args.no_progress)
    import json

    print_summary(json.loads(Path(path).read_text()), Path(path))
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("mqar-control", help="study: distinct-key recall control (gate vs ungated vs softmax)")
    add_common_args(p, STUDY, 200)
    p.set_defaults(func=_cli)
