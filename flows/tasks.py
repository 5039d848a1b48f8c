"""Prefect tasks: thin wrappers over the round steps of ``fedcme_core.federation``.

Every task takes the (frozen, picklable) config, the run directory and small plain data,
and returns small plain data; models travel as checkpoint files in the run directory, so a
task can run in a thread, in a Dask worker process or on another machine sharing the run
directory. Inputs are never hashed (``cache_policy=NONE``: they are configs and paths whose
files change underneath) and results are not persisted (the run directory is the record).
One task per client per phase: Prefect's per-task cost is paid 2M times a round, not per batch.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from prefect import task
from prefect.cache_policies import NONE

from fedcme_core import federation
from fedcme_core.config import ExperimentConfig, RunnerConfig
from fedcme_core.faults import StepFailure

TASK_OPTIONS = {"cache_policy": NONE, "persist_result": False}


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def worker_layout(runner: RunnerConfig) -> tuple[int, int]:
    """(parallel client trainings, torch threads each), so that workers x threads <= cores by default."""
    cores = available_cores()
    workers = 1 if runner.kind == "sequential" else (runner.workers or cores)
    threads = runner.threads_per_worker or max(1, cores // workers)
    return workers, threads


@task(name="prepare", **TASK_OPTIONS)
def prepare_task(config: ExperimentConfig, run_dir: str, partition_file: str | None) -> int:
    """Create or reopen the run directory; returns the number of rounds already completed."""
    return federation.prepare_run(config, run_dir, partition_file)


@task(name="select", **TASK_OPTIONS)
def select_task(config: ExperimentConfig, round_index: int) -> list[int]:
    return federation.select_step(config, round_index)


@task(name="match", **TASK_OPTIONS)
def match_task(config: ExperimentConfig, run_dir: str, round_index: int, selected: list[int]) -> dict[str, Any]:
    return federation.match_step(config, run_dir, round_index, selected)


@task(name="local-train", **TASK_OPTIONS)
def train_phase_task(
    config: ExperimentConfig,
    run_dir: str,
    round_index: int,
    client_id: int,
    phase_index: int,
    start_checkpoint: str | None,
    torch_threads: int,
) -> dict[str, Any]:
    torch.set_num_threads(torch_threads)
    return federation.train_phase_step(config, run_dir, round_index, client_id, phase_index, start_checkpoint)


@task(name="exchange", **TASK_OPTIONS)
def exchange_task(config: ExperimentConfig, run_dir: str, round_index: int, donors: dict[int, int]) -> dict[int, str]:
    return federation.exchange_step(config, run_dir, round_index, donors)


@task(name="aggregate", **TASK_OPTIONS)
def aggregate_task(
    config: ExperimentConfig, run_dir: str, round_index: int, clients: list[int], lost: dict[int, str]
) -> dict[str, Any]:
    return federation.aggregate_step(config, run_dir, round_index, clients, lost)


@task(name="evaluate", **TASK_OPTIONS)
def evaluate_task(config: ExperimentConfig, run_dir: str, round_index: int) -> dict[str, Any]:
    return federation.evaluate_step(config, run_dir, round_index)


@task(name="commit", **TASK_OPTIONS)
def commit_task(config: ExperimentConfig, run_dir: str, round_index: int, record: dict[str, Any]) -> dict[str, Any]:
    return federation.commit_round(config, run_dir, round_index, record)


STEP_TASKS = {
    "prepare": prepare_task,
    "select": select_task,
    "match": match_task,
    "exchange": exchange_task,
    "aggregate": aggregate_task,
    "evaluate": evaluate_task,
    "commit": commit_task,
}


class PrefectExecutor:
    """Runs the core round's steps as Prefect tasks; the clients of a phase go to the task runner."""

    def __init__(self, torch_threads: int) -> None:
        self.torch_threads = torch_threads
        self.task_runs = 0  # how many task runs this flow run created (to check they were recorded)

    def call(self, step: str, function, *args: Any) -> Any:
        self.task_runs += 1
        return STEP_TASKS[step](*args)

    def map(self, step: str, function, arguments, retries: int = 0) -> list[Any | StepFailure]:
        """One local-train task per client, retried by Prefect; a task that still fails gives a StepFailure."""
        if step != "train_phase":
            raise ValueError(f"no parallel task for step {step!r}")
        self.task_runs += len(arguments)
        client_task = train_phase_task.with_options(retries=retries)
        futures = [client_task.submit(*args, self.torch_threads) for args in arguments]
        return [_result_or_failure(future) for future in futures]


def _result_or_failure(future) -> Any | StepFailure:
    try:
        return future.result()
    except Exception as error:  # the task failed after its retries: the round decides what follows
        return StepFailure.from_exception(error)
