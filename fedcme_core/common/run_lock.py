"""A run directory's name, and its one holder at a time (re-exported by ``fedcme_core.rounds.lock``).

The process that drives a run's rounds (``fedcme train``, ``fedcme simulate``, the DVC train
stage, a scheduled run, ``fedcme sync``) holds a kernel lock (flock) on ``runs/.NAME.lock``,
beside ``runs/NAME``, for as long as it works on it. A second command on the same run directory
stops at once with one line naming the directory, the holder's PID and its start time. The lock
dies with its holder, so a run killed by SIGKILL leaves nothing to clean by hand. The steps a
holder sends to its threads or Dask workers are part of its run: only the driving process locks.
Taking a lock this process already holds only counts (the flow inside ``fedcme train`` does).

It lives at the ground floor and imports no torch, so a command takes the lock in its first
second, before its slow start-up (Prefect's server, torch, MLflow): a duplicate launch is refused
at once. A runs folder where the lock file cannot be created (read-only, full) is one
:class:`~fedcme_core.common.errors.StorageError` line naming the file and the errno.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import socket
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from fedcme_core.common.errors import RunError, StorageError, storage_message
from fedcme_core.common.locks import FileLock

EXPERIMENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")

_held: dict[str, list] = {}  # lock file (real path) -> [FileLock, how many holds of this process]
_guard = threading.Lock()


def check_experiment_name(name: str) -> str:
    """An experiment name is one path component: letters, digits, '.', '_', '-' (no '/', no '..')."""
    if not EXPERIMENT_NAME.match(name) or ".." in name:
        raise RunError(f"experiment name {name!r}: use letters, digits, '.', '_' and '-' only (no '/' or '..')")
    return name


def experiment_run_dir(runs_dir: str | Path, experiment: str) -> Path:
    """runs_dir/experiment, for a name that cannot escape `runs_dir`."""
    return Path(runs_dir) / check_experiment_name(experiment)


def run_lock_path(run_dir: str | Path) -> Path:
    """`runs/NAME` -> `runs/.NAME.lock` (outside the run directory: removing it does not free the run)."""
    run_dir = Path(run_dir)
    return run_dir.parent / f".{run_dir.name}.lock"


def holder_record() -> dict[str, object]:
    """Who holds the run: this process's PID, host, start of the hold and command line."""
    command = shlex.join([Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python", *sys.argv[1:]])
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": datetime.now().astimezone().isoformat(),
            "command": command[:300]}


def busy_message(run_dir: Path, lock: FileLock, wait: float = 1.0) -> str:
    """`runs/x is in use by PID 4242 (started 2026-12-07 19:22:04 UTC, `fedcme train ...`); ...`."""
    deadline = time.monotonic() + wait
    record = lock.read()
    while record is None and time.monotonic() < deadline:  # the holder writes its record just after locking
        time.sleep(0.05)
        record = lock.read()
    if record is None:
        holder = "another process (it has not written its PID yet)"
    else:
        try:
            started = datetime.fromisoformat(str(record.get("started"))).strftime("%Y-%m-%d %H:%M:%S %Z")
        except ValueError:
            started = "at an unknown time"
        host = "" if record.get("host") == socket.gethostname() else f" on {record.get('host')}"
        holder = f"PID {record.get('pid')}{host} (started {started}, `{record.get('command')}`)"
    return (f"{run_dir} is in use by {holder}; a run directory belongs to one command at a time: wait for it "
            "to end (or stop it), then run this again to resume")


def _take(run_dir: Path, path: Path) -> FileLock:
    """The lock on `path`, taken and recorded; RunError when another process holds it, StorageError
    when the machine refuses its file."""
    lock = FileLock(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        taken = lock.try_acquire()
    except OSError as error:
        raise StorageError(storage_message(path, error, "cannot create the run's lock file")) from None
    if not taken:
        raise RunError(busy_message(run_dir, lock))
    try:
        lock.write(holder_record())
    except OSError as error:
        lock.release()
        raise StorageError(storage_message(path, error, "cannot write the run's lock file")) from None
    except BaseException:
        lock.release()
        raise
    return lock


@contextlib.contextmanager
def hold_run(run_dir: str | Path, tidy: bool = False) -> Iterator[None]:
    """Hold `run_dir` for this process inside the block; RunError at once when another process holds it.

    With `tidy` (a command's entry point, which takes the lock before its checks): when the block
    ends and `run_dir` does not exist (the command stopped on bad input before writing anything),
    the lock file and the runs folder this hold created are removed again."""
    run_dir = Path(run_dir)
    path = run_lock_path(run_dir)
    key = os.path.realpath(path)
    created = [folder for folder in (run_dir.parent, *run_dir.parent.parents) if not folder.exists()] if tidy else []
    created_lock = tidy and not path.exists()
    with _guard:
        entry = _held.get(key)
        if entry is not None:
            entry[1] += 1
            created_lock = False
        else:
            _held[key] = [_take(run_dir, path), 1]
    try:
        yield
    finally:
        with _guard:
            entry = _held[key]
            entry[1] -= 1
            if entry[1] == 0:
                del _held[key]
                if created_lock and not run_dir.exists():
                    entry[0].remove()
                    _remove_empty(created)
                else:
                    entry[0].release()


def _remove_empty(folders: list[Path]) -> None:
    """Remove `folders` (deepest first) that are still empty; one another command has used stays."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return
