"""Kernel file locks (``fcntl.flock``): a lock is held by an open file, so it ends with its holder.

A process killed by SIGKILL leaves no lock to clean by hand: the kernel drops the lock with the
process's files. The lock file itself stays (a file nobody locks means nothing), so every process
locks the same file; only its holder may remove it (:meth:`FileLock.remove`, a lock file made for a
command that then wrote nothing), and a process that opened it meanwhile notices once it gets the
lock and locks the path's new file. Its holder writes a small JSON record into it
(:meth:`FileLock.write`): who holds a run directory, or that a shared database is set up. The
descriptor is not inherited by the programs a holder starts (close-on-exec), so a server or
worker process it started does not keep the lock after it dies.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

RECORD_BYTES = 1024  # a record is written padded to this size in one write, so a reader never sees it empty


class FileLock:
    """An exclusive lock on the file `path` (created, with its folder, when missing)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if no other open file holds it; False at once if one does."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            except BaseException:
                os.close(fd)
                raise
            if self._still_named(fd):
                self._fd = fd
                return True
            os.close(fd)  # its holder removed the file before letting go: lock the file the path names now

    def _still_named(self, fd: int) -> bool:
        """Whether the locked descriptor `fd` is still the file at `path` (a holder may remove a lock
        file it created, :meth:`remove`, and a process that opened it just before holds nothing)."""
        try:
            return os.path.samestat(os.fstat(fd), os.stat(self.path))
        except FileNotFoundError:
            return False

    def remove(self) -> None:
        """Delete the lock file, then let go (only while holding it): a process that opened the old
        file meanwhile finds it unnamed once it gets the lock, and locks the path's new file instead."""
        if self._fd is None:
            raise RuntimeError(f"{self.path}: not held by this process")
        self.path.unlink(missing_ok=True)
        self.release()

    def acquire(self, timeout: float, poll: float = 0.05) -> bool:
        """Take the lock, waiting at most `timeout` seconds for its holder to let go; False if it did not."""
        deadline = time.monotonic() + timeout
        while not self.try_acquire():
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll)
        return True

    def write(self, record: dict[str, Any]) -> None:
        """Replace the lock file's record with `record` (JSON); only while holding the lock."""
        if self._fd is None:
            raise RuntimeError(f"{self.path}: not held by this process")
        data = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8").ljust(RECORD_BYTES)
        os.pwrite(self._fd, data, 0)
        os.ftruncate(self._fd, len(data))

    def read(self) -> dict[str, Any] | None:
        """The record in the lock file (held or not); None when it has none or cannot be read."""
        try:
            record = json.loads(self.path.read_text(encoding="utf-8") or "null")
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
