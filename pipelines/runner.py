"""Prefect plumbing shared by every flow: task runners, result caching, progress, result files.

* :func:`make_task_runner` — ``ThreadPoolTaskRunner(max_workers=2)`` by default, or
  ``prefect_dask.DaskTaskRunner(address=...)`` for an existing Dask scheduler.
* :func:`cache_key` — the cache key of a task run: task name, :data:`CODE_VERSION` and the task's
  parameters except paths (``warehouse``/``runs_dir``). Tasks take the warehouse *content hash*
  as a parameter, so a changed warehouse (a rebuild, a forgotten patient) never hits a stale
  result, and a rerun after a crash skips every task that had finished.
* :func:`results_context` — persisted results go under ``<runs>/.prefect-results`` (deleted by
  ``forgetful forget``: cached per-stay results hold record-level data).
* :func:`gather` — wait on futures with a tqdm bar.
* :func:`write_study_result` — validate with :func:`dashboards.schema.validate_result` and write
  ``<runs>/<study>/result.json`` atomically.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterable

#: bump when a task's computation changes, so old cached results are not reused
CODE_VERSION = "pipelines-3"
RESULTS_SUBDIR = ".prefect-results"
DEFAULT_RUNS = Path("runs")
_PATH_PARAMS = ("warehouse", "runs_dir")


def make_task_runner(dask_address: str | None = None, max_workers: int = 2):
    """Bounded-concurrency task runner: a thread pool, or a Dask cluster at ``dask_address``."""
    if dask_address:
        from prefect_dask import DaskTaskRunner

        return DaskTaskRunner(address=dask_address)
    from prefect.task_runners import ThreadPoolTaskRunner

    return ThreadPoolTaskRunner(max_workers=int(max_workers))


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "item") and callable(x.item) and getattr(x, "ndim", 1) == 0:
        return x.item()
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"cache-key parameter of type {type(x).__name__} is not hashable to JSON")


def hash_parts(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(_jsonable(list(parts)), separators=(",", ":")).encode()).hexdigest()


def cache_key(context, parameters: dict) -> str:
    """Prefect ``cache_key_fn``: task name + code version + parameters other than paths."""
    params = {k: v for k, v in parameters.items() if k not in _PATH_PARAMS}
    return f"{context.task.name}-{hash_parts(CODE_VERSION, context.task.name, params)[:40]}"


def results_dir(runs_dir: str | os.PathLike) -> Path:
    return Path(runs_dir) / RESULTS_SUBDIR


@contextlib.contextmanager
def results_context(runs_dir: str | os.PathLike):
    """Persist task results (and look up cached ones) under ``<runs>/.prefect-results``."""
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings

    d = results_dir(runs_dir).resolve()
    d.mkdir(parents=True, exist_ok=True)
    with temporary_settings({PREFECT_LOCAL_STORAGE_PATH: str(d)}):
        yield d


def gather(futures: list, desc: str, progress: bool = True) -> list:
    """Results of ``futures`` in submission order, with a progress bar as they complete."""
    from prefect.futures import as_completed
    from tqdm.auto import tqdm

    bar = tqdm(total=len(futures), desc=desc, disable=not progress, file=sys.stderr, leave=False)
    for _ in as_completed(futures):
        bar.update(1)
    bar.close()
    return [f.result() for f in futures]


def chunks(seq: list, size: int) -> Iterable[list]:
    size = max(1, int(size))
    for i in range(0, len(seq), size):
        yield seq[i:i + size]


def write_study_result(result: dict, runs_dir: str | os.PathLike, study: str | None = None) -> Path:
    """Validate (aggregates only) and write ``<runs>/<study>/result.json``; returns the path."""
    from dashboards.schema import write_result

    study = study or result["study"]
    path = Path(runs_dir) / study / "result.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_result(result, path)
    return path


def add_common_args(p, *, warehouse: bool = True) -> None:
    """Arguments every study subcommand takes."""
    if warehouse:
        p.add_argument("--warehouse", default="runs/warehouse.duckdb", help="DuckDB warehouse (default: %(default)s)")
    p.add_argument("--runs", default="runs", help="runs directory for results and the task cache (default: %(default)s)")
    p.add_argument("--dask", default=None, metavar="ADDRESS",
                   help="run tasks on the Dask scheduler at ADDRESS (prefect_dask.DaskTaskRunner)")
    p.add_argument("--workers", type=int, default=2, help="thread-pool size when --dask is not given (default: 2)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")


def run_cli_flow(flow_obj, args, **params) -> Any:
    """Run ``flow_obj`` for a CLI subcommand: the chosen task runner and the runs-dir result cache."""
    runner = make_task_runner(getattr(args, "dask", None), getattr(args, "workers", 2))
    with results_context(args.runs):
        return flow_obj.with_options(task_runner=runner)(**params)


def cli_errors(fn):
    """Wrap a CLI ``func``: typed pipeline/cohort/evaluation errors print one line and exit 2."""
    import functools

    @functools.wraps(fn)
    def wrapper(args) -> int:
        from cohort.errors import CohortError
        from evaluation.errors import EvaluationError

        from .errors import PipelineError

        try:
            return int(fn(args) or 0)
        except (PipelineError, CohortError, EvaluationError) as exc:
            print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 2
    return wrapper
