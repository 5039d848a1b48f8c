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

Grid progress: before dvc starts, `dvc status` names the experiments (train and ablation stages)
that this repro will run (all of them with ``--force``); while dvc runs, a thread watches
``metrics/<exp>.json`` and prints one plain line per finished experiment (:func:`progress_line`:
k of N, its final accuracy, the time since the start, and an ETA from the measured time per
experiment), the same in a terminal and in CI logs. The stages' own lines are untouched.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path


STAGE_STOP_SECONDS = 60
POLL_SECONDS = 2.0


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


def stage_experiments(params_path: str = "params.yaml") -> dict[str, str]:
    """{dvc stage name: experiment name} of every train and ablation stage of the grid file
    (``train@fedavg-fmnist-a1.0-clients0-0``: dvc.yaml's matrix names a (K, M) pair by its position)."""
    from fedcme_core.params import load_params

    from .stages import experiment_name

    params = load_params(params_path)
    stages = {}
    for stage, grid in (("train", params.grid), ("ablation", params.ablation)):
        for method, dataset, partition, clients, per_round, seed in grid.cells() if grid is not None else ():
            index = [tuple(pair) for pair in grid.clients].index((clients, per_round))
            name = f"{stage}@{method}-{dataset}-{partition}-clients{index}-{seed}"
            stages[name] = experiment_name(method, dataset, partition, clients, per_round, seed)
    return stages


def pending_experiments(arguments: Sequence[str]) -> list[str]:
    """The experiments `dvc repro ARGUMENTS` will train: those whose stage `dvc status` reports changed
    (every one in scope with --force). Empty when dvc status or the params file cannot be read."""
    targets = [argument for argument in arguments if not argument.startswith("-")]
    try:
        stages = stage_experiments()
        shown = subprocess.run(["dvc", "status", "--json", *(["--with-deps", *targets] if targets else [])],
                               capture_output=True, text=True, check=True).stdout
        changed = set(json.loads(shown or "{}"))
    except (OSError, ValueError, subprocess.CalledProcessError):
        return []
    if "-f" in arguments or "--force" in arguments:
        changed = set(stages) if not targets else changed | set(targets)
    return [experiment for stage, experiment in stages.items() if stage in changed]


class GridProgress(threading.Thread):
    """Watches ``metrics/<exp>.json`` of `experiments` and calls `write` with a :func:`progress_line`
    for each that is (re)written after the start, in the order they finish."""

    def __init__(self, experiments: Sequence[str], metrics: Path = Path("metrics"),
                 write: Callable[[str], None] = lambda line: print(line, flush=True)):
        super().__init__(daemon=True)
        self.pending = list(experiments)
        self.total = len(self.pending)
        self.metrics, self.write = Path(metrics), write
        self.started_wall, self.started = time.time(), time.monotonic()
        self.finished: list[float] = []  # monotonic times
        self.halt = threading.Event()

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
            runs = [end - start for start, end in zip([self.started, *self.finished], [*self.finished, now])]
            self.finished.append(now)
            self.pending.remove(experiment)
            self.write(progress_line(len(self.finished), self.total, experiment,
                                     accuracy if isinstance(accuracy, (int, float)) else None,
                                     now - self.started, runs))

    def run(self) -> None:
        while not self.halt.wait(POLL_SECONDS):
            self.poll()

    def stop(self) -> None:
        """Stop watching, after a last look (an experiment that finished just before dvc exited)."""
        self.halt.set()
        self.join()
        self.poll()


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
        experiments = pending_experiments(arguments)
        if experiments:
            print(f"[grid] {len(experiments)} experiment{'s' if len(experiments) != 1 else ''} to train", flush=True)
        progress = GridProgress(experiments)
        progress.start()
        # dvc and its stages in a process group of their own, so that stopping them reaches
        # exactly them (not a script that started this command).
        process = subprocess.Popen(["dvc", "repro", *arguments], process_group=0)
        try:
            code = process.wait()
            progress.stop()
            return code
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
