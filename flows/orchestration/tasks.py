"""Prefect tasks: thin wrappers over the round steps of ``fedcme_core.rounds``.

Every task takes the (frozen, picklable) config, the run directory and small plain data,
and returns small plain data; models travel as checkpoint files in the run directory, so a
task can run in a thread, in a Dask worker process or on another machine sharing the run
directory. Inputs are never hashed (``cache_policy=NONE``: they are configs and paths whose
files change underneath) and results are not persisted (the run directory is the record).
The graph's edges are the round's order, given as ``wait_for``: each step waits for the one
before it, the exchange for every first-phase client (the swap barrier) and every second-phase
client for the exchange. Every argument and every result goes in a :class:`Sealed`, which
Prefect neither walks nor draws. Its own lineage links an input to any earlier result holding
the same object, found by ``id()``: plain data shares interned objects across rounds (the key
"pairs" of every record), and a plain dict or list result is kept by ``id()`` alone, so a freed
result's recycled address linked a later task to it (round 2's second phase was drawn from
``evaluate r1``). A sealed result is weak-referenceable, so Prefect checks the object is still the
same one (PrefectHQ/prefect#20558). (Prefect's own ``quote`` does this for arguments on threads,
but reaches a Dask worker as a plain tuple.)
Task runs are named by step, round (1-based), client and phase (`local-train r3 c17 p1`).
Local training is one task per client per phase by default (``runner.client_tasks: client``: 2M
tasks a round, each client its own line in the UI), or one task per worker per phase (``worker``:
the phase's clients packed by size into near-equal groups, 2 x workers tasks a round).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch
from prefect import task
from prefect.cache_policies import NONE
from prefect.task_runners import ThreadPoolTaskRunner

from fedcme_core import rounds
from fedcme_core.common.errors import machine_error
from fedcme_core.config.schema import ExperimentConfig, RunnerConfig
from fedcme_core.server.faults import StepFailure

TASK_OPTIONS = {"cache_policy": NONE, "persist_result": False}


def run_name(step: str) -> Callable[[], str]:
    """The task-run name: the step, its round as the console counts it (1-based), and for local
    training the client and phase, e.g. ``local-train r3 c17 p1``, so a slow client is found in the UI."""

    def name() -> str:
        from prefect.runtime import task_run

        parameters = {key: unsealed(value) for key, value in task_run.parameters.items()}
        if "steps" in parameters:  # one task per worker: (run_dir, round, client, phase, start) each
            steps = parameters["steps"]
            clients = ",".join(str(client) for _, _, client, _, _ in steps)
            return f"{step} r{steps[0][1] + 1} p{steps[0][3] + 1} c{clients}" if steps else step
        parts = [step]
        if "round_index" in parameters:
            parts.append(f"r{parameters['round_index'] + 1}")
        if "client_id" in parameters:
            parts += [f"c{parameters['client_id']}", f"p{parameters['phase_index'] + 1}"]
        return " ".join(parts)

    return name


class Sealed:
    """A task argument or result that Prefect passes on without looking inside; the receiver
    unwraps it. Weak-referenceable, so Prefect's result registry never matches a recycled id."""

    __slots__ = ("value", "__weakref__")

    def __init__(self, value: Any) -> None:
        self.value = value


def unsealed(value: Any) -> Any:
    return value.value if isinstance(value, Sealed) else value


def step_task(step: str):
    """@task with the project's options and the step's run name, over a function that unwraps its
    sealed arguments and seals its result."""

    def decorate(function: Callable[..., Any]):
        @functools.wraps(function)
        def step_function(*args: Any, **kwargs: Any) -> Any:
            return Sealed(function(*map(unsealed, args), **{key: unsealed(value) for key, value in kwargs.items()}))

        return task(name=step, task_run_name=run_name(step), **TASK_OPTIONS)(step_function)

    return decorate


def worker_layout(runner: RunnerConfig) -> tuple[int, int]:
    """(parallel client trainings, torch threads each), so that workers x threads <= cores by default."""
    cores = rounds.available_cores()
    workers = 1 if runner.kind == "sequential" else (runner.workers or cores)
    threads = runner.threads_per_worker or max(1, cores // workers)
    return workers, threads


@step_task("prepare")
def prepare_task(config: ExperimentConfig, run_dir: str, partition_file: str | None) -> int:
    """Create or reopen the run directory; returns the number of rounds already completed."""
    return rounds.prepare_run(config, run_dir, partition_file)


@step_task("select")
def select_task(config: ExperimentConfig, round_index: int) -> list[int]:
    return rounds.select_step(config, round_index)


@step_task("match")
def match_task(config: ExperimentConfig, run_dir: str, round_index: int, selected: list[int]) -> dict[str, Any]:
    return rounds.match_step(config, run_dir, round_index, selected)


@step_task("local-train")
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
    return rounds.train_phase_step(config, run_dir, round_index, client_id, phase_index, start_checkpoint)


@step_task("local-train-group")
def train_phase_group_task(
    config: ExperimentConfig, steps: list[tuple], torch_threads: int, retries: int
) -> list[dict[str, Any] | StepFailure]:
    """Several clients' phases, one after another in one task; each client is retried on its
    own and one that still fails gives a StepFailure (the others are unaffected)."""
    torch.set_num_threads(torch_threads)
    return [rounds.with_retries(rounds.train_phase_step, (config, *step), retries) for step in steps]


@step_task("exchange")
def exchange_task(config: ExperimentConfig, run_dir: str, round_index: int, donors: dict[int, int]) -> dict[int, str]:
    return rounds.exchange_step(config, run_dir, round_index, donors)


@step_task("aggregate")
def aggregate_task(
    config: ExperimentConfig, run_dir: str, round_index: int, clients: list[int], lost: dict[int, str],
    matching: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return rounds.aggregate_step(config, run_dir, round_index, clients, lost, matching)


@step_task("evaluate")
def evaluate_task(config: ExperimentConfig, run_dir: str, round_index: int) -> dict[str, Any]:
    return rounds.evaluate_step(config, run_dir, round_index)


@step_task("commit")
def commit_task(config: ExperimentConfig, run_dir: str, round_index: int, record: dict[str, Any]) -> dict[str, Any]:
    return rounds.commit_round(config, run_dir, round_index, record)


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
    """Runs the core round's steps as Prefect tasks; the clients of a phase go to the task runner,
    one task per client or (``runner.client_tasks: worker``) one task per worker."""

    def __init__(self, torch_threads: int, workers: int = 1, client_tasks: str = "client") -> None:
        self.torch_threads = torch_threads
        self.workers = workers
        self.client_tasks = client_tasks
        self.task_runs = 0  # how many task runs this flow run created (to check they were recorded)
        self.upstream: list[Any] = []  # the completed task runs of the step before (futures or states)

    def call(self, step: str, function, *args: Any) -> Any:
        self.task_runs += 1
        state = STEP_TASKS[step](*sealed(args), wait_for=self.upstream, return_state=True)
        self.upstream = [state]
        return unsealed(state.result())

    def map(self, step: str, function, arguments, retries: int = 0, costs=None) -> list[Any | StepFailure]:
        """The clients' phases as tasks; a client that still fails after its retries gives a StepFailure."""
        if step != "train_phase":
            raise ValueError(f"no parallel task for step {step!r}")
        if self.client_tasks == "worker":
            return self._map_grouped(arguments, retries, costs)
        self.task_runs += len(arguments)
        client_task = train_phase_task.with_options(retries=retries, retry_condition_fn=retry_unless_machine_fault)
        futures = [client_task.submit(*sealed((*args, self.torch_threads)), wait_for=self.upstream)
                   for args in arguments]
        return self.finished(futures)

    def _map_grouped(self, arguments, retries: int, costs) -> list[Any | StepFailure]:
        """One task per worker: the clients packed by cost (largest first) into near-equal groups."""
        groups = rounds.balanced_groups(costs if costs is not None else [1.0] * len(arguments), self.workers)
        self.task_runs += len(groups)
        config = arguments[0][0]  # the same for every client of the phase: sent once per task
        steps = [args[1:] for args in arguments]
        futures = [
            train_phase_group_task.submit(
                *sealed((config, [steps[position] for position in group], self.torch_threads, retries)),
                wait_for=self.upstream,
            )
            for group in groups
        ]
        results: list[Any | StepFailure] = [None] * len(arguments)
        for group, outcome in zip(groups, self.finished(futures), strict=True):
            for index, position in enumerate(group):
                results[position] = outcome if isinstance(outcome, StepFailure) else outcome[index]
        return results

    def finished(self, futures: list) -> list[Any | StepFailure]:
        """Each future's result or StepFailure; the completed ones are what the next step waits for
        (one that failed stays out: the round goes on without that client)."""
        outcomes = [_result_or_failure(future) for future in futures]
        self.upstream = [future for future, outcome in zip(futures, outcomes, strict=True)
                         if not isinstance(outcome, StepFailure)]
        return outcomes


def sealed(arguments) -> list[Sealed]:
    return [Sealed(argument) for argument in arguments]


def _result_or_failure(future) -> Any | StepFailure:
    """The task's result, or the StepFailure of a client that failed after its retries; the machine's
    fault (a full or read-only disk, :func:`~fedcme_core.common.errors.machine_error`) ends the run."""
    try:
        return unsealed(future.result())
    except Exception as error:  # the task failed after its retries: the round decides what follows
        fault = machine_error(error)
        if fault is not None:
            raise fault from None
        return StepFailure.from_exception(error)


def retry_unless_machine_fault(task, task_run, state) -> bool:
    """Prefect's retry condition for a client's task: a client's own failure is retried, the
    machine's (a full or read-only disk) is not: it ends the run at once."""
    error = getattr(state, "data", None)  # the exception a failed run's state carries
    return not (isinstance(error, BaseException) and machine_error(error) is not None)


def make_task_runner(runner: RunnerConfig, device: str = "auto"):
    """The Prefect task runner for the `runner` config section and the run's `device` setting. A local
    Dask cluster for a CUDA run starts one worker process per visible GPU (`runner.workers` of them
    when set), each pinned to its GPU (:func:`flows.orchestration.dask_cluster.gpu_worker_environments`)."""
    workers, _ = worker_layout(runner)
    if runner.kind == "dask":
        from prefect_dask import DaskTaskRunner

        from flows.orchestration.dask_cluster import gpu_worker_environments, local_cluster

        if runner.dask_address:
            return DaskTaskRunner(address=runner.dask_address)
        cluster_kwargs: dict[str, Any] = {"n_workers": workers, "threads_per_worker": 1, "processes": True,
                                          "host": "127.0.0.1", "dashboard_address": None}
        if uses_cuda(device):
            cluster_kwargs.pop("n_workers")
            cluster_kwargs["worker_environments"] = gpu_worker_environments(
                torch.cuda.device_count(), runner.workers, os.environ.get("CUDA_VISIBLE_DEVICES"))
        return DaskTaskRunner(cluster_class=local_cluster, cluster_kwargs=cluster_kwargs)
    return ThreadPoolTaskRunner(max_workers=workers)


def uses_cuda(device: str) -> bool:
    """Whether the device setting trains on CUDA here: "cuda", or "auto" on a machine with a GPU."""
    return device == "cuda" or (device == "auto" and torch.cuda.is_available())
