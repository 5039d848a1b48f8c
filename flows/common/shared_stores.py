"""The stores that several commands share: Prefect's sqlite database and an MLflow sqlite store.

Their first use is serialised: whatever creates or migrates a database's schema (a temporary
Prefect server's start-up, MLflow's store creation) runs under a kernel lock on a file beside the
database (``prefect.db.lock``, ``mlflow.db.lock``), and the process that did it records there the
version and the schema revision it left. A later command that finds the record matching the
database goes straight on, unlocked: only the first use (or the first after an upgrade) waits.
Writes that meet a busy sqlite store are retried with a bound (:func:`retry_busy`).
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from fedcme_core.common.locks import FileLock

T = TypeVar("T")
BUSY_ATTEMPTS = 6  # with MLflow's own 20 s sqlite wait per attempt and the pauses: about 2.4 minutes in all
BUSY_MESSAGES = ("database is locked", "database table is locked", "database is busy")


def sqlite_file(url: str) -> Path | None:
    """The database file of a sqlite URL (`sqlite:///...`, `sqlite+aiosqlite:///...`); None for others."""
    scheme, separator, rest = url.partition(":///")
    if not separator or scheme.split("+")[0] != "sqlite" or not rest or rest.startswith(":memory:"):
        return None
    return Path(rest.split("?")[0])  # `sqlite:///x.db` is relative, `sqlite:////x.db` absolute


def schema_revision(database: Path) -> str | None:
    """The alembic revision a sqlite database is at (read only, never created); None: no schema yet."""
    if not database.is_file():
        return None
    try:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=10) as connection:
            row = connection.execute("select version_num from alembic_version").fetchone()
    except sqlite3.Error:
        return None
    return None if row is None else str(row[0])


class FirstUse:
    """The serialised set-up of one sqlite `database` by `product` at `version` (lock file beside it)."""

    def __init__(self, database: Path, product: str, version: str) -> None:
        self.database = database
        self.product = product
        self.version = version
        self.lock = FileLock(database.with_name(database.name + ".lock"))

    def is_done(self) -> bool:
        """True when this version set the database up and its schema is still at the revision it left."""
        record = self.lock.read() or {}
        revision = schema_revision(self.database)
        return record.get(self.product) == self.version and revision is not None and record.get("revision") == revision

    def try_begin(self) -> bool:
        """Take the set-up at once, or False while another process holds it."""
        return self.lock.try_acquire()

    def begin(self, timeout: float) -> bool:
        """Take the set-up, waiting at most `timeout` seconds for another process's to end."""
        return self.lock.acquire(timeout)

    def finish(self) -> None:
        """Record the set-up as done (this version, the schema's revision now) and let go."""
        if self.lock.held:
            revision = schema_revision(self.database)
            if revision is not None:
                self.lock.write({self.product: self.version, "revision": revision, "pid": os.getpid(),
                                 "at": datetime.now().astimezone().isoformat()})
        self.lock.release()

    def abandon(self) -> None:
        """Let go without recording anything (the set-up failed, or another process did it meanwhile)."""
        self.lock.release()


def is_busy(error: BaseException) -> bool:
    """True for a sqlite "database is locked" error, however deeply a library wrapped it."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if any(message in str(current).lower() for message in BUSY_MESSAGES):
            return True
        current = current.__cause__ or current.__context__
    return False


def retry_busy(action: Callable[[], T], attempts: int | None = None, pause: float = 0.5) -> T:
    """`action()`, again after a growing, jittered pause while it fails on a busy sqlite store;
    at most `attempts` tries (default BUSY_ATTEMPTS), then the last error is raised. Other errors are raised at once."""
    for _ in range((attempts or BUSY_ATTEMPTS) - 1):
        try:
            return action()
        except Exception as error:
            if not is_busy(error):
                raise
        time.sleep(pause * (1 + random.random()))
        pause = min(2 * pause, 8.0)
    return action()
