"""A grid's progress: one plain line per finished experiment, or one bar in a terminal.

While dvc runs, :class:`GridProgress` watches ``metrics/<exp>.json`` of the experiments this repro
will run and, for each that finishes, prints :func:`progress_line` (k of N, its final accuracy, the
time since the start, and an ETA from the measured time per experiment) where stdout is not a
terminal (CI logs, a pipe). In a terminal the same figures are one bar at the bottom, redrawn in
place (:func:`progress_bar`, :class:`GridDisplay`); dvc's output is then read through pipes
(:func:`pump`) and written above the bar, line by line, so each experiment's round lines stay as
they are.
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

POLL_SECONDS = 2.0
BAR_CELLS = 20
CLEAR_LINE = "\r\x1b[2K"  # to the line's start, and erase it: the bar is redrawn in place


def duration(seconds: float) -> str:
    """45s, 4m12s, 1h03m."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def progress_line(done: int, total: int, experiment: str, final_accuracy: float | None, elapsed: float,
                  run_seconds: Sequence[float]) -> str:
    """One line per finished experiment: "[grid] 3 of 8 done: <exp>: final accuracy 71.23%, elapsed 4m12s,
    ETA 7m00s"; the ETA is the mean of `run_seconds` (the measured time per experiment so far) times the
    experiments left, "grid done" after the last."""
    accuracy = "–" if final_accuracy is None else f"{100 * final_accuracy:.2f}%"
    if done >= total:
        eta = "grid done"
    elif run_seconds:
        eta = f"ETA {duration(sum(run_seconds) / len(run_seconds) * (total - done))}"
    else:
        eta = "ETA unknown"
    return f"[grid] {done} of {total} done: {experiment}: final accuracy {accuracy}, elapsed {duration(elapsed)}, {eta}"


def progress_bar(done: int, total: int, last: str | None, final_accuracy: float | None, elapsed: float,
                 run_seconds: Sequence[float], since_last: float = 0.0, columns: int = 80) -> str:
    """The progress in a terminal, one line redrawn in place: "[grid] ███████░░░ 3/8 · elapsed 4m12s · ETA
    7m00s · last: <exp> 71.23%". The ETA is :func:`progress_line`'s less the `since_last` seconds since the
    last experiment finished; the line is cut to `columns` - 1 characters (a line that wraps cannot be redrawn)."""
    filled = min(BAR_CELLS, BAR_CELLS * done // total) if total else BAR_CELLS
    if done >= total:
        eta = "grid done"
    elif run_seconds:
        eta = f"ETA {duration(max(0.0, sum(run_seconds) / len(run_seconds) * (total - done) - since_last))}"
    else:
        eta = "ETA unknown"
    text = f"[grid] {'█' * filled}{'░' * (BAR_CELLS - filled)} {done}/{total} · elapsed {duration(elapsed)} · {eta}"
    if last is not None:
        text += f" · last: {last} {'–' if final_accuracy is None else f'{100 * final_accuracy:.2f}%'}"
    width = max(columns - 1, 1)
    return text if len(text) <= width else text[: width - 1] + "…"


class GridDisplay:
    """Where the grid's progress goes: `stream` (stdout). Not a terminal: plain lines. A terminal (`tty`):
    one bar at the bottom (:meth:`show`), with every other line written above it (:meth:`line`: the bar
    erased, the line written, the bar drawn again), and left in place by :meth:`close`."""

    def __init__(self, stream: IO[str] | None = None, tty: bool | None = None,
                 columns: Callable[[], int] | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.tty = bool(self.stream.isatty()) if tty is None else tty
        self.columns = columns or (lambda: shutil.get_terminal_size().columns)
        self.bar = ""  # the bar on the screen, "" for none
        self.lock = threading.Lock()

    def line(self, text: str, stream: IO[str] | None = None) -> None:
        """`text` as a line of its own on `stream` (default ours), above the bar where there is one."""
        target = stream if stream is not None else self.stream
        with self.lock:
            if self.bar:
                self.stream.write(CLEAR_LINE)
                self.stream.flush()
            target.write(text if text.endswith("\n") else text + "\n")
            target.flush()
            if self.bar:
                self.stream.write(self.bar)
                self.stream.flush()

    def show(self, bar: str) -> None:
        """Draw `bar` in place of the last one (no newline: the next draw or line replaces it)."""
        with self.lock:
            self.bar = bar
            self.stream.write(CLEAR_LINE + bar)
            self.stream.flush()

    def close(self) -> None:
        """Leave the last bar on the screen, on a line of its own."""
        with self.lock:
            if self.bar:
                self.stream.write("\n")
                self.stream.flush()
                self.bar = ""


class GridProgress(threading.Thread):
    """Watches ``metrics/<exp>.json`` of `experiments`; for each that is (re)written after the start, in
    the order they finish, calls `write` with a :func:`progress_line` (default: `display`'s plain
    lines), or, where `display` is a terminal, redraws its bar (:func:`progress_bar`, also every
    POLL_SECONDS while it waits, so that elapsed and ETA move on)."""

    def __init__(self, experiments: Sequence[str], metrics: Path = Path("metrics"),
                 write: Callable[[str], None] | None = None, display: GridDisplay | None = None):
        super().__init__(daemon=True)
        self.pending = list(experiments)
        self.total = len(self.pending)
        self.metrics = Path(metrics)
        self.display = display if display is not None else GridDisplay(tty=False if write else None)
        self.write = write or self.display.line
        self.bar = self.display.tty and write is None and self.total > 0
        self.started_wall, self.started = time.time(), time.monotonic()
        self.finished: list[float] = []  # monotonic times
        self.last: tuple[str, float | None] | None = None  # the experiment that finished last, its accuracy
        self.halt = threading.Event()

    def run_seconds(self) -> list[float]:
        """The measured time of each finished experiment (from the start, or the one before it)."""
        return [end - start for start, end in zip([self.started, *self.finished], self.finished)]

    def draw(self) -> None:
        """Redraw the bar (a terminal only)."""
        if not self.bar:
            return
        now = time.monotonic()
        last, accuracy = self.last or (None, None)
        self.display.show(progress_bar(len(self.finished), self.total, last, accuracy, now - self.started,
                                       self.run_seconds(), now - (self.finished[-1] if self.finished else now),
                                       self.display.columns()))

    def poll(self) -> None:
        for experiment in list(self.pending):
            path = self.metrics / f"{experiment}.json"
            try:
                if path.stat().st_mtime < self.started_wall:
                    continue
                accuracy = json.loads(path.read_text(encoding="utf-8")).get("final_accuracy")
            except (OSError, ValueError):
                continue
            now = time.monotonic()
            self.finished.append(now)
            self.pending.remove(experiment)
            accuracy = accuracy if isinstance(accuracy, (int, float)) else None
            self.last = (experiment, accuracy)
            if self.bar:
                self.draw()
            else:
                self.write(progress_line(len(self.finished), self.total, experiment, accuracy, now - self.started,
                                         self.run_seconds()))

    def run(self) -> None:
        self.draw()
        while not self.halt.wait(POLL_SECONDS):
            self.poll()
            self.draw()

    def stop(self) -> None:
        """Stop watching, after a last look (an experiment that finished just before dvc exited); a bar is
        left on the screen as it was last drawn."""
        self.halt.set()
        if self.is_alive():
            self.join()
        self.poll()
        self.draw()
        self.display.close()


def pump(source: IO[bytes], display: GridDisplay, target: IO[str]) -> threading.Thread:
    """Copy `source` (a pipe of dvc's output) to `target` line by line, above `display`'s bar (a thread)."""

    def copy() -> None:
        with source:
            for raw in iter(source.readline, b""):
                display.line(raw.decode("utf-8", errors="replace"), target)

    thread = threading.Thread(target=copy, name="dvc-output", daemon=True)
    thread.start()
    return thread
