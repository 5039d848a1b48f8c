"""`dvc repro` with one Prefect server for the whole grid.

    python -m flows.repro [DVC REPRO ARGUMENTS ...]      (what `make run` runs)

Each train stage is its own `fedcme train`-like process. With no Prefect API configured, each
would start and stop a temporary Prefect server of its own: seconds per experiment, and its
records gone with it. Here one temporary server (:mod:`flows.prefect_server`) starts first, and
`dvc repro` and every stage it runs inherit its ``PREFECT_API_URL``; the server stops, and dies,
with this command. A Ctrl-C or SIGTERM stops dvc and the running stage first (a SIGTERM to their
process group: a background launch may ignore SIGINT, none ignores SIGTERM; the stage records its
flow run's end on the server), then the server. With an API URL already configured, this is
plain `dvc repro`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path


STAGE_STOP_SECONDS = 60


def interrupt(signal_number, frame) -> None:
    """SIGTERM: stop the grid as a Ctrl-C does."""
    raise KeyboardInterrupt


def live_processes() -> list[tuple[int, int, int]]:
    """(pid, parent pid, process group) of every live (not zombie) process. Linux /proc."""
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
    """The live processes of process group `group` (dvc and its stages; a stage whose dvc has
    already exited is still there, though no longer its child)."""
    return [pid for pid, _, pgrp in live_processes() if pgrp == group]


def stop_within(process: subprocess.Popen, seconds: float) -> None:
    """Wait until `process` and every process of its group have ended; SIGKILL what is left after `seconds`."""
    deadline = time.monotonic() + seconds
    while (process.poll() is None or group_members(process.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def main(argv: Sequence[str] | None = None) -> int:
    from .command import quiet_environment, report_errors
    from .prefect_server import run_against_prefect

    arguments = list(sys.argv[1:] if argv is None else argv)
    quiet_environment()

    def repro(ready) -> int:
        ready()
        # dvc and its stages in a process group of their own, so that stopping them reaches
        # exactly them (not a script that started this command).
        process = subprocess.Popen(["dvc", "repro", *arguments], process_group=0)
        try:
            return process.wait()
        except KeyboardInterrupt:
            # The stage reports its flow run's end to the server, which stops only after it has exited.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            stop_within(process, STAGE_STOP_SECONDS)
            raise

    signal.signal(signal.SIGTERM, interrupt)

    return report_errors(lambda: run_against_prefect(repro, "the whole grid (every stage)"))


if __name__ == "__main__":
    from .command import exit_promptly

    exit_promptly(main())
