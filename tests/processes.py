"""What the tests ask of the process table (:mod:`flows.common.processes`): which processes a command started,
found by an environment entry every child inherits (PREFECT_HOME=..., or a token of the test's own)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from flows.common.processes import command_line, live_processes, processes_with_environment, stop_left_behind


def is_gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def children(pid: int) -> list[int]:
    """Pids of the live processes whose parent is `pid`."""
    return [child for child, parent, _ in live_processes() if parent == pid]


def wait_until_none_left(entry: str, timeout: float) -> list[str]:
    """Wait (bounded) for every process holding `entry` to end; the command lines of those left."""
    deadline = time.monotonic() + timeout
    while processes_with_environment(entry) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [f"{pid}: {command_line(pid)}" for pid in processes_with_environment(entry)]


def kill_all(entry: str) -> None:
    """SIGKILL whatever a test's command left behind, so a failing test leaves nothing either."""
    stop_left_behind(entry, timeout=0)


def sigint_as_in_a_terminal() -> None:
    """preexec_fn: SIGINT back to its default action in the child, as a terminal's job has it (a
    command started in the background by a non-interactive shell, as CI's may be, inherits it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
