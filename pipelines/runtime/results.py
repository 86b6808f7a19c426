"""Study result files: validate, write ``<runs>/<study>/result.json`` atomically, publish.

:func:`write_study_result` validates a result with :func:`dashboards.schema.validate_result`
(aggregates only), states the original computation's run time when tasks came from the task
cache (:func:`runtime_with_cache`), drops a seed figure its data cannot be compared with
(:func:`seed_only_where_comparable`), clears the file's stale mark, and inside a flow run
publishes the headline table as Prefect artifacts (:func:`publish_artifacts`).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from pipelines.store.forget_apply import unstale


def write_study_result(result: dict, runs_dir: str | os.PathLike, study: str | None = None) -> Path:
    """Validate (aggregates only) and write ``<runs>/<study>/result.json``; returns the path.
    When tasks of this flow run came from the task cache, ``runtime_s`` becomes the original
    computation's (:func:`runtime_with_cache`; ``result`` is updated in place)."""
    from dashboards.schema import write_result
    from pipelines.runtime import task_cache

    runtime_with_cache(result, task_cache.take_tally(task_cache.run_key()))
    study = study or result["study"]
    seed_only_where_comparable(result)
    path = Path(runs_dir) / study / "result.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_result(result, path)
    unstale(Path(runs_dir), f"{study}/result.json")
    publish_artifacts(result, path)
    return path


def seed_only_where_comparable(result: dict) -> None:
    """A result never carries a seed figure its data cannot be compared with (a real-data study run
    on the synthetic cohort): ``seed_figure`` is emptied and the notes say why
    (:func:`dashboards.seed_figures.seed_comparability`, the one place this is decided)."""
    from dashboards.seed_figures import seed_comparability

    comp = seed_comparability(str(result.get("study", "")), str(result.get("data", "")))
    if comp["comparable"] or not result.get("seed_figure"):
        return
    result["seed_figure"] = {}
    note = f"seed figure not shown, not comparable: {comp['reason']}"
    result["notes"] = f"{result['notes']} · {note}" if result.get("notes") else note


def runtime_with_cache(result: dict, tally) -> None:
    """A study whose tasks came (partly) from the task cache states the run time of the original
    computation, not the seconds of the cache hits: ``runtime_s`` = this run's seconds − the time
    spent on hits + the wall-clock time the hit tasks originally took (union of their spans, so
    tasks that ran side by side count once). ``config.task_cache`` keeps the counts and this run's
    seconds, and ``notes`` says so in words. ``tally``: :class:`pipelines.runtime.task_cache.Tally` or None."""
    if tally is None or not tally.hits:
        return
    from pipelines.runtime.task_cache import covered

    this_run = float(result["runtime_s"])
    original = covered(tally.original_spans)
    result["runtime_s"] = max(0.0, this_run - covered(tally.hit_spans)) + original
    result.setdefault("config", {})["task_cache"] = {"tasks_cached": tally.hits, "tasks_computed": tally.computed,
                                                     "this_run_s": round(this_run, 3)}
    note = (f"cached: {tally.hits} task(s) came from the task cache" + (f", {tally.computed} ran now" if tally.computed
                                                                       else "")
            + f"; the run time counts their original computation ({result['runtime_s']:.1f} s; this run took "
              f"{this_run:.1f} s)")
    result["notes"] = f"{result['notes']} · {note}" if result.get("notes") else note


def cache_note(result: dict) -> str:
    """" (cached)" for a result whose tasks came from the task cache, else ""."""
    tc = (result.get("config") or {}).get("task_cache") or {}
    return " (cached)" if tc.get("tasks_cached") else ""


def in_flow_run() -> bool:
    try:
        from prefect.context import FlowRunContext

        return FlowRunContext.get() is not None
    except Exception:  # Prefect missing or no context
        return False


def publish_artifacts(result: dict, path: Path) -> None:
    """Inside a flow run: the study's headline table as a Prefect table artifact (it shows in the
    Prefect UI) and a markdown artifact pointing at the result file. Aggregates only — the same
    validated content as the result file."""
    if not in_flow_run():
        return
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    key = re.sub(r"[^a-z0-9-]", "-", str(result["study"]).lower())
    tables = result.get("tables") or []
    if tables:
        t = tables[0]
        create_table_artifact([dict(zip(t["columns"], r)) for r in t["rows"]], key=f"{key}-table",
                              description=f"{result['title']}: {t.get('title', '')}")
    create_markdown_artifact(f"**{result['title']}** ({result['data']}, {result['runtime_s']:.1f} s) — "
                             f"result file `{path.resolve()}`", key=f"{key}-result",
                             description="forgetful study result")
