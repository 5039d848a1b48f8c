"""A run directory belongs to one process at a time.

The process that drives a run's rounds (``fedcme train``, ``fedcme simulate``, the DVC train
stage, a scheduled run, ``fedcme sync``) holds a kernel lock (flock) on ``runs/.NAME.lock``,
beside ``runs/NAME``, for as long as it works on it. A second command on the same run directory
stops at once with one line naming the directory, the holder's PID and its start time. The lock
dies with its holder, so a run killed by SIGKILL leaves nothing to clean by hand. The steps a
holder sends to its threads or Dask workers are part of its run: only the driving process locks.
Taking a lock this process already holds only counts (the flow inside ``fedcme train`` does).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from fedcme_core.common.locks import FileLock
from fedcme_core.rounds.store import RunError

_held: dict[str, list] = {}  # lock file (real path) -> [FileLock, how many holds of this process]
_guard = threading.Lock()


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


@contextlib.contextmanager
def hold_run(run_dir: str | Path) -> Iterator[None]:
    """Hold `run_dir` for this process inside the block; RunError at once when another process holds it."""
    run_dir = Path(run_dir)
    path = run_lock_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(path)
    with _guard:
        entry = _held.get(key)
        if entry is not None:
            entry[1] += 1
        else:
            lock = FileLock(path)
            if not lock.try_acquire():
                raise RunError(busy_message(run_dir, lock))
            try:
                lock.write(holder_record())
            except BaseException:
                lock.release()
                raise
            _held[key] = [lock, 1]
    try:
        yield
    finally:
        with _guard:
            entry = _held[key]
            entry[1] -= 1
            if entry[1] == 0:
                del _held[key]
                entry[0].release()
