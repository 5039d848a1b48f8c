"""The training flow: every global round of every algorithm as Prefect tasks, tracked in MLflow.

    fedcme train --config params.yaml --experiment NAME     (flows/cli.py; run_training here)

Per round (``fedcme_core.rounds.run_round``, the only round loop):
select -> match -> local training of all selected clients in parallel (phase 1; FedCME stops at
floor(E/2) and writes swap checkpoints) -> exchange (barrier) -> phase 2 -> aggregate ->
evaluate -> commit. The clients of a phase run on the configured task runner: ``sequential``,
``threads`` (default) or ``dask`` (prefect-dask's DaskTaskRunner on a LocalCluster bound to
127.0.0.1, or an existing scheduler). Re-running an experiment resumes after its last
committed round and logs into the same MLflow run; :func:`flows.sync.sync_run` (``fedcme sync``)
logs a run directory's rounds and model into MLflow after the fact (when tracking failed mid-run).
A run directory belongs to one process at a time (``fedcme_core.rounds.lock``).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from uuid import UUID

import torch
from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from fedcme_core.config import ExperimentConfig, load_config
from fedcme_core.rounds import (
    RunPaths,
    completed_rounds,
    experiment_run_dir,
    final_model,
    load_experiment_dataset,
    run_compute_choice,
    run_experiment,
    split_line,
)
from fedcme_core.rounds.lock import hold_run
from fedcme_core.partition_file import load_partition
from fedcme_core.records import round_line

from .command import check_device
from .tasks import PrefectExecutor, make_task_runner, worker_layout
from .tracking import RunTracker, git_commit
from .tracking_store import check_reachable, resolve_tracking_uri, warm_up

PROJECT_DIR = Path(__file__).resolve().parents[1]
DEFAULT_MLFLOW_EXPERIMENT = "fedcme"


def compute_line(choice) -> str:
    """`compute channels_last+fp32 (calibration: nchw+fp32 2210/s, channels_last+fp32 3120/s)`."""
    rates = ", ".join(f"{name} {rate:.0f}/s" for name, rate in choice.samples_per_second.items())
    return f"compute {choice.compute.name} ({choice.chosen_by}{': ' + rates if rates else ''})"


def run_tags(config: ExperimentConfig, prefect_flow_run_id: str | None = None) -> dict[str, str]:
    """The MLflow run's tags: what produced it (MLflow's own source tags, so the UI's "Source" shows
    it), the dataset and the algorithm."""
    commit = git_commit(PROJECT_DIR)
    tags = {"git_commit": commit, "dataset": config.data.dataset, "algorithm": config.algorithm.name,
            "mlflow.source.type": "JOB", "mlflow.source.name": "fedcme-train (flows/train.py)",
            "mlflow.source.git.commit": commit}
    if prefect_flow_run_id is not None:
        tags["prefect_flow_run_id"] = prefect_flow_run_id
    return tags


def progress_logger():
    """The flow run's logger for the round lines: INFO to Prefect's API only, so the UI's Logs tab
    shows the run's progress while the console stays as quiet as ``PREFECT_LOGGING_LEVEL`` asks
    (the console gets the same lines from ``print``)."""
    from prefect.logging.handlers import APILogHandler
    from prefect.logging.loggers import PrefectLogAdapter

    logger = logging.getLogger("fedcme.progress")
    if not any(isinstance(handler, APILogHandler) for handler in logger.handlers):
        logger.addHandler(APILogHandler())
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return PrefectLogAdapter(logger, extra=get_run_logger().extra)


def dated_experiment(experiment: str, start: datetime) -> str:
    """A scheduled run's own experiment: `nightly` started 2026-12-02 02:00 UTC -> `nightly-20261202-020000`."""
    return f"{experiment}-{start.astimezone(timezone.utc):%Y%m%d-%H%M%S}"


def flow_run_name() -> str:
    """The flow run's name in the UI: its experiment (dated for a scheduled deployment's runs)."""
    parameters = flow_run.parameters
    experiment = parameters.get("experiment", "")
    return dated_experiment(experiment, flow_run.scheduled_start_time) if parameters.get("dated") else experiment


@flow(name="fedcme-train", flow_run_name=flow_run_name, persist_result=False)
def train_flow(
    config_file: str | None = None,
    experiment: str = "",
    overrides: dict[str, Any] | None = None,
    runs_dir: str = "runs",
    tracking_uri: str | None = None,
    partition_file: str | None = None,
    mlflow_experiment: str = DEFAULT_MLFLOW_EXPERIMENT,
    config_section: str | None = None,
    config: ExperimentConfig | None = None,
    dated: bool = False,
) -> dict[str, Any]:
    """Train one experiment (resuming it if its run directory holds completed rounds).

    A command passes the `config` it has already validated; a deployment passes `config_file`
    (and `overrides`), read when its run starts, so a scheduled run sees the file as it is then.
    With `dated` (a scheduled deployment), each run is an experiment of its own, named by its
    scheduled start (:func:`dated_experiment`), so every trigger trains anew."""
    if config is None:
        config = load_config(config_file, overrides=overrides, section=config_section)
    if dated:
        experiment = dated_experiment(experiment, flow_run.scheduled_start_time)
    return train(config, experiment, runs_dir, tracking_uri, partition_file, mlflow_experiment)


def train(
    config: ExperimentConfig,
    experiment: str,
    runs_dir: str = "runs",
    tracking_uri: str | None = None,
    partition_file: str | None = None,
    mlflow_experiment: str = DEFAULT_MLFLOW_EXPERIMENT,
) -> dict[str, Any]:
    """Train `experiment` holding its run directory (a command's process holds it already; a
    deployment's run takes it here, and stops at once when another process holds it)."""
    check_device(config.device)
    with hold_run(experiment_run_dir(runs_dir, experiment)):
        return train_held(config, experiment, runs_dir, tracking_uri, partition_file, mlflow_experiment)


def train_held(
    config: ExperimentConfig,
    experiment: str,
    runs_dir: str,
    tracking_uri: str | None,
    partition_file: str | None,
    mlflow_experiment: str,
) -> dict[str, Any]:
    logger = progress_logger()
    run_dir = experiment_run_dir(runs_dir, experiment)
    if config.runner.dask_address:  # workers elsewhere resolve the tasks' paths with their own working directory
        run_dir = run_dir.resolve()
    workers, threads = worker_layout(config.runner)
    torch.set_num_threads(threads)
    uri = resolve_tracking_uri(tracking_uri)
    tracker = RunTracker.open(
        uri,
        mlflow_experiment,
        experiment,
        run_dir,
        params=config.flat(),
        tags=run_tags(config, str(flow_run.get_id())),
    )
    total = config.federation.rounds
    started = time.perf_counter()
    rounds_done_here = 0

    def on_start(history: list[dict[str, Any]]) -> None:
        partition = load_partition(RunPaths(run_dir).partition)
        choice = run_compute_choice(run_dir)  # resolved by `prepare`, possibly on another worker
        tracker.log_dataset(f"{config.data.dataset} {partition.params['method']} K={config.federation.num_clients} "
                            f"seed {config.seed}", partition.content_hash, str(RunPaths(run_dir).partition))
        tracker.set_tags({"partition_hash": partition.content_hash, "compute": choice.compute.name,
                          "compute_chosen_by": choice.chosen_by,
                          "compute_samples_per_second": json.dumps(choice.samples_per_second, sort_keys=True)})
        for line in [f"{experiment}: {compute_line(choice)}", f"{experiment}: {split_line(config)}",
                     *([f"{experiment}: resuming after round {len(history)} of {total}"] if history else [])]:
            print(line, flush=True)
            logger.info(line)
        tracker.sync(history)

    def on_round(record: dict[str, Any]) -> None:
        nonlocal rounds_done_here
        rounds_done_here += 1
        tracker.log_round(record)
        line = round_line(record, total, time.perf_counter() - started, rounds_done_here)
        print(line, flush=True)
        logger.info(line)

    executor = PrefectExecutor(threads, workers, config.runner.client_tasks)
    try:
        history = run_experiment(
            config,
            run_dir,
            executor,
            on_round=on_round,
            partition_file=partition_file,
            on_start=on_start,
        )
        dataset = load_experiment_dataset(config.data, config.seed)
        model_uri = tracker.log_model(final_model(config, run_dir), dataset.x_test[:2].numpy(), completed_rounds(run_dir))
    except BaseException:
        tracker.finish("FAILED")
        raise
    tracker.finish("FINISHED")
    summary = {
        "experiment": experiment,
        "rounds": completed_rounds(run_dir),
        "final_accuracy": history[-1]["test_accuracy"],
        "best_accuracy": max(record["test_accuracy"] for record in history),
        "run_dir": str(run_dir),
        "mlflow_run_id": tracker.run_id,
        "model_uri": model_uri,
        "tracking_uri": uri,
        "tracking_failure": tracker.failure,
        "prefect_flow_run_id": str(flow_run.get_id()),
        "prefect_task_runs": executor.task_runs,
    }
    return summary


def run_training(config: ExperimentConfig | str | Path, experiment: str, ready: Callable[[], None] | None = None,
                 **parameters: Any) -> dict[str, Any]:
    """Run `train_flow` for one experiment on the task runner its `runner` section names.

    `config` is the validated config (what the commands pass: parsed once), or a file read here
    with `overrides` and `config_section`; nothing is written for a bad one. `ready` (a command's
    wait for its Prefect server) is called just before the flow starts, after the work that needs
    no Prefect: the checks, the dataset and the MLflow store (:func:`~flows.tracking_store.warm_up`).
    The run directory is held (:func:`fedcme_core.rounds.lock.hold_run`) from after the checks
    until the end: a second command on it stops at once, in one line."""
    if not isinstance(config, ExperimentConfig):
        config = load_config(config, overrides=parameters.pop("overrides", None),
                             section=parameters.pop("config_section", None))
    # A bad dataset or device, or an unreachable tracking server, stops us here, before anything is written.
    load_experiment_dataset(config.data, config.seed)
    check_device(config.device)
    uri = resolve_tracking_uri(parameters.get("tracking_uri"))
    check_reachable(uri)
    if config.runner.kind == "dask" and config.runner.dask_address:
        from .dask_cluster import probe_workers

        probe_workers(config.runner.dask_address, config, Path(parameters.get("runs_dir", "runs")))
    with hold_run(experiment_run_dir(parameters.get("runs_dir", "runs"), experiment)):
        return run_held(config, experiment, uri, ready, parameters)


def run_held(config: ExperimentConfig, experiment: str, uri: str, ready: Callable[[], None] | None,
             parameters: dict[str, Any]) -> dict[str, Any]:
    """`run_training` past its checks, its run directory held."""
    warm_up(uri)
    if ready is not None:
        ready()
    configured_flow = train_flow.with_options(task_runner=make_task_runner(config.runner))
    summary = configured_flow(config=config, experiment=experiment, **parameters)
    if uses_temporary_server():
        summary["prefect_task_runs_recorded"] = wait_for_task_run_records(
            summary["prefect_flow_run_id"], summary["prefect_task_runs"]
        )
        missing = summary["prefect_task_runs"] - summary["prefect_task_runs_recorded"]
        if missing > 0:
            print(
                f"warning: Prefect's temporary server had not stored {missing} of {summary['prefect_task_runs']} "
                "task-run records when the run ended; they are lost when it stops. Training results are "
                "complete (run directory and MLflow); run against `prefect server start` to keep every record.",
                file=sys.stderr,
            )
    return summary


def uses_temporary_server() -> bool:
    """True when this process's Prefect server stops with it: Prefect's own temporary server
    (no PREFECT_API_URL) or the one `fedcme train` started (flows.prefect_server)."""
    from prefect.settings import PREFECT_API_URL

    from .prefect_server import is_temporary

    return is_temporary(PREFECT_API_URL.value())


def recorded_task_runs(flow_run_id: str) -> int:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    flow_filter = FlowRunFilter(id=FlowRunFilterId(any_=[UUID(flow_run_id)]))
    page, offset = 200, 0
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(flow_run_filter=flow_filter, limit=page, offset=offset)
            offset += len(runs)
            if len(runs) < page:
                return offset


def wait_for_task_run_records(flow_run_id: str, expected: int, timeout: float = 20.0) -> int:
    """Wait (bounded) until the server has stored every task run of the flow run; returns how many it has."""
    deadline = time.monotonic() + timeout
    recorded = recorded_task_runs(flow_run_id)
    while recorded < expected and time.monotonic() < deadline:
        time.sleep(0.5)
        recorded = recorded_task_runs(flow_run_id)
    return recorded
