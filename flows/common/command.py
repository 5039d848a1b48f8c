"""What every command of the project shares (``fedcme``, the DVC stages, ``flows.pipeline.repro``, the
benchmarks): quiet, offline-safe library settings, bad input reported as one line, and a
prompt exit once the work is done.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Callable
from typing import NoReturn

# Quiet, offline-safe defaults for the stack (a user's own settings win).
QUIET_ENVIRONMENT = {
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "DASK_LOGGING__DISTRIBUTED": "error",
    "MLFLOW_LOGGING_LEVEL": "WARNING",
    # Prefect's temporary server gets 20 s to start by default; a busy shared machine needs more.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
}


def quiet_environment() -> None:
    for key, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(key, value)


def known_errors() -> tuple[type[Exception], ...]:
    """Bad input and unusable services: reported as one line, without a traceback."""
    from fedcme_core.common.checkpoints import CheckpointError
    from fedcme_core.common.errors import StorageError
    from fedcme_core.config.schema import ConfigError
    from fedcme_core.data.datasets import DataError
    from fedcme_core.server.faults import RoundError
    from fedcme_core.rounds import RunError
    from fedcme_core.data.partition import PartitionError

    from flows.common.errors import OrchestratorError, TrackingError

    return (ConfigError, DataError, PartitionError, CheckpointError, RunError, RoundError, TrackingError,
            OrchestratorError, StorageError)


class ProjectErrorFilter(logging.Filter):
    """Keeps off a console handler the ERROR records of Prefect's flow and task runs that are about an
    error the project raises itself (:func:`known_errors`) or the machine's (a full or read-only disk,
    ``fedcme_core.common.errors.machine_error``): the command reports it in one line, and
    Prefect's own log of it, traceback included, stays in Prefect's UI (its API handler is the
    run loggers' own, which this filter does not touch)."""

    RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or not record.name.startswith(self.RUN_LOGGERS):
            return True
        from fedcme_core.common.errors import MACHINE_ERRNOS, machine_error

        errors = known_errors()
        if record.exc_info and (isinstance(record.exc_info[1], errors) or machine_error(record.exc_info[1])):
            return False
        message = record.getMessage()
        return not (any(f"{error.__name__}(" in message or f"{error.__name__}:" in message for error in errors)
                    or any(f"[Errno {code}]" in message for code in MACHINE_ERRNOS))


def keep_project_errors_off_the_console() -> None:
    """Add :class:`ProjectErrorFilter` to the console handlers Prefect's logging set up (the root
    logger's), once; call it after Prefect is imported, before a flow runs."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(existing, ProjectErrorFilter) for existing in handler.filters):
            handler.addFilter(ProjectErrorFilter())


def check_device(setting: str) -> None:
    """A config's `device` this machine has, else a ConfigError (one line; `cuda` without a GPU)."""
    from fedcme_core.config.schema import ConfigError
    from fedcme_core.client.models import resolve_device

    try:
        resolve_device(setting)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def report_errors(action: Callable[[], int]) -> int:
    """Run `action`; a known bad input, or a disk's fault (full, read-only), becomes one line on stderr
    and exit status 2.

    The error classes are imported only when something fails, so that a command's first
    step (starting Prefect's server, for `train`) comes before torch is imported.
    """
    try:
        return action()
    except KeyboardInterrupt:
        print("fedcme: interrupted; run the same command again to resume from the last completed round", file=sys.stderr)
        return 130
    except Exception as error:
        from fedcme_core.common.errors import machine_error

        if not isinstance(error, known_errors()):
            error = machine_error(error) or error  # a disk's fault met outside the run's own writes
        if not isinstance(error, known_errors()):
            raise
        print(f"fedcme: error: {error}", file=sys.stderr)
        return 2


_library_showwarning = warnings.showwarning


def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Our recovery warnings as one line, `fedcme: warning: ...`; the libraries' as Python shows them."""
    from fedcme_core.rounds import RecoveryWarning

    if issubclass(category, RecoveryWarning):
        print(f"fedcme: warning: {message}", file=sys.stderr, flush=True)
    else:
        _library_showwarning(message, category, filename, lineno, file, line)


def exit_promptly(status: int) -> NoReturn:
    """End a finished command with `status` without the interpreter's teardown.

    After a run, tearing down torch's, MLflow's and Prefect's modules took 2.5-3 s here, longer
    than a round of the smoke config. The atexit handlers still run (logging's, MLflow's) and the
    standard streams are flushed; by then every file the command wrote is closed (written whole
    and renamed into place), its Prefect server stopped and its MLflow run ended.
    """
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
