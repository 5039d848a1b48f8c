"""A training run's MLflow writes, made by one background thread so that tracking never stalls training.

The flow hands each call (a round's metrics, its tags, the summary, the model) to the run's
:class:`TrackingWriter` and goes on at once; the writer makes them in order, from a bounded queue
(QUEUE_SIZE calls). A busy store (another process holding the sqlite write lock) is waited out by
:class:`BusyWait`, while the rounds go on: one warning line when it first refuses a write, one
when it answers again, and the held-back calls are made then. A store still busy BUSY_WAIT seconds
after it first refused (measured; MLflow's own last try may add its 20 s sqlite wait), or a queue
that fills meanwhile, turns tracking off for the run with one warning line that prints the complete
``fedcme sync`` command (``flows.tracking.store.sync_command``), which logs the rest later. MLflow's own
error records and tracebacks go to ``<run>/tracking.log``, not the console
(:func:`mlflow_log_to`). Only the run's end waits for the writer: its summary, model and final
status are logged after the queue has drained.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from flows.common.shared_stores import is_busy

T = TypeVar("T")
BUSY_WAIT = 120.0  # seconds of a busy store the writer waits out before tracking stops for the run
QUEUE_SIZE = 1000  # calls waiting for the store (a round is 1-3): a full queue stops tracking, never training
LOG_FILE = "tracking.log"  # MLflow's own error records, tracebacks included, under the run directory


def warn(message: str) -> None:
    print(f"fedcme: warning: {message}", file=sys.stderr, flush=True)


class BusyWait:
    """How a run's writer meets a busy sqlite store: each call is tried again after a growing pause
    until it succeeds, or until `wait` seconds have passed since the store first refused (then its
    last error is raised); one warning when the store first refuses, one when it answers again.
    `clock` gives ``monotonic()`` and ``sleep()`` (the `time` module; a test passes its own, which
    no other thread of the process then shares)."""

    def __init__(self, uri: str, wait: float | None = None, clock: Any = time) -> None:
        self.uri = uri
        self.wait = BUSY_WAIT if wait is None else wait
        self.clock = clock
        self.blocked_since: float | None = None  # when the first refused call began

    def __call__(self, action: Callable[[], T]) -> T:
        pause = 0.5
        while True:
            started = self.clock.monotonic()
            try:
                result = action()
            except Exception as error:
                if not is_busy(error):
                    raise
                if self.blocked_since is None:
                    self.blocked_since = started
                    warn(f"MLflow store {self.uri} is busy (database is locked: another process is writing to it); "
                         f"training goes on and its tracking waits for the store, up to {self.wait:.0f} s")
                if self.clock.monotonic() - self.blocked_since >= self.wait:
                    self.blocked_since = None
                    raise
                waited = self.clock.monotonic() - self.blocked_since  # never sleeps past the wait
                self.clock.sleep(min(pause * (1 + random.random()), self.wait - waited))
                pause = min(2 * pause, 8.0)
                continue
            if self.blocked_since is not None:
                warn(f"MLflow store {self.uri} answers again after {self.clock.monotonic() - self.blocked_since:.0f} s; "
                     "the tracking held back is logged now")
                self.blocked_since = None
            return result


class TrackingWriter:
    """The one background thread of a run's MLflow calls (:class:`flows.tracking.run.RunTracker`'s methods).

    :meth:`submit` queues a call and returns at once; :meth:`call` queues one and waits for its
    result (the run's end); :meth:`close` waits for the queue to drain and ends the thread. The
    tracker's calls meet a busy store through :class:`BusyWait`; every other failure turns
    tracking off for the run (the tracker's one warning line), and the queued calls then return None."""

    def __init__(self, tracker, wait: float | None = None, size: int | None = None) -> None:
        self.tracker = tracker
        tracker.busy = BusyWait(tracker.uri, wait)
        self._queue: queue.Queue = queue.Queue(maxsize=size or QUEUE_SIZE)
        self._thread = threading.Thread(target=self._work, name="fedcme-mlflow-writer", daemon=True)
        self._thread.start()

    def submit(self, method: str, *args: Any) -> None:
        """Queue ``tracker.method(*args)``; never waits: a full queue turns tracking off for the run."""
        self._put((method, args, None))

    def call(self, method: str, *args: Any) -> Any:
        """``tracker.method(*args)`` made after every call queued before it; returns its result."""
        future: Future = Future()
        if not self._put((method, args, future)):
            return None
        return future.result()

    def close(self, timeout: float | None = None) -> None:
        """Let the queued calls finish (at most `timeout` seconds), then end the thread."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)

    def _put(self, item) -> bool:
        try:
            self._queue.put_nowait(item)
            return True
        except queue.Full:
            self.tracker.fail(f"{self._queue.maxsize} calls waiting for a store that does not take them")
            return False

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            method, args, future = item
            try:
                result = getattr(self.tracker, method)(*args)
            except Exception as error:  # noqa: BLE001 - the tracker's calls guard their own; any other is tracking's end
                self.tracker.fail(f"{method}: {type(error).__name__}: {error}".splitlines()[0])
                result = None
            if future is not None:
                future.set_result(result)


class ConsoleWithoutTracebacks(logging.Filter):
    """MLflow's console handler without its error records, tracebacks and multi-line messages (a
    failed query's SQL): they are in the run's log file. Its one-line warnings still show."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.exc_info is None and record.levelno < logging.ERROR and "\n" not in record.getMessage()


@contextlib.contextmanager
def mlflow_log_to(run_dir: Path) -> Iterator[Path]:
    """Inside the block, MLflow's warnings and errors (tracebacks included) go to ``<run_dir>/tracking.log``
    and its console handler shows none of its errors or tracebacks; yields the log file's path."""
    path = Path(run_dir) / LOG_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    logger = logging.getLogger("mlflow")
    to_file = logging.FileHandler(path, encoding="utf-8", delay=True)
    to_file.setLevel(logging.WARNING)
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    console = ConsoleWithoutTracebacks()
    consoles = list(logger.handlers)
    for handler in consoles:
        handler.addFilter(console)
    logger.addHandler(to_file)
    try:
        yield path
    finally:
        logger.removeHandler(to_file)
        to_file.close()
        for handler in consoles:
            handler.removeFilter(console)
