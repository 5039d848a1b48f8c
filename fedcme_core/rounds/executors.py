"""Where the steps of a round run: the :class:`Executor` protocol and the in-process one.

An executor only decides where a step runs (this process, Prefect tasks on threads or Dask
workers: ``flows/orchestration/tasks.py``); the round itself is :func:`fedcme_core.rounds.loop.run_round`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from fedcme_core.common.errors import machine_error
from fedcme_core.server.faults import StepFailure


class Executor(Protocol):
    """Where the steps of a round run: in-process, or as orchestrator tasks. An executor runs the
    `function` it is handed, whichever step it is (a new step needs no new executor code); `step`
    only names it (an orchestrator's task name)."""

    def call(self, step: str, function: Callable[..., Any], *args: Any) -> Any:
        """function(*args), after the step before it; returns what the function returns."""
        ...

    def map(
        self,
        step: str,
        function: Callable[..., Any],
        arguments: Sequence[tuple],
        retries: int = 0,
        costs: Sequence[float] | None = None,
    ) -> list[Any | StepFailure]:
        """function(*args) for each args (in parallel where it can), each run up to
        1 + `retries` times; one that still raises gives a :class:`StepFailure` in its place.
        `costs` (one per args, e.g. the client's samples) may guide how the calls are grouped."""
        ...


class SerialExecutor:
    """Runs every step in this process, clients one after another."""

    def call(self, step: str, function: Callable[..., Any], *args: Any) -> Any:
        return function(*args)

    def map(
        self,
        step: str,
        function: Callable[..., Any],
        arguments: Sequence[tuple],
        retries: int = 0,
        costs: Sequence[float] | None = None,
    ) -> list[Any | StepFailure]:
        return [with_retries(function, args, retries) for args in arguments]


def balanced_groups(costs: Sequence[float], num_groups: int) -> list[list[int]]:
    """Positions of `costs` split into at most `num_groups` groups of near-equal total cost:
    longest first, each to the group with the least cost so far (LPT; ties go to the lower
    group, then the lower position). Groups keep their positions in descending cost; empty
    groups are left out."""
    if num_groups < 1:
        raise ValueError(f"num_groups must be at least 1, got {num_groups}")
    loads = [0.0] * num_groups
    groups: list[list[int]] = [[] for _ in range(num_groups)]
    for position in sorted(range(len(costs)), key=lambda index: (-costs[index], index)):
        lightest = min(range(num_groups), key=lambda group: (loads[group], group))
        groups[lightest].append(position)
        loads[lightest] += costs[position]
    return [group for group in groups if group]


def largest_first(clients: Sequence[int], sizes: Sequence[int] | dict[int, int]) -> list[int]:
    """`clients` by descending size (`sizes[client]`, e.g. its samples), ties by client id: the
    order in which a round hands a phase's clients to the workers."""
    return sorted(clients, key=lambda client: (-sizes[client], client))


def with_retries(function: Callable[..., Any], args: tuple, retries: int) -> Any | StepFailure:
    """function(*args), run up to 1 + `retries` times; a :class:`StepFailure` if it still raises.

    The machine's faults are not the client's: a full or read-only disk (:func:`machine_error`)
    ends the run at once, as a StorageError naming the path and the errno, never retried."""
    for attempt in range(retries + 1):
        try:
            return function(*args)
        except Exception as error:  # a client's failure is data for the round, not the run's end
            fault = machine_error(error)
            if fault is not None:
                raise fault from None
            if attempt == retries:
                return StepFailure.from_exception(error)
    raise AssertionError("unreachable")
