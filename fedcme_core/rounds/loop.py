"""The one round loop of every algorithm, and the experiment loop around it.

A run killed mid-round resumes from the last committed round with identical results (the
round's files are inputs only; a round becomes visible at its commit). Clients that drop
out, fail or send unusable updates are left out of the round (``faults.py``) as long as
``federation.min_clients`` remain.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedcme_core.algorithms import build_algorithm, round_phases
from fedcme_core.config.schema import ExperimentConfig
from fedcme_core.server.faults import StepFailure, dropped_clients, surviving_donors
from fedcme_core.results.records import RoundRecord
from fedcme_core.rounds import run_record, store
from fedcme_core.rounds.device import release_resident
from fedcme_core.rounds.executors import Executor, SerialExecutor, largest_first
from fedcme_core.rounds.setup import PreparedRun, prepare_run
from fedcme_core.rounds.state import PhaseResult
from fedcme_core.rounds.steps import (
    aggregate_step,
    commit_round,
    evaluate_step,
    exchange_step,
    later_phase_start,
    match_step,
    select_step,
    train_phase_step,
)


def run_round(config: ExperimentConfig, run_dir: str | Path, round_index: int, executor: Executor) -> dict[str, Any]:
    """One global round of any algorithm (the only round loop body); returns its record as stored."""
    run_dir = str(run_dir)
    algorithm = build_algorithm(config.algorithm)
    round_started = time.perf_counter()
    timings: dict[str, list[float]] = {"phase": [], "exchange": [], "aggregate": [], "evaluate": []}

    def timed(name: str, action: Callable[[], Any]) -> Any:
        """`action()`, its wall time appended to timings[`name`]."""
        started = time.perf_counter()
        result = action()
        timings[name].append(time.perf_counter() - started)
        return result

    selected = list(executor.call("select", select_step, config, round_index).clients)
    matching = executor.call("match", match_step, config, run_dir, round_index, selected)
    # Simulated availability: the server matched them, but they never train this round.
    dropped = dropped_clients(selected, config.federation.dropout, seed=config.seed, round_index=round_index)
    training = [client for client in selected if client not in dropped]
    failed: dict[int, str] = {}

    # Largest client first: a phase ends when its slowest worker does, and longest-first
    # submission to the workers' FIFO queue keeps the last tasks short (LPT scheduling).
    client_sizes = {client: len(indices) for client, indices in enumerate(run_record.run_partition_file(run_dir).clients)}

    def train_phase(phase_index: int, starts: dict[int, str]) -> list[PhaseResult]:
        """Train `training` for one phase; clients whose task still fails after retries leave the round."""
        order = largest_first(training, client_sizes)
        arguments = [(config, run_dir, round_index, client, phase_index, starts.get(client)) for client in order]
        costs = [float(client_sizes[client]) for client in order]
        results = executor.map("train_phase", train_phase_step, arguments, config.runner.retries, costs)
        results = dict(zip(order, results, strict=True))
        finished = []
        for client in list(training):
            if isinstance(results[client], StepFailure):
                failed[client] = f"local training (phase {phase_index + 1}) failed: {results[client].reason}"
                training.remove(client)
            else:
                finished.append(results[client])
        return finished

    phase_results = [timed("phase", lambda: train_phase(0, {}))]
    for phase_index in range(1, len(round_phases(algorithm, config.training.local_epochs))):
        # SPEC step 5 at each phase boundary: counterparts exchange; one whose partner is lost trains
        # on with its own model.
        donors = surviving_donors(dict(matching.donors), training)
        exchanged = timed("exchange", lambda: executor.call("exchange", exchange_step, config, run_dir, round_index, donors))
        starts = {client: later_phase_start(run_dir, round_index, client, exchanged) for client in training}
        phase_results.append(timed("phase", lambda: train_phase(phase_index, starts)))
    results = [result for phase in phase_results for result in phase]
    lost = {**{client: "dropped out (simulated availability)" for client in dropped}, **failed}
    aggregate = timed(
        "aggregate",
        lambda: executor.call("aggregate", aggregate_step, config, run_dir, round_index, training, lost, matching),
    )
    evaluation = timed("evaluate", lambda: executor.call("evaluate", evaluate_step, config, run_dir, round_index))
    record = RoundRecord(
        round=round_index,
        selected=[int(client) for client in selected],
        algorithm=aggregate.record,  # the algorithm's own section (its matching, its uploads)
        test_accuracy=evaluation.test_accuracy,
        local_accuracy=evaluation.local_accuracy,
        local_accuracy_client_mean=evaluation.local_accuracy_client_mean,
        local_accuracy_p10=evaluation.local_accuracy_p10,
        test_loss=evaluation.test_loss,
        train_loss=aggregate.train_loss,
        per_class_accuracy=evaluation.per_class_accuracy,
        client_train_seconds=float(sum(result.seconds for result in results)),
        client_work_seconds=float(sum(result.work_seconds for result in results)),
        critical_client_seconds=float(
            sum(max((result.work_seconds for result in phase), default=0.0) for phase in phase_results)
        ),
        samples_trained=int(sum(result.samples for result in results)),
        aggregated_clients=aggregate.clients,
        dropped_clients=len(dropped),
        failed_clients=len(failed),
        rejected_clients=len(aggregate.rejected),
        failures={**failed, **aggregate.rejected},
        phase_seconds=timings["phase"],
        aggregate_seconds=timings["aggregate"][0],
        evaluate_seconds=timings["evaluate"][0],
        exchange_seconds=sum(timings["exchange"]) if timings["exchange"] else None,
        round_seconds=time.perf_counter() - round_started,
    )
    return executor.call("commit", commit_round, config, run_dir, round_index, record)


def run_experiment(
    config: ExperimentConfig,
    run_dir: str | Path,
    executor: Executor | None = None,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    partition_file: str | Path | None = None,
    on_start: Callable[[list[dict[str, Any]], PreparedRun], None] | None = None,
) -> list[dict[str, Any]]:
    """Train for config.federation.rounds rounds, resuming a partial run; returns the history.

    `on_start` receives the history of the rounds already committed (a resumed run) and the run as
    the prepare step made it ready (:class:`~fedcme_core.rounds.setup.PreparedRun`: its layout,
    precision and device, its partition), `on_round` each new round's record after its commit. On every exit the process's resident copies
    of the training set are released (:func:`fedcme_core.rounds.device.release_resident`).
    """
    executor = executor or SerialExecutor()
    run_dir = str(run_dir)
    prepared = executor.call("prepare", prepare_run, config, run_dir,
                             None if partition_file is None else str(partition_file))
    if on_start is not None:
        on_start(store.load_server_state(run_dir, prepared.completed_rounds)["history"], prepared)
    try:
        for round_index in range(store.completed_rounds(run_dir), config.federation.rounds):
            record = run_round(config, run_dir, round_index, executor)
            if on_round is not None:
                on_round(record)
    finally:
        release_resident()  # this process's GPU copies of the training set (a Dask worker's stay bounded)
    return store.load_server_state(run_dir, store.completed_rounds(run_dir))["history"]
