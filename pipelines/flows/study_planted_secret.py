"""``forgetful planted-secret``: exact decrement vs coefficient decay on a planted secret."""
from __future__ import annotations

from pathlib import Path

from prefect import flow, task

from pipelines.flows.study_common import add_common_args, print_summary, write_result

STUDY = "planted_secret"


@task(name="planted-secret-trials")
def _compute(trials: int, seed: int, progress: bool) -> dict:
    from evaluation.studies.planted_secret import run

    return run(trials=trials, seed=seed, progress=progress)


@flow(name="study-planted-secret")
def planted_secret_flow(trials: int = 30, seed: int = 0, out: str | Path = f"runs/{STUDY}/result.json",
                        progress: bool = True) -> str:
    result = _compute(trials, seed, progress)
    return str(write_result(result, Path(out)))


def _cli(args) -> int:
    path = planted_secret_flow(args.trials, args.seed, args.out, not args.no_progress)
    import json

    print_summary(json.loads(Path(path).read_text()), Path(path))
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("planted-secret", help="study: remove a planted secret (exact decrement vs decay)")
    add_common_args(p, STUDY, 30)
    p.set_defaults(func=_cli)
