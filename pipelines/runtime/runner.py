"""Prefect plumbing shared by every flow: task runners, result caching, progress, result files.

* :func:`make_task_runner` — ``ThreadPoolTaskRunner(max_workers=2)`` by default (one that
  abandons running workers when the flow is interrupted), or
  ``prefect_dask.DaskTaskRunner(address=...)`` for an existing Dask scheduler.
* task results are cached by :mod:`pipelines.runtime.task_cache` (authenticated JSON beside the
  warehouse, keyed on the task source and its non-path parameters; never pickles). Tasks take
  the warehouse *content hash* as a parameter, so a changed warehouse (a rebuild, a forgotten
  patient) never hits a stale result, and a rerun after a crash skips every task that had finished.
* :func:`run_cli_flow` — every CLI flow runs inside :meth:`pipelines.store.warehouse.Warehouse.open`:
  writer lock, stale-temporary clean-up, pending erasures completed, runs directory registered.
* :func:`gather` — wait on futures with a tqdm bar.
* :func:`write_study_result` — validate with :func:`dashboards.schema.validate_result` and write
  ``<runs>/<study>/result.json`` atomically.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
from pathlib import Path
from typing import Any

from pipelines.runtime.futures import chunks, gather  # noqa: F401  (re-exported)
from pipelines.runtime.results import (  # noqa: F401  (re-exported: the flows import them from here)
    cache_note,
    in_flow_run,
    publish_artifacts,
    runtime_with_cache,
    seed_only_where_comparable,
    write_study_result,
)
from pipelines.settings import COUNT, SECONDS

RESULTS_SUBDIR = ".prefect-results"
DEFAULT_RUNS = Path("runs")
_PATH_PARAMS = ("warehouse", "runs_dir")


def make_task_runner(dask_address: str | None = None, max_workers: int = 2):
    """Bounded-concurrency task runner: a thread pool, or a Dask cluster at ``dask_address``."""
    if dask_address:
        from prefect_dask import DaskTaskRunner

        return DaskTaskRunner(address=dask_address)
    return _interruptible_runner_class()(max_workers=int(max_workers))


_RUNNER_CLASS = None

#: Prefect's private attributes of ``ThreadPoolTaskRunner`` that the interruptible runner relies
#: on: ``_executor`` (the ``concurrent.futures.ThreadPoolExecutor`` that Prefect's own ``__exit__``
#: shuts down and joins, unless it is None) and ``_cancel_events`` (task run id -> the
#: ``threading.Event`` a running task polls). ``tests/test_pipelines_runner_contract.py`` fails,
#: naming the attribute and the Prefect version, when an upgrade changes either; the supported
#: Prefect range in pyproject.toml is the tested minor release.
PREFECT_PRIVATE_ATTRIBUTES = ("_executor", "_cancel_events")


def _interruptible_runner_class():
    """``ThreadPoolTaskRunner`` that, when the flow is interrupted (Ctrl-C, SIGTERM via
    :mod:`pipelines.runtime.signals`, Prefect's ``TerminationSignal``), abandons its running worker
    threads instead of joining them: Prefect's own ``__exit__`` waits for every running task, so
    the flow run would neither record its crash nor let the command exit until the longest task
    finished. Pending tasks are cancelled; running ones are left to die with the process.
    It uses :data:`PREFECT_PRIVATE_ATTRIBUTES`; if a Prefect release lacked them, an interrupt
    would fall back to Prefect's own (joining) exit instead of failing."""
    global _RUNNER_CLASS
    if _RUNNER_CLASS is None:
        from prefect.exceptions import TerminationSignal
        from prefect.task_runners import ThreadPoolTaskRunner

        class InterruptibleThreadPoolTaskRunner(ThreadPoolTaskRunner):
            def __exit__(self, exc_type, exc_value, traceback):
                executor = getattr(self, "_executor", None)
                if (exc_type is not None and issubclass(exc_type, (KeyboardInterrupt, SystemExit, TerminationSignal))
                        and executor is not None and hasattr(executor, "shutdown")):
                    self._executor = None
                    for event in dict(getattr(self, "_cancel_events", None) or {}).values():
                        event.set()
                    executor.shutdown(wait=False, cancel_futures=True)
                super().__exit__(exc_type, exc_value, traceback)

        _RUNNER_CLASS = InterruptibleThreadPoolTaskRunner
    return _RUNNER_CLASS


#: retry delays of tasks whose I/O can fail transiently (reading sources or the warehouse, writing
#: atomically swapped files) and whose repetition changes nothing; each such task says
#: ``retries=2, retry_delay_seconds=IO_RETRY_DELAYS, retry_condition_fn=retry_transient_io``.
#: Never on a task that commits (ingest increments, forget, ledger writes): a retry after a
#: commit whose acknowledgement was lost would apply it twice.
IO_RETRY_DELAYS = [2, 10]


def retry_transient_io(task, task_run, state) -> bool:
    """``retry_condition_fn`` of the I/O tasks: retry only an I/O error that may pass on its own
    (a busy DuckDB file, an interrupted read or write) — never a typed project error, a missing
    or forbidden path, or a computation's error (a retry would only repeat it, 2 and 10 s later)."""
    try:
        exc = state.result(raise_on_failure=False)
    except Exception:  # noqa: BLE001 - no exception to look at: do not retry
        return False
    if not isinstance(exc, BaseException) or _is_typed_error(exc):
        return False
    duckdb = sys.modules.get("duckdb")
    if duckdb is not None and isinstance(exc, getattr(duckdb, "IOException", ())):
        return True
    return isinstance(exc, OSError) and not isinstance(
        exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError))


def _is_typed_error(exc: BaseException) -> bool:
    from cohort.errors import CohortError
    from dashboards.errors import ReportError
    from evaluation.errors import EvaluationError
    from pipelines.errors import PipelineError
    from sv_core.errors import GateError

    return isinstance(exc, (PipelineError, CohortError, EvaluationError, GateError, ReportError))


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


def results_dir(runs_dir: str | os.PathLike) -> Path:
    return Path(runs_dir) / RESULTS_SUBDIR


@contextlib.contextmanager
def results_context(runs_dir: str | os.PathLike):
    """Prefect's local result storage, pointed at ``<runs>/.prefect-results`` and never
    persisting by default (record-level results live in :mod:`pipelines.runtime.task_cache`); and, on
    the command's private API server, no flow-run heartbeats (:func:`heartbeat_settings`)."""
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, PREFECT_RESULTS_PERSIST_BY_DEFAULT, temporary_settings

    d = results_dir(runs_dir).resolve()
    with temporary_settings({PREFECT_LOCAL_STORAGE_PATH: str(d), PREFECT_RESULTS_PERSIST_BY_DEFAULT: False,
                             **heartbeat_settings()}):
        yield d


def heartbeat_settings(shared: bool | None = None) -> dict:
    """The Prefect setting that turns flow-run heartbeats off, unless the command reports to a
    shared API server (``PREFECT_API_URL`` set; ``shared`` overrides the check).

    Prefect's flow engine sends a heartbeat from a thread that sleeps in 1 s steps and joins it
    when the flow ends, so every flow call ended on the next whole second after its work.
    Heartbeats let a server mark a run whose process died as crashed; a command's private server
    exits with the command, so nobody reads them. A shared server keeps them (Prefect's
    ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``)."""
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY

    if shared is None:
        shared = bool(PREFECT_API_URL.value())
    return {} if shared else {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}


def add_common_args(p, *, warehouse: bool = True) -> None:
    """Arguments every study subcommand takes."""
    if warehouse:
        p.add_argument("--warehouse", default="runs/warehouse.duckdb", help="DuckDB warehouse (default: %(default)s)")
    p.add_argument("--runs", default="runs",
                   help="runs directory for results and the task cache (default: %(default)s)")
    p.add_argument("--dask", default=None, metavar="ADDRESS",
                   help="run the work on the Dask scheduler at ADDRESS (README: Dask cluster)")
    p.add_argument("--workers", type=COUNT, default=2, help="thread-pool size when --dask is not given (default: 2)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    add_lock_args(p)


def add_lock_args(p) -> None:
    """``--ledger DIR`` and ``--wait SECONDS`` (every command that opens a warehouse)."""
    p.add_argument("--ledger", default=None, metavar="DIR",
                   help="forget registry / receipt ledger directory (default: $FORGETFUL_LEDGER_DIR or "
                        "<warehouse folder>/forget-registry)")
    p.add_argument("--wait", type=SECONDS, default=None, metavar="SECONDS",
                   help="how long to wait for another command's writer lock (default: $FORGETFUL_LOCK_WAIT or 300)")


@contextlib.contextmanager
def warehouse_session(args, must_exist: bool = True):
    """The command's warehouse handle (writer lock, pending erasures completed, runs directory
    registered), or nothing when the command has no warehouse."""
    from pipelines.receipts.ledger import LEDGER_ENV
    from pipelines.store.locking import WAIT_ENV
    from pipelines.store.warehouse import Warehouse

    # one setting for the whole process, so every flow and task resolves the same ledger and wait
    if getattr(args, "ledger", None):
        os.environ[LEDGER_ENV] = os.path.abspath(args.ledger)  # not resolved: a link there is refused, not followed
    if getattr(args, "wait", None) is not None:
        os.environ[WAIT_ENV] = str(float(args.wait))
    path = getattr(args, "warehouse", None)
    if not path:
        yield None
        return
    with Warehouse.open(path, write=True, must_exist=must_exist) as w:
        if w.path.is_file() and getattr(args, "runs", None):
            w.register_runs_dir(args.runs)
        yield w


def warehouse_locked(fn):
    """Decorate a flow function whose ``warehouse`` parameter names an existing warehouse: the
    flow body runs inside :meth:`Warehouse.open` (lock, clean-up, pending erasures completed),
    however the flow is started (CLI, ``serve`` deployment, another flow); inside the command's
    own session that open is its handle, reused. The wrapper carries the function's annotations
    resolved in its own module (Prefect validates the parameters by them: a settings dataclass)."""
    import functools
    import inspect
    import typing

    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        path = bound.arguments.get("warehouse")
        if not path or not Path(path).is_file():  # the flow itself says what is missing
            return fn(*args, **kwargs)
        from pipelines.store.warehouse import Warehouse

        with Warehouse.open(path, write=True, must_exist=True):
            return fn(*args, **kwargs)
    hints = typing.get_type_hints(fn)
    wrapper.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[p.replace(annotation=hints.get(p.name, p.annotation)) for p in sig.parameters.values()],
        return_annotation=hints.get("return", sig.return_annotation))
    return wrapper


def run_cli_flow(flow_obj, args, *, must_exist: bool = True, **params) -> Any:
    """Run ``flow_obj`` for a CLI subcommand inside the warehouse session, with the chosen task runner."""
    from pipelines.runtime.crash_hooks import cancel_abandoned, record_running

    runner = make_task_runner(getattr(args, "dask", None), getattr(args, "workers", 2))
    # a stopped command leaves no flow, subflow or task run "Running" in the Prefect UI
    flow_obj = flow_obj.with_options(
        task_runner=runner,
        on_running=[*getattr(flow_obj, "on_running_hooks", []), record_running],
        on_crashed=[*getattr(flow_obj, "on_crashed_hooks", []), cancel_abandoned])
    with warehouse_session(args, must_exist=must_exist), results_context(args.runs), \
            dask_hygiene(getattr(args, "dask", None)):
        return flow_obj(**params)


@contextlib.contextmanager
def dask_hygiene(dask_address: str | None):
    """Around a command that runs on the Dask scheduler at ``dask_address``: when it ends (also
    on an error), Prefect's event and API-log services on every worker are flushed to this
    command's API and stopped (:func:`pipelines.runtime.dask_hygiene.drain_workers`), so the next command's
    tasks on the same long-lived workers report to *its* API, not to this command's private
    server after it has exited. No-op without an address."""
    try:
        yield
    finally:
        if dask_address:
            from pipelines.runtime.dask_hygiene import drain_workers

            try:
                drain_workers(dask_address)
            except Exception as exc:  # noqa: BLE001 - the command's own outcome stands; say what was not done
                print(f"warning: could not drain Prefect services on the Dask workers at {dask_address}: "
                      f"{type(exc).__name__}", file=sys.stderr)


class _EchoRunPrints:
    """Flows run with ``log_prints=True``: a ``print`` inside a flow or task becomes an INFO record
    of the run logger, so it reaches the Prefect UI. This handler shows the same text on the
    console, plainly, as ``print`` would have (records from Prefect's own code are not echoed)."""


def configure_run_logging(verbose: bool = False) -> None:
    """Run logs (flow/task INFO records, ``log_prints`` output) always go to the Prefect API;
    on the console, without ``-v``: printed progress plainly, Prefect's own run records not at all
    (a failed run's ERROR record with its traceback would repeat the command's one typed line —
    the traceback stays in the Prefect UI). With ``-v`` Prefect's console handler shows everything."""
    if "prefect" not in sys.modules:  # a command that is not a flow: nothing to configure
        return
    import logging

    prefect_dir = str(Path(sys.modules["prefect"].__file__).resolve().parent)

    class EchoRunPrints(logging.Handler, _EchoRunPrints):
        def emit(self, record: logging.LogRecord) -> None:
            if record.pathname.startswith(prefect_dir) or getattr(record, "_forgetful_echoed", False):
                return
            record._forgetful_echoed = True  # a task record propagates through the flow logger too
            stream = sys.stdout if record.levelno < logging.WARNING else sys.stderr
            try:
                stream.write(record.getMessage() + "\n")
                stream.flush()
            except (OSError, ValueError):
                pass

    class QuietRunRecords(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return not record.name.startswith(("prefect.flow_runs", "prefect.task_runs"))

    for name in ("prefect.flow_runs", "prefect.task_runs"):
        lg = logging.getLogger(name)
        lg.setLevel(logging.INFO)  # the API handler gets run records even at PREFECT_LOGGING_LEVEL=WARNING
        for h in [h for h in lg.handlers if isinstance(h, _EchoRunPrints)]:
            lg.removeHandler(h)
        if not verbose:
            lg.addHandler(EchoRunPrints())
    # Prefect's queue services say "Still processing items: N items remaining..." (WARNING) while
    # the command drains its logs and events at exit: progress of Prefect's bookkeeping, not news
    for name in ("EventsWorker", "APILogWorker"):
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.ERROR)
    for h in logging.getLogger().handlers:
        for f in [f for f in h.filters if type(f).__name__ == "QuietRunRecords"]:
            h.removeFilter(f)
        if not verbose:
            h.addFilter(QuietRunRecords())


#: exit codes of every ``forgetful`` command (README, "Commands")
EXIT_OK, EXIT_VERIFY_FAILED, EXIT_USAGE, EXIT_DOMAIN, EXIT_STORAGE = 0, 1, 2, 3, 4


def is_lock_conflict(exc: BaseException) -> bool:
    """A DuckDB I/O error saying another process holds the database file's lock (DuckDB allows one
    writing process, or any number of reading ones, per file)."""
    duckdb = sys.modules.get("duckdb")
    return (duckdb is not None and isinstance(exc, getattr(duckdb, "IOException", ()))
            and "lock" in str(exc).lower())


def lock_conflict_line(exc: BaseException) -> str:
    """One line for :func:`is_lock_conflict`: which file, that nothing was changed, what to do."""

    m = re.search(r'file "([^"]+)"', str(exc))
    where = f" {m.group(1)}" if m else ""
    return (f"the database file{where} is open in another process (another forgetful command, a DuckDB "
            "shell or a notebook holding a connection); nothing was changed: close that connection and "
            "rerun the command")


def report_error(exc: BaseException) -> int | None:
    """The exit code of a command's error, after its one line on stderr: a typed project error
    (pipelines, cohort, evaluation, sv_core, dashboards) 3; a storage failure (disk full,
    read-only, permission: :class:`~pipelines.errors.StorageError`, or such an ``OSError`` /
    DuckDB I/O error raised untyped) 4; another process holding the DuckDB file 3. None: not a
    command error (a bug: let it raise). :func:`pipelines.cli.main` applies it to every command."""
    from cohort.errors import CohortError
    from dashboards.errors import ReportError
    from evaluation.errors import EvaluationError
    from pipelines.errors import PipelineError, StorageError
    from pipelines.store.safe_io import describe, storage_errno
    from sv_core.errors import GateError

    if isinstance(exc, StorageError):
        print(f"error: StorageError: {exc}", file=sys.stderr)
        return EXIT_STORAGE
    if isinstance(exc, (PipelineError, CohortError, EvaluationError, GateError, ReportError)):
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_DOMAIN
    if not isinstance(exc, Exception):
        return None
    if is_lock_conflict(exc):  # another process (a reader too) holds the DuckDB file
        print(f"error: WarehouseBusyError: {lock_conflict_line(exc)}", file=sys.stderr)
        return EXIT_DOMAIN
    if storage_errno(exc) is None:
        return None
    where = getattr(exc, "filename", None)
    print(f"error: StorageError: {describe(exc)}{f' at {where}' if where else ''}; the command stopped; rerun "
          "it once the disk allows (a pending erasure is completed by the next command)", file=sys.stderr)
    return EXIT_STORAGE


def cli_errors(fn):
    """Wrap a CLI ``func`` with :func:`report_error` (usage errors stay argparse's 2). The
    ``forgetful`` entry point applies it to every command itself; this decorator is for a command
    function called on its own."""
    import functools

    @functools.wraps(fn)
    def wrapper(args) -> int:
        try:
            return int(fn(args) or 0)
        except Exception as exc:
            rc = report_error(exc)
            if rc is None:
                raise
            return rc
    return wrapper
