"""Process hygiene of the ``forgetful`` command: its own Prefect API server and clean signals.

Only the ``forgetful`` process itself uses this (``pipelines.cli.main()`` called without
``argv``); a call of ``main([...])`` from Python changes nothing in the caller's process.
:class:`ApiServer` starts one API server per flow command (unless ``PREFECT_API_URL`` names one)
before the command's heavy imports, and it dies with the command; :class:`Guard` turns SIGINT and
SIGTERM into a prompt, clean stop (exit 130 / 143, nothing left *Running*, no process left).
Commands that are not flows (:data:`SERVERLESS_COMMANDS`, any ``--help``) start nothing.
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from pipelines.errors import PipelineError

#: commands that are not flows: they never need a Prefect API
SERVERLESS_COMMANDS = frozenset({"forget", "receipts", "gate-demo", "export", "report", "witness", "meds-dev"})
#: commands whose signals Prefect handles (``serve``: its runner starts flow runs as subprocesses,
#: which would inherit the blocked SIGINT/SIGTERM of a guarded command)
UNGUARDED_COMMANDS = frozenset({"serve"})
#: seconds the main thread gets to unwind after a signal (so Prefect records the run as crashed)
#: before the command leaves anyway (tests/test_pipelines_signals.py interrupts run-all)
GRACE_S = 3.5
#: ``FORGETFUL_API_SERVER=0``: start no server of our own (Prefect's ephemeral server, as before)
OWN_SERVER_ENV = "FORGETFUL_API_SERVER"
SIGNALS = (signal.SIGINT, signal.SIGTERM)
_WAKE = signal.SIGUSR2  # watcher -> main thread
_PR_SET_PDEATHSIG = 1


class ApiServerError(PipelineError):
    """The command's Prefect API server did not start (its last log line is in the message)."""


class Interrupted(KeyboardInterrupt):
    """Raised in the main thread when the command got SIGINT or SIGTERM."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


def exit_code(signum: int) -> int:
    """The shell convention: 128 + the signal number (130 SIGINT, 143 SIGTERM)."""
    return 128 + int(signum)


def needs_server(cmd: str | None, argv: list[str]) -> bool:
    """Whether ``forgetful <argv>`` runs a Prefect flow (and so needs an API)."""
    if not cmd or cmd in SERVERLESS_COMMANDS or "-h" in argv or "--help" in argv:
        return False
    if cmd == "serve" and "--dry-run" in argv:
        return False
    return True


def api_configured() -> bool:
    """A Prefect API is configured: ``PREFECT_API_URL`` in the environment, in the active Prefect
    profile (``prefect config set PREFECT_API_URL=...``) or in ``./prefect.toml`` — read without
    importing Prefect, which fixes its settings at import — or in Prefect's loaded settings."""
    if os.environ.get("PREFECT_API_URL"):
        return True
    if "prefect" in sys.modules:
        from prefect.settings import PREFECT_API_URL

        return bool(PREFECT_API_URL.value())
    return bool(_configured_url())


def _configured_url() -> str | None:
    import tomllib

    home = Path(os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser()
    profiles = Path(os.environ.get("PREFECT_PROFILES_PATH") or home / "profiles.toml").expanduser()
    try:
        data = tomllib.loads(profiles.read_text())
        active = os.environ.get("PREFECT_PROFILE") or data.get("active") or "ephemeral"
        url = (data.get("profiles") or {}).get(active, {}).get("PREFECT_API_URL")
        if url:
            return str(url)
    except (OSError, ValueError, AttributeError):
        pass
    try:
        return (tomllib.loads(Path("prefect.toml").read_text()).get("api") or {}).get("url") or None
    except (OSError, ValueError, AttributeError):
        return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child_setup(parent: int):
    """``preexec_fn`` of the server: die with the command (also on ``kill -9``); take signals."""
    def setup() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # not Linux: the command still stops it on every exit
            pass
        if os.getppid() != parent:  # the command died before prctl took effect
            os._exit(1)
    return setup


#: the server child: Prefect's uvicorn app (what ``uvicorn --factory
#: prefect.server.api.server:create_app`` runs), with the cyclic garbage collector paused while
#: Prefect's modules are imported and the app is built — those build thousands of pydantic models,
#: and the collections they trigger are a sizeable share of the child's start; what is alive then is
#: frozen (never scanned again) and collection resumes before the first request. Prefect's "final app" mode
#: (``PREFECT__SERVER_FINAL``) is asked for only where it still saves memory (a FastAPI that copies
#: included routes, < 0.137); with a newer FastAPI all it does is one full ``gc.collect()`` of the
#: whole heap, for a few unreachable objects that now stay frozen. argv: site-packages folder
#: (first on the path, as ``--app-dir`` did, so nothing in the working folder shadows Prefect), port.
SERVER_MAIN = """\
import gc, os, sys
gc.disable()
sys.path.insert(0, sys.argv[1])
import uvicorn
import prefect.server.api.server as server
from prefect.server.api.server import create_app
if getattr(server, "_FASTAPI_COPIES_ROUTES_ON_INCLUDE", True):
    os.environ["PREFECT__SERVER_FINAL"] = "1"
def app():
    built = create_app()
    gc.freeze()
    gc.enable()
    return built
uvicorn.run(app, factory=True, host="127.0.0.1", port=int(sys.argv[2]), log_level="error", lifespan="on")
"""


def server_argv(site: str, port: int) -> list[str]:
    """The command line of the API server child (see :data:`SERVER_MAIN`)."""
    return [sys.executable, "-c", SERVER_MAIN, site, str(port)]


class ApiServer:
    """One Prefect API server for this command.

    A flow command needs a Prefect API. When ``PREFECT_API_URL`` is set (a running
    ``prefect server start``), it is used and nothing is started. Otherwise the command starts one
    API server for itself — the same uvicorn app Prefect's ephemeral mode runs — *before* it imports
    the command module (torch, Prefect), so the server's start overlaps the command's own imports,
    and the command process never imports the server code. The server child

    * runs in its own session, so a Ctrl-C in the terminal reaches only the command (which then
      stops the server itself, after the flow run has recorded its final state — no shutdown
      tracebacks);
    * dies with the command: ``PR_SET_PDEATHSIG`` (SIGKILL) is set in the child before ``exec``, so
      even a ``kill -9`` of the command leaves no server behind;
    * uses the user's Prefect database (``$PREFECT_HOME``, already migrated after the first run);
    * imports Prefect and builds the app with the garbage collector paused (:data:`SERVER_MAIN`).

    ``FORGETFUL_API_SERVER=0`` leaves it to Prefect's own ephemeral server.
    """

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self._log: Path | None = None
        self._ready = False

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def start(self) -> ApiServer:
        import importlib.util

        spec = importlib.util.find_spec("prefect")
        if spec is None or not spec.origin:
            raise ApiServerError("Prefect is not installed")
        self.port = _free_port()
        fd, log = tempfile.mkstemp(prefix="forgetful-api-", suffix=".log")
        self._log = Path(log)
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
               "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        env.pop("PREFECT_API_URL", None)
        env.pop("PREFECT__SERVER_FINAL", None)  # the child decides (SERVER_MAIN)
        # a command's own server serves one flow run: no automations (triggers + actions), no
        # websocket streams (nothing subscribes), no block-type registration (the flows use no
        # blocks; even memoized it imports every installed collection, e.g. prefect-dask), which
        # shortens its start; task-run recording and events stay on
        for k in ("PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED", "PREFECT_SERVER_EVENTS_STREAM_OUT_ENABLED",
                  "PREFECT_SERVER_LOGS_STREAM_OUT_ENABLED", "PREFECT_SERVER_REGISTER_BLOCKS_ON_START",
                  "PREFECT_SERVER_MEMOIZE_BLOCK_AUTO_REGISTRATION"):
            env.setdefault(k, "false")
        try:
            self.proc = subprocess.Popen(
                server_argv(str(Path(spec.origin).parent.parent), self.port),
                env=env, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, start_new_session=True,
                preexec_fn=_child_setup(os.getpid()))
        finally:
            os.close(fd)
        # every Prefect client of this process (flows, tasks, artifacts) talks to it
        os.environ["PREFECT_API_URL"] = self.api_url
        return self

    def _last_log_line(self) -> str:
        try:
            lines = [ln for ln in self._log.read_text(errors="replace").splitlines() if ln.strip()]
        except (OSError, AttributeError):
            return ""
        return lines[-1][-300:] if lines else ""

    def wait_ready(self, timeout: float | None = None) -> None:
        if self._ready or self.proc is None:
            return
        timeout = float(timeout or os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS") or 180)
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise ApiServerError(f"the Prefect API server exited with code {self.proc.returncode}: "
                                     f"{self._last_log_line()}")
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as r:
                    if r.status == 200:
                        self._ready = True
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise ApiServerError(f"the Prefect API server did not answer within {timeout:.0f} s (raise "
                             "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, or start one with "
                             "`prefect server start` and set PREFECT_API_URL)")

    def stop(self, timeout: float = 3.0) -> None:
        p, self.proc = self.proc, None
        if p is not None and p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self._log is not None:
            self._log.unlink(missing_ok=True)
            self._log = None

    def kill(self) -> None:
        """SIGKILL without waiting (the hard exit; the child is reaped by init after ``os._exit``)."""
        p = self.proc
        if p is not None and p.poll() is None:
            try:
                p.kill()
            except OSError:
                pass
        if self._log is not None:
            self._log.unlink(missing_ok=True)


_current: ApiServer | None = None


def wait_for_api() -> None:
    """Block until this command's own API server answers (no-op without one)."""
    if _current is not None:
        _current.wait_ready()


def _drain_prefect() -> None:
    """Send Prefect's queued logs and events while the server is still up."""
    if "prefect" not in sys.modules:
        return
    for mod, name in (("prefect.logging.handlers", "APILogWorker"), ("prefect.events.worker", "EventsWorker")):
        m = sys.modules.get(mod)
        if m is None:
            continue
        try:
            getattr(m, name).drain_all(timeout=3)
        except Exception:  # noqa: BLE001 - best effort at shutdown
            pass


class Guard:
    """Signal watcher of the command process.

    SIGINT and SIGTERM are blocked in every thread of the command and taken by one watcher thread
    (``sigwaitinfo``), so a signal is seen at once even while the main thread is inside a long
    NumPy/DuckDB/torch call. On the first one the watcher prints one line
    (``forgetful: stopped by SIGINT (exit 130)``) and wakes the main thread with a real signal
    (SIGUSR2, so a wait on futures or a lock returns) whose handler raises :class:`Interrupted`
    (a ``KeyboardInterrupt``). The main thread unwinds: the thread-pool task runner cancels pending
    tasks and abandons running ones instead of joining them
    (:func:`pipelines.runtime.runner.make_task_runner`), Prefect marks the flow run *Crashed*, ``with``
    blocks release the warehouse lock and remove their temporaries, and the command stops its server
    and leaves with ``os._exit`` (abandoned worker threads are not joined). Before the server stops,
    the runs the command leaves unfinished are closed on the API (:mod:`pipelines.runtime.crash_hooks`:
    the flow run *Crashed*, its unfinished subflow and task runs *Cancelled*). If the main thread has
    not unwound after :data:`GRACE_S` seconds, or at a second signal, the command leaves anyway — the
    kernel releases the ``flock``, and stale temporaries of a dead process are removed by the next
    writer (:func:`pipelines.store.locking.clean_stale`). Exit codes: 130 after SIGINT, 143 after
    SIGTERM. Child processes inherit the blocked signals: the API server unblocks them before
    ``exec``; ``subprocess.run`` kills its child when the interrupt unwinds it; ``serve``, whose runner
    starts every flow run as a subprocess, is left to Prefect's own signal handling
    (:data:`UNGUARDED_COMMANDS`). ``tests/test_pipelines_signals.py`` interrupts real commands.
    """

    def __init__(self, server: ApiServer | None):
        self.server = server
        self.signum: int | None = None
        self.done = False  # the command body has returned: a signal now means "leave at once"
        self._lock = threading.Lock()
        self._leaving = False
        self._main = threading.main_thread().ident

    def install(self) -> None:
        signal.signal(_WAKE, self._raise_in_main)
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)  # inherited by every thread started later
        threading.Thread(target=self._watch, name="forgetful-signals", daemon=True).start()

    def _raise_in_main(self, signum, frame):  # the main thread, woken by the watcher
        if self.signum is not None and not self.done:
            raise Interrupted(self.signum)

    def _watch(self) -> None:
        while True:
            info = signal.sigwaitinfo(set(SIGNALS))
            if self.signum is not None or self.done:  # a second signal, or nothing left to unwind
                self.signum = self.signum or info.si_signo
                self.leave()
            self.signum = info.si_signo
            name = signal.Signals(self.signum).name
            print(f"forgetful: stopped by {name} (exit {exit_code(self.signum)})", file=sys.stderr, flush=True)
            threading.Thread(target=self._grace, name="forgetful-grace", daemon=True).start()
            # a real signal, so a main thread blocked in a wait (futures, locks) wakes up too
            signal.pthread_kill(self._main, _WAKE)

    def _grace(self) -> None:
        time.sleep(GRACE_S)
        self.leave()

    def leave(self) -> None:
        """Stop the server and exit with 128 + the signal, abandoning worker threads."""
        with self._lock:
            if self._leaving:
                return
            self._leaving = True
        code = exit_code(self.signum or signal.SIGTERM)
        try:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            # what abandoned threads would still say (connection errors once the server is gone)
            # is not the user's business: the one line has been printed
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            if "pipelines.runtime.crash_hooks" in sys.modules:  # a flow ran: close its runs in the UI
                name = signal.Signals(self.signum or signal.SIGTERM).name
                sys.modules["pipelines.runtime.crash_hooks"].cancel_active(f"stopped by {name}")
            if self.server is not None:
                self.server.kill()
        finally:
            os._exit(code)


def run_command(cmd: str | None, argv: list[str], body) -> int:
    """Run ``body()`` (parse + the command) as the ``forgetful`` process: own API server when a
    flow needs one, signals handled as described above; returns the exit code."""
    global _current
    server = None
    if needs_server(cmd, argv) and not api_configured() and os.environ.get(OWN_SERVER_ENV, "1") != "0":
        server = _current = ApiServer().start()
    if cmd in UNGUARDED_COMMANDS:
        return _run_unguarded(body, server)
    guard = Guard(server)
    guard.install()
    try:
        rc = body()
    except ApiServerError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        rc = 3
    except BaseException:
        if guard.signum is not None:  # the main thread has unwound: leave with the signal's code
            guard.leave()
        guard.done = True
        _finish(server)
        raise
    guard.done = True
    if guard.signum is not None:
        guard.leave()
    _finish(server)
    return rc


def _run_unguarded(body, server: ApiServer | None) -> int:
    """``serve``: Prefect's runner handles the signals itself (it starts each flow run as a
    subprocess, which must keep SIGTERM deliverable); Ctrl-C still ends in one line and the
    private server is stopped on every way out."""
    try:
        return body()
    except KeyboardInterrupt:
        print(f"forgetful: stopped by SIGINT (exit {exit_code(signal.SIGINT)})", file=sys.stderr, flush=True)
        return exit_code(signal.SIGINT)
    except ApiServerError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 3
    finally:
        _finish(server)


def _finish(server: ApiServer | None) -> None:
    global _current
    _drain_prefect()
    if server is not None:
        server.stop()
    _current = None
