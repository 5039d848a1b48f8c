"""The process table, read from Linux /proc: the live processes, and those a command started, found
by an environment entry every child inherits (``PREFECT_HOME=...``, or a token of the caller's own).
Used by ``flows.pipeline.repro`` to wait for a stage's process group, and by the tests and benches
that check no process is left behind (``bench/memory.py``: by its child's process group)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def live_processes() -> list[tuple[int, int, int]]:
    """(pid, parent pid, process group) of every live (not zombie) process."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "(comm)": state, ppid, pgrp, ...
        except OSError:
            continue
        if fields[0] != "Z":
            found.append((int(stat.parent.name), int(fields[1]), int(fields[2])))
    return found


def group_members(group: int) -> list[int]:
    """The live processes of process group `group` (a grid's dvc and its stages, a bench's child and
    what it started; one whose parent has already exited is still there, though no longer its child)."""
    return [pid for pid, _, pgrp in live_processes() if pgrp == group]


def command_line(pid: int) -> str:
    """The command line of process `pid` ("" when it has ended or cannot be read)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def processes_with_environment(entry: str) -> list[int]:
    """Pids of the live processes whose environment holds `entry` (``NAME=value``)."""
    found = []
    for pid, _, _ in live_processes():
        try:
            if entry.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.append(pid)
        except OSError:
            continue
    return found


def stop_left_behind(entry: str, timeout: float) -> list[int]:
    """Wait up to `timeout` seconds for the processes holding `entry` to end; SIGKILL those still
    running then, and return their pids (empty when none was left behind)."""
    deadline = time.monotonic() + timeout
    while processes_with_environment(entry) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = processes_with_environment(entry)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left
