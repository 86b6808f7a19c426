"""``forgetful retrieval-memory``: a forgettable fact memory over MiniLM sentence embeddings.

Needs the optional extra ``forgetful-attention[retrieval]``; exits with status 2 and a clear
message when it is absent.
"""
from __future__ import annotations

import sys
from pathlib import Path

from prefect import flow, task

from pipelines.flows.study_common import add_common_args, finish, write_result

STUDY = "retrieval_memory"


@task(name="retrieval-memory-study")
def _compute(seed: int, tau: float) -> dict:
    from evaluation.studies.retrieval_memory import run

    return run(seed=seed, tau=tau)


@flow(name="study-retrieval-memory", log_prints=True)
def retrieval_memory_flow(seed: int = 0, tau: float = 0.5, out: str | Path = f"runs/{STUDY}/result.json") -> str:
    result = _compute(seed, tau)
    return str(write_result(result, Path(out)))


def _cli(args) -> int:
    from evaluation.studies.errors import OptionalDependencyMissing
    from evaluation.studies.retrieval_memory import load_encoder

    try:
        load_encoder()
    except OptionalDependencyMissing as exc:
        print(f"forgetful retrieval-memory: {exc}", file=sys.stderr)
        return 3
    return finish(args, retrieval_memory_flow(args.seed, args.tau, args.out))


def add_cli(sub) -> None:
    p = sub.add_parser("retrieval-memory", help="study: forgettable retrieval memory over MiniLM embeddings")
    add_common_args(p, STUDY, None)
    p.add_argument("--tau", type=float, default=0.5, help="abstention threshold on cosine similarity")
    p.set_defaults(func=_cli)
