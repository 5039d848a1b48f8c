"""Prefect tasks made from the core's round steps: any step function of ``fedcme_core.rounds`` becomes
a task by :func:`step_task`, so a new step in the core needs no code here.

Every step takes the (frozen, picklable) config, the run directory and small data, and returns small
data (whatever the step returns: this module never looks inside); models travel as checkpoint files
in the run directory, so a task can run in a thread, in a Dask worker process or on another machine
sharing the run directory. Inputs are never hashed (``cache_policy=NONE``: they are configs and paths
whose files change underneath) and results are not persisted (the run directory is the record).
The graph's edges are the round's order, given as ``wait_for``: each step waits for the one before
it, the exchange for every first-phase client (the swap barrier) and every second-phase client for
the exchange. Every argument and every result goes in a :class:`Sealed`, which Prefect neither walks
nor draws. Its own lineage links an input to any earlier result holding the same object, found by
``id()``: plain data shares interned objects across rounds (the key "pairs" of every record), and a
plain dict or list result is kept by ``id()`` alone, so a freed result's recycled address linked a
later task to it (round 2's second phase was drawn from ``evaluate r1``). A sealed result is
weak-referenceable, so Prefect checks the object is still the same one (PrefectHQ/prefect#20558).
(Prefect's own ``quote`` does this for arguments on threads, but reaches a Dask worker as a plain tuple.)

Task runs are named by step, round (1-based), client and phase (`local-train r3 c17 p1`), read from
the step function's own parameters (``round_index``, ``client_id``, ``phase_index``). The steps a round
maps over its clients (local training) are one task per call by default (``runner.client_tasks:
client``: each client its own line in the UI), or one task per worker (``worker``: the calls packed by
cost into near-equal groups, `local-train-group r1 p1 c3,5`).
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from prefect import Task, task
from prefect.cache_policies import NONE
from prefect.task_runners import ThreadPoolTaskRunner

from fedcme_core import rounds
from fedcme_core.common.errors import machine_error
from fedcme_core.config.schema import RunnerConfig
from fedcme_core.server.faults import StepFailure

TASK_OPTIONS = {"cache_policy": NONE, "persist_result": False}
# A step's task name where it is not the step's own (the UI has always called local training so).
TASK_NAMES = {"train_phase": "local-train"}


class Sealed:
    """A task argument or result that Prefect passes on without looking inside; the receiver
    unwraps it. Weak-referenceable, so Prefect's result registry never matches a recycled id."""

    __slots__ = ("value", "__weakref__")

    def __init__(self, value: Any) -> None:
        self.value = value


def unsealed(value: Any) -> Any:
    return value.value if isinstance(value, Sealed) else value


def sealed(arguments: Sequence[Any]) -> list[Sealed]:
    return [Sealed(argument) for argument in arguments]


def task_name(step: str) -> str:
    """The task's name in the UI: `train_phase` -> `local-train`; any other step by its own name."""
    return TASK_NAMES.get(step, step)


def run_label(name: str, arguments: Mapping[str, Any]) -> str:
    """`local-train r3 c17 p1`, `select r1`, `prepare`: the task name, then the round as the console
    counts it (1-based), then client and phase, for those of `arguments` (a step's, by parameter name)."""
    parts = [name]
    if "round_index" in arguments:
        parts.append(f"r{arguments['round_index'] + 1}")
    if "client_id" in arguments:
        parts.append(f"c{arguments['client_id']}")
        if "phase_index" in arguments:
            parts.append(f"p{arguments['phase_index'] + 1}")
    return " ".join(parts)


def group_label(name: str, calls: Sequence[Mapping[str, Any]]) -> str:
    """`local-train-group r1 p1 c3,5`: a group task's name, round, phase and clients (its calls' arguments)."""
    if not calls:
        return name
    first = calls[0]
    where = [f"r{first['round_index'] + 1}"] if "round_index" in first else []
    where += [f"p{first['phase_index'] + 1}"] if "phase_index" in first else []
    clients = ",".join(str(call["client_id"]) for call in calls if "client_id" in call)
    return " ".join([name, *where, *([f"c{clients}"] if clients else [])])


def call_arguments(function: Callable[..., Any], args: Sequence[Any]) -> dict[str, Any]:
    """`function`'s parameters named: {"round_index": 2, ...} for the positional `args`."""
    return dict(inspect.signature(function).bind_partial(*args).arguments)


def step_name(function: Callable[..., Any]) -> str:
    """A step function's name (a callable object's: its class's)."""
    return getattr(function, "__name__", type(function).__name__)


def _run_name(name: str, function: Callable[..., Any] | None = None) -> Callable[[], str]:
    """The task-run name, read from the running task's parameters (a group's from its calls: `function`'s)."""

    def run_name() -> str:
        from prefect.runtime import task_run

        parameters = {key: unsealed(value) for key, value in task_run.parameters.items()}
        if function is not None:
            return group_label(name, [call_arguments(function, args) for args in parameters["calls"]])
        return run_label(name, parameters)

    return run_name


@functools.lru_cache(maxsize=None)
def step_task(step: str, function: Callable[..., Any], torch_threads: int | None = None) -> Task:
    """The Prefect task of the core step `function` (built once per process): its parameters are the
    step's own, sealed on the way in and out (:class:`Sealed`), its name :func:`task_name` (`step`),
    its runs named by :func:`run_label`. `torch_threads`: the intra-op threads the task trains on (a
    client's task, on a Dask worker too); None leaves the process's count be."""

    def run_step(*args: Any, **kwargs: Any) -> Sealed:
        if torch_threads is not None:
            torch.set_num_threads(torch_threads)
        return Sealed(function(*map(unsealed, args), **{key: unsealed(value) for key, value in kwargs.items()}))

    # The step's name and parameters, for Prefect (its task key, its runs' parameters), in this module: a
    # task sent to a Dask worker is pickled by value, as this function, not looked up as the step it runs.
    run_step.__name__ = run_step.__qualname__ = step_name(function)
    run_step.__doc__, run_step.__signature__ = function.__doc__, inspect.signature(function)
    name = task_name(step)
    return task(name=name, task_run_name=_run_name(name), **TASK_OPTIONS)(run_step)


@functools.lru_cache(maxsize=None)
def group_task(step: str, function: Callable[..., Any], torch_threads: int) -> Task:
    """One task running several calls of the core step `function` one after another (`<name>-group`):
    each call is retried on its own, and one that still fails gives a StepFailure in its place."""

    def run_group(calls: Any, retries: Any) -> Sealed:  # both sealed: a list of args tuples, an int
        torch.set_num_threads(torch_threads)
        return Sealed([rounds.with_retries(function, args, unsealed(retries)) for args in unsealed(calls)])

    run_group.__name__ = run_group.__qualname__ = f"{step_name(function)}_group"
    name = f"{task_name(step)}-group"
    return task(name=name, task_run_name=_run_name(name, function), **TASK_OPTIONS)(run_group)


def worker_layout(runner: RunnerConfig) -> tuple[int, int]:
    """(parallel client trainings, torch threads each), so that workers x threads <= cores by default."""
    cores = rounds.available_cores()
    workers = 1 if runner.kind == "sequential" else (runner.workers or cores)
    threads = runner.threads_per_worker or max(1, cores // workers)
    return workers, threads


class PrefectExecutor:
    """Runs the core round's steps, whichever the core hands it, as Prefect tasks (:func:`step_task`);
    the calls of a mapped step go to the task runner, one task per call or (``runner.client_tasks:
    worker``) one task per worker."""

    def __init__(self, torch_threads: int, workers: int = 1, client_tasks: str = "client") -> None:
        self.torch_threads = torch_threads
        self.workers = workers
        self.client_tasks = client_tasks
        self.task_runs = 0  # how many task runs this flow run created (to check they were recorded)
        self.upstream: list[Any] = []  # the completed task runs of the step before (futures or states)

    def call(self, step: str, function: Callable[..., Any], *args: Any) -> Any:
        """function(*args) as the task of `step`, in this process, after the step before."""
        self.task_runs += 1
        state = step_task(step, function)(*sealed(args), wait_for=self.upstream, return_state=True)
        self.upstream = [state]
        return unsealed(state.result())

    def map(self, step: str, function: Callable[..., Any], arguments: Sequence[tuple], retries: int = 0,
            costs: Sequence[float] | None = None) -> list[Any | StepFailure]:
        """function(*args) for each args, as tasks on the task runner; a call that still fails after its
        `retries` gives a StepFailure (:class:`fedcme_core.rounds.Executor`'s contract)."""
        if self.client_tasks == "worker":
            return self._map_grouped(step, function, arguments, retries, costs)
        self.task_runs += len(arguments)
        client_task = step_task(step, function, self.torch_threads).with_options(
            retries=retries, retry_condition_fn=retry_unless_machine_fault)
        return self.finished([client_task.submit(*sealed(args), wait_for=self.upstream) for args in arguments])

    def _map_grouped(self, step: str, function: Callable[..., Any], arguments: Sequence[tuple], retries: int,
                     costs: Sequence[float] | None) -> list[Any | StepFailure]:
        """One task per worker: the calls packed by cost (largest first) into near-equal groups."""
        groups = rounds.balanced_groups(costs if costs is not None else [1.0] * len(arguments), self.workers)
        self.task_runs += len(groups)
        grouped = group_task(step, function, self.torch_threads)
        futures = [grouped.submit(*sealed(([arguments[position] for position in group], retries)), wait_for=self.upstream)
                   for group in groups]
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
