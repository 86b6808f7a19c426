"""``forgetful streaming-eviction``: online bounded-budget eviction (gate vs streaming H2O)."""
from __future__ import annotations

from pathlib import Path

from prefect import flow, task

from pipelines.flows.study_common import add_common_args, print_summary, write_result

STUDY = "streaming_eviction"


@task(name="streaming-eviction-trials")
def _compute(trials: int, seed: int, progress: bool) -> dict:
    from evaluation.studies.streaming_eviction import run

    return run(trials=trials, seed=seed, progress=progress)


@flow(name="study-streaming-eviction")
def streaming_eviction_flow(trials: int = 60, seed: int = 0, out: str | Path = f"runs/{STUDY}/result.json",
                        progress: bool = True) -> str:
    result = _compute(trials, seed, progress)
    return str(write_result(result, Path(out)))


def _cli(args) -> int:
    path = streaming_eviction_flow(args.trials, args.seed, args.out, not args.no_progress)
    import json

    print_summary(json.loads(Path(path).read_text()), Path(path))
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("streaming-eviction", help="study: online bounded-budget eviction (gate vs streaming H2O)")
    add_common_args(p, STUDY, 60)
    p.set_defaults(func=_cli)
