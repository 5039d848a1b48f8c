"""`dvc repro` with one Prefect server for the whole grid.

    python -m flows.pipeline.repro [DVC REPRO ARGUMENTS ...]      (what `make run` runs)

Each train stage is its own `fedcme train`-like process. With no Prefect API configured, each
would start and stop a temporary Prefect server of its own: seconds per experiment, and its
records gone with it. Here one temporary server (:mod:`flows.orchestration.prefect_server`) starts first, and
`dvc repro` and every stage it runs inherit its ``PREFECT_API_URL``; the server stops, and dies,
with this command. A Ctrl-C or SIGTERM stops dvc and the running stage first (a SIGTERM to their
process group: a background launch may ignore SIGINT, none ignores SIGTERM; the stage records its
flow run's end on the server), then the server. With an API URL already configured, this is
plain `dvc repro`.

Grid progress: before dvc starts, `dvc status` names the experiments (train and ablation stages)
that this repro will run (all of them with ``--force``); while dvc runs, :mod:`flows.pipeline.progress`
prints one plain line per finished experiment, or one bar in a terminal.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from flows.pipeline.progress import GridDisplay, GridProgress, pump
from flows.common.processes import group_members

STAGE_STOP_SECONDS = 60


def stage_experiments(params_path: str = "params.yaml") -> dict[str, str]:
    """{dvc stage name: experiment name} of every train and ablation stage of the grid file
    (``train@fedavg-fmnist-a1.0-clients0-0``: dvc.yaml's matrix names a (K, M) pair by its position)."""
    from fedcme_core.config.params import load_params

    from flows.tracking.names import experiment_name

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


def interrupt(signal_number, frame) -> None:
    """SIGTERM: stop the grid as a Ctrl-C does."""
    raise KeyboardInterrupt


def stop_within(process: subprocess.Popen, seconds: float) -> None:
    """Wait until `process` and every process of its group have ended; SIGKILL what is left after `seconds`."""
    deadline = time.monotonic() + seconds
    while (process.poll() is None or group_members(process.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def main(argv: Sequence[str] | None = None) -> int:
    from flows.common.command import quiet_environment, report_errors
    from flows.orchestration.prefect_server import run_against_prefect

    arguments = list(sys.argv[1:] if argv is None else argv)
    quiet_environment()

    def repro(ready) -> int:
        ready()
        experiments = pending_experiments(arguments)
        display = GridDisplay()
        if experiments:
            display.line(f"[grid] {len(experiments)} experiment{'s' if len(experiments) != 1 else ''} to train")
        progress = GridProgress(experiments, display=display)
        # In a terminal, dvc's output comes through pipes and is written above the progress bar.
        piped = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE,
                 "env": {**os.environ, "PYTHONUNBUFFERED": "1"}} if progress.bar else {}
        progress.start()
        # dvc and its stages in a process group of their own, so that stopping them reaches
        # exactly them (not a script that started this command).
        process = subprocess.Popen(["dvc", "repro", *arguments], process_group=0, **piped)
        pumps = [pump(process.stdout, display, sys.stdout), pump(process.stderr, display, sys.stderr)] if piped else []
        try:
            code = process.wait()
            for thread in pumps:
                thread.join(timeout=5)
            progress.stop()
            return code
        except KeyboardInterrupt:
            # The stage reports its flow run's end to the server, which stops only after it has exited.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            stop_within(process, STAGE_STOP_SECONDS)
            for thread in pumps:
                thread.join(timeout=5)
            progress.halt.set()
            display.close()
            raise

    signal.signal(signal.SIGTERM, interrupt)

    return report_errors(lambda: run_against_prefect(repro, "the whole grid (every stage)"))


if __name__ == "__main__":
    from flows.common.command import exit_promptly

    exit_promptly(main())
