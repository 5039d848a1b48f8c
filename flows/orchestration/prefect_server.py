"""Prefect's temporary server, started at the top of a command instead of at its first API call.

With no API URL configured, Prefect starts a temporary server the first time a flow talks to
its API: after the command has imported torch, MLflow and the flow, the process imports
Prefect's whole server app (4 s here) only to launch it, and then waits for the server's own
start (5-8 s warm). `temporary_prefect_server` launches the same server app (the uvicorn
command of Prefect's `SubprocessASGIServer`) before those imports, so the server starts on one
core while the command imports on the other, and points this process and its children at it.
With an API URL configured (environment, profile or prefect.toml) it does nothing. Several
commands started at once on a fresh $PREFECT_HOME take turns to set its database up (the first
server's migrations run alone), then run side by side.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from flows.common.errors import OrchestratorError
from flows.common.shared_stores import FirstUse, sqlite_file

# Prefect's SubprocessASGIServer: the server app without UI and with ephemeral-mode services.
SERVER_ENVIRONMENT = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}

# The API URL of a temporary server this command started, for its child processes (a `dvc repro`'s
# stages, Dask workers): they inherit PREFECT_API_URL, and this says the server dies with the command.
TEMPORARY_API_ENV = "FEDCME_TEMPORARY_PREFECT_API_URL"

T = TypeVar("T")
_running: list[TemporaryServer] = []  # the server of the active `temporary_prefect_server` block


class TemporaryServer:
    """A Prefect server process on 127.0.0.1, stopped with `stop` (or when this process dies).

    A server's start-up creates or migrates the sqlite database under $PREFECT_HOME; on its first
    use (:class:`~flows.common.shared_stores.FirstUse`) one server at a time does that: a server launched
    while another command's is setting the database up waits, unlaunched, until `wait_ready`."""

    def __init__(self) -> None:
        self.port = free_port()
        self.ready = False
        self.setup = database_setup()
        self.process: subprocess.Popen | None = _launch(self.port) if self._may_launch_now() else None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def _may_launch_now(self) -> bool:
        """True when the database is set up, or this server is to set it up (the lock is ours)."""
        if self.setup is None or self.setup.is_done():
            return True
        if not self.setup.try_begin():
            return False
        if self.setup.is_done():  # set up by another command between the two looks
            self.setup.abandon()
        return True

    def wait_ready(self, timeout: float) -> None:
        """Block until the server answers its health check; a server that cannot start is an error."""
        try:
            if self.process is None:
                if not self.setup.begin(timeout):
                    raise OrchestratorError(
                        f"another command has been setting up Prefect's database {self.setup.database} for over "
                        f"{timeout:.0f} s (it holds {self.setup.lock.path}); try again when it has started")
                if self.setup.is_done():
                    self.setup.abandon()
                self.process = _launch(self.port)
            wait_until_healthy(self.process, self.api_url, timeout, "the temporary Prefect server")
        except OrchestratorError:
            self.stop()
            raise
        self.ready = True
        if self.setup is not None:
            self.setup.finish()  # records the set-up when this server did it; lets go of the lock

    def stop(self) -> None:
        """SIGTERM and 5 s for a server that answered (it finishes its writes); SIGKILL at once for
        one still starting, which holds no record of ours and would finish its whole start-up
        before it handled the SIGTERM (about 10 s here). A database set-up left unfinished is let
        go only once its server is gone."""
        try:
            self._stop_process()
        finally:
            if self.setup is not None:
                self.setup.abandon()

    def _stop_process(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        if self.ready:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
                return
            except subprocess.TimeoutExpired:
                pass
        self.process.kill()
        self.process.wait()


def database_setup() -> FirstUse | None:
    """The first-use lock of the server's sqlite database (None for another database)."""
    from prefect import __version__
    from prefect.settings import get_current_settings

    url = get_current_settings().server.database.connection_url
    text = url.get_secret_value() if hasattr(url, "get_secret_value") else str(url or "")
    database = sqlite_file(text)
    return None if database is None else FirstUse(database, "prefect", __version__)


@contextlib.contextmanager
def temporary_prefect_server() -> Iterator[TemporaryServer | None]:
    """Start Prefect's temporary server now when no API URL is configured, and use it inside.

    Yields the server (None when an API URL is configured). Inside the block this process's
    Prefect settings and the environment its worker processes inherit point at the server;
    call `wait_ready` before the first API call. The server stops when the block exits.
    """
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    settings = get_current_settings()
    if settings.api.url:
        yield None
        return
    server = TemporaryServer()
    previous = {name: os.environ.get(name) for name in ("PREFECT_API_URL", TEMPORARY_API_ENV)}
    os.environ["PREFECT_API_URL"] = os.environ[TEMPORARY_API_ENV] = server.api_url
    _running.append(server)
    try:
        with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
            try:
                yield server
            finally:
                # Drained while the settings still point at this server: a worker that flushed
                # after them would find no API URL and start Prefect's own temporary server, one
                # without a death signal. Before the server answered, nothing was sent to it.
                if server.ready:
                    drain_prefect_workers()
    finally:
        _running.remove(server)
        server.stop()
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_against_prefect(action: Callable[[Callable[[], None]], T], purpose: str) -> T:
    """`action(ready)` against the configured Prefect API, else against a temporary server started first.

    `action` does its slow imports, then calls `ready()` before its first API call: with a
    temporary server, that says so in one line (naming `purpose`) and waits until the server,
    booting on the other core meanwhile, answers. The server stops when `action` returns.
    """
    with temporary_prefect_server() as server:

        def ready() -> None:
            if server is not None:
                print(f"Prefect: no PREFECT_API_URL set, so {purpose} uses a temporary Prefect server "
                      "(records kept in $PREFECT_HOME/prefect.db; its UI: docs/orchestration.md, "
                      "\"Prefect's UI and schedules\")", flush=True)
                server.wait_ready(startup_timeout())

        return action(ready)


def is_temporary(api_url: str | None) -> bool:
    """True for no API URL (Prefect starts its own temporary server), for ours, and for the one the
    command that started this process runs (``$FEDCME_TEMPORARY_PREFECT_API_URL``: a stage of
    ``flows.pipeline.repro``'s grid): each stops with the command that started it."""
    return (not api_url or any(server.api_url == api_url for server in _running)
            or api_url == os.environ.get(TEMPORARY_API_ENV))


def drain_prefect_workers() -> None:
    """Send this process's buffered Prefect logs and events before the server stops (as
    Prefect's test harness does), so that stopping it costs no connection errors."""
    import inspect

    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.utilities.asyncutils import run_coro_as_sync

    async def drain() -> None:
        try:
            drained = APILogWorker.instance().drain()
            if inspect.isawaitable(drained):
                await drained
        except RuntimeError:  # the log worker never started
            pass
        drained = EventsWorker.drain_all()
        if inspect.isawaitable(drained):
            await drained

    run_coro_as_sync(drain())


def startup_timeout() -> float:
    from prefect.settings import get_current_settings

    return float(get_current_settings().server.ephemeral.startup_timeout_seconds)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def server_command(port: int) -> list[str]:
    """The command of Prefect's `SubprocessASGIServer`: its server app under uvicorn on 127.0.0.1
    (run it with `SERVER_ENVIRONMENT`)."""
    import importlib.util

    site_packages = Path(importlib.util.find_spec("prefect").origin).parent.parent
    return [
        sys.executable, "-m", "uvicorn", "--app-dir", str(site_packages),
        "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
        "--log-level", "error", "--lifespan", "on",
    ]


def wait_until_healthy(process: subprocess.Popen, api_url: str, timeout: float, name: str) -> None:
    """Block until the server `process` answers `api_url`/health; `name` says which server in the
    one-line error when it exits first or does not answer within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = process.poll()
        if status is not None:  # 3: another process took the free port between probe and bind
            raise OrchestratorError(f"{name} at {api_url} exited with status {status} while starting")
        try:
            with urllib.request.urlopen(f"{api_url}/health", timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.05)
    raise OrchestratorError(f"{name} did not answer within {timeout:.0f} s "
                            "(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)")


def _launch(port: int) -> subprocess.Popen:
    from prefect.settings import get_current_settings

    environment = {
        **os.environ, **SERVER_ENVIRONMENT, **get_current_settings().to_environment_variables(exclude_unset=True),
    }
    # A session of its own: a Ctrl-C (or a signal to the command's process group) reaches the
    # command, which then reports its flow run's end to a server still up, and stops it after.
    return subprocess.Popen(  # noqa: PLW1509 - launched from the main thread, see stop_with_parent
        server_command(port), env=environment, start_new_session=True,
        preexec_fn=functools.partial(stop_with_parent, os.getpid()),
    )


def stop_with_parent(parent: int) -> None:
    """In the server's process, before exec (Linux): SIGKILL when the command that started it dies.

    SIGKILL, not SIGTERM: uvicorn handles a SIGTERM only after the app's start-up (seconds), and
    an orphan has no one to finish its writes for. The signal follows the launching *thread*, so
    the server is launched from the main thread, which lives as long as the command. A parent
    that died between fork and prctl is caught by the getppid check.
    """
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(1)
