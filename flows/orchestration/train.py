"""The training flow: every global round of every algorithm as Prefect tasks, tracked in MLflow.

    fedcme train --config params.yaml --experiment NAME     (flows/cli.py; run_training here)

Per round (``fedcme_core.rounds.run_round``, the only round loop):
select -> match -> local training of all selected clients in parallel (phase 1; FedCME stops at
floor(E/2) and writes swap checkpoints) -> exchange (barrier) -> phase 2 -> aggregate ->
evaluate -> commit. The clients of a phase run on the configured task runner: ``sequential``,
``threads`` (default) or ``dask`` (prefect-dask's DaskTaskRunner on a LocalCluster bound to
127.0.0.1, or an existing scheduler). Re-running an experiment resumes after its last
committed round and logs into the same MLflow run; :func:`flows.tracking.sync.sync_run` (``fedcme sync``)
logs a run directory's rounds and model into MLflow after the fact (when tracking failed mid-run).

One entry, one flow: :func:`run_training` (every command, and any script) enters the run once
(:func:`entered`: the run directory held, everything checkable checked, before any flow or MLflow
run is opened), then runs :func:`train_flow`, the one Prefect flow, which a deployment's run
(``fedcme serve``) enters itself. What the run shows in the UIs (README, "MLflow") is one object,
:class:`flows.tracking.views.RunViews`: its name and tags (flows.tracking.names), its MLflow experiment,
its commit (read as the run starts), the links between its flow run and its MLflow run.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.runtime import flow_run

from fedcme_core.client.evaluation import torch_threads
from fedcme_core.config.schema import ExperimentConfig
from fedcme_core.results.records import round_line
from fedcme_core.rounds import (
    PreparedRun,
    RunPaths,
    completed_rounds,
    experiment_run_dir,
    final_model,
    load_experiment_dataset,
    prepare_run,
    run_experiment,
    split_line,
)
from fedcme_core.rounds.lock import hold_run

from flows.common.command import check_device, keep_project_errors_off_the_console
from flows.orchestration.preflight import check_run
from flows.orchestration.task_records import uses_temporary_server, wait_for_task_run_records
from flows.orchestration.tasks import PrefectExecutor, make_task_runner, worker_layout
from flows.tracking.names import mlflow_experiment_for
from flows.tracking.run import RunTracker
from flows.tracking.store import check_reachable, resolve_tracking_uri, warm_up
from flows.tracking.views import RunViews, label_flow_run, progress_logger, publish_artifacts, run_figures
from flows.tracking.writer import TrackingWriter, mlflow_log_to

FAILED_RUN_TRACKING_WAIT = 10.0  # seconds a failed or interrupted run waits for its queued MLflow calls
_ENTERED: ContextVar[str | None] = ContextVar("fedcme_entered_run_dir", default=None)  # run_training's run


def compute_line(choice) -> str:
    """The run's compute as one console line: `compute <layout+precision> (<chosen by>: <candidate> <rate>/s, ...)`."""
    rates = ", ".join(f"{name} {rate:.0f}/s" for name, rate in choice.samples_per_second.items())
    return f"compute {choice.compute.name} ({choice.chosen_by}{': ' + rates if rates else ''})"


def dated_experiment(experiment: str, start: datetime) -> str:
    """A scheduled run's own experiment: `nightly` started 2026-12-02 02:00 UTC -> `nightly-20261202-020000`."""
    return f"{experiment}-{start.astimezone(timezone.utc):%Y%m%d-%H%M%S}"


def flow_run_name() -> str:
    """The flow run's name in the UI: its experiment (dated for a scheduled deployment's runs)."""
    parameters = flow_run.parameters
    experiment = parameters.get("experiment", "")
    return dated_experiment(experiment, flow_run.scheduled_start_time) if parameters.get("dated") else experiment


@contextlib.contextmanager
def entered(config: ExperimentConfig, run_dir: Path, tracking_uri: str | None, partition_file: str | None,
            allow_device_change: bool) -> Iterator[None]:
    """A run's entry, once: `run_dir` held for the block (:func:`fedcme_core.rounds.lock.hold_run`; a
    command that took it in its first second is not refused by its own hold), then, before any flow or
    MLflow run is opened, the dataset, the device, the tracking store (reachable) and a Dask scheduler's
    workers, and everything the run directory and `partition_file` can tell
    (:func:`flows.orchestration.preflight.check_run`); each problem is one line. A resume on another
    device than the run trained on is refused there, unless `allow_device_change`: then
    :func:`fedcme_core.rounds.prepare_run` records this device's layout and precision now."""
    with hold_run(run_dir):
        load_experiment_dataset(config.data, config.seed)
        check_device(config.device)
        check_reachable(resolve_tracking_uri(tracking_uri))
        if config.runner.kind == "dask" and config.runner.dask_address:
            from flows.orchestration.dask_cluster import probe_workers

            probe_workers(config.runner.dask_address, config, run_dir.parent)
        if check_run(config, run_dir, partition_file, allow_device_change) is not None:
            prepare_run(config, run_dir, partition_file, allow_device_change=True)
        yield


def entered_by_run_training(run_dir: Path) -> bool:
    """Whether :func:`run_training` entered `run_dir` around this flow call (a deployment's run enters
    itself). A function, so that the flow, pickled by value to Dask workers, carries no ContextVar."""
    return _ENTERED.get() == str(run_dir)


def run_training(config: ExperimentConfig, experiment: str, ready: Callable[[], None] | None = None, *,
                 runs_dir: str = "runs", tracking_uri: str | None = None, partition_file: str | None = None,
                 mlflow_experiment: str | None = None, dated: bool = False, method_label: str | None = None,
                 grid: str | None = None, mlflow_parent_run_id: str | None = None,
                 allow_device_change: bool = False) -> dict[str, Any]:
    """Train `experiment` (resuming it if its run directory holds completed rounds): the one entry.

    `config` is the validated config, as the entry point parsed it once
    (:func:`fedcme_core.config.load_config`, or a params file's cell); it is passed down as it is,
    never written out and read back in this process. The run is :func:`entered` (held, checked), then
    the MLflow store is warmed up (:func:`~flows.tracking.store.warm_up`), `ready` (a command's wait
    for its Prefect server) is called, and :func:`train_flow` runs on the task runner the config's
    `runner` section names. The keywords are the flow's: `mlflow_experiment` (None: chosen by the
    kind of run, flows.tracking.names.mlflow_experiment_for), `dated` (a scheduled run: an experiment
    of its own named by its start, :func:`dated_experiment`), a DVC grid cell's `method_label`
    (``methods.<name>.label``), `grid` (``report.name``) and `mlflow_parent_run_id` (its grid run's
    parent, flows.tracking.grid), and `allow_device_change` (``--allow-device-change``). Returns the
    flow's summary, with the task-run records a temporary Prefect server stored."""
    if not isinstance(config, ExperimentConfig):
        raise TypeError(f"run_training takes a validated ExperimentConfig (fedcme_core.config.load_config), "
                        f"got {type(config).__name__}")
    if dated:  # named here, as the run starts: its run directory is held before the flow runs
        mlflow_experiment = mlflow_experiment_for(config, mlflow_experiment, scheduled=True)
        experiment = dated_experiment(experiment, datetime.now(timezone.utc))
    run_dir = experiment_run_dir(runs_dir, experiment)
    with entered(config, run_dir, tracking_uri, partition_file, allow_device_change):
        warm_up(resolve_tracking_uri(tracking_uri))
        if ready is not None:
            ready()
        keep_project_errors_off_the_console()
        configured_flow = train_flow.with_options(task_runner=make_task_runner(config.runner, config.device))
        token = _ENTERED.set(str(run_dir))
        try:
            summary = configured_flow(
                config=config, experiment=experiment, runs_dir=runs_dir, tracking_uri=tracking_uri,
                partition_file=partition_file, mlflow_experiment=mlflow_experiment, method_label=method_label,
                grid=grid, mlflow_parent_run_id=mlflow_parent_run_id, allow_device_change=allow_device_change)
        finally:
            _ENTERED.reset(token)
    if uses_temporary_server():
        summary["prefect_task_runs_recorded"] = wait_for_task_run_records(
            summary["prefect_flow_run_id"], summary["prefect_task_runs"])
        missing = summary["prefect_task_runs"] - summary["prefect_task_runs_recorded"]
        if missing > 0:
            print(f"warning: Prefect's temporary server had not stored {missing} of {summary['prefect_task_runs']} "
                  "task-run records when the run ended; they are lost when it stops. Training results are "
                  "complete (run directory and MLflow); run against `prefect server start` to keep every record.",
                  file=sys.stderr)
    return summary


@flow(name="fedcme-train", flow_run_name=flow_run_name, persist_result=False)
def train_flow(
    config: ExperimentConfig,
    experiment: str,
    runs_dir: str = "runs",
    tracking_uri: str | None = None,
    partition_file: str | None = None,
    mlflow_experiment: str | None = None,
    dated: bool = False,
    method_label: str | None = None,
    grid: str | None = None,
    mlflow_parent_run_id: str | None = None,
    allow_device_change: bool = False,
) -> dict[str, Any]:
    """The one training flow: what :func:`run_training` runs, and what a deployment's run starts
    (flows.orchestration.deploy), which enters its run here (:func:`entered`), first.

    `config` is the validated config; the flow reads no config file. A command passes the object it
    validated, which Prefect's parameter check passes through as it is (a pydantic model is not
    validated again). A deployment cannot hold an object between runs: its parameters hold the
    config's plain values, validated when it was built, and Prefect's parameter check turns them into
    an ExperimentConfig once, as each run starts: that run's one parse. With `dated` (a scheduled
    deployment), each run is an experiment of its own, named by its scheduled start
    (:func:`dated_experiment`), so every trigger trains anew. The other parameters are
    :func:`run_training`'s."""
    if dated:
        experiment = dated_experiment(experiment, flow_run.scheduled_start_time)
    run_dir = experiment_run_dir(runs_dir, experiment)
    with contextlib.nullcontext() if entered_by_run_training(run_dir) else entered(config, run_dir, tracking_uri, partition_file,
                                                        allow_device_change):
        views = RunViews.start(config, experiment, method_label, grid, mlflow_experiment, scheduled=dated,
                               parent_run_id=mlflow_parent_run_id)
        return train(config, views, run_dir, resolve_tracking_uri(tracking_uri), partition_file)


def train(config: ExperimentConfig, views: RunViews, run_dir: Path, uri: str,
          partition_file: str | None) -> dict[str, Any]:
    """The entered run: the flow run labelled, the MLflow run opened, the rounds run and logged, then
    the run's summary, figure, model (registered on request) and the flow run's artifacts. Returns
    the run's summary (its figures, where its records are, and the layout and precision it trained
    with, as ``compute.json`` records them)."""
    workers, threads = worker_layout(config.runner)
    flow_run_id = str(flow_run.get_id())
    label_flow_run(flow_run_id, views.flow_run_tags(config), views.commit)
    if config.runner.dask_address:  # workers elsewhere resolve the tasks' paths with their own working directory
        run_dir = run_dir.resolve()
    tags = views.mlflow_tags(config, flow_run_id, temporary_prefect=uses_temporary_server())
    tracker = RunTracker.open(uri, views.mlflow_experiment, views.run_name(config), run_dir,
                              params=views.mlflow_params(config), tags=tags)
    executor = PrefectExecutor(threads, workers, config.runner.client_tasks)
    # the runner's intra-op threads for the run; the process's own count is back once it ends
    with torch_threads(threads), mlflow_log_to(run_dir):
        writer = TrackingWriter(tracker)  # every MLflow call from here on: the rounds never wait for the store
        outcome = train_tracked(config, views, run_dir, partition_file, writer, tags, executor)
        experiment_id = tracker.experiment_id()
    figures = outcome["figures"]
    publish_artifacts(views.experiment, views.label, figures, uri, experiment_id, tracker.run_id)
    return {
        "experiment": views.experiment,
        "rounds": completed_rounds(run_dir),
        "final_accuracy": figures["final_accuracy"],  # mean of the last 5 rounds, as everywhere
        "last_accuracy": figures["last_accuracy"],
        "best_accuracy": figures["best_accuracy"],
        "run_dir": str(run_dir),
        "mlflow_run_id": tracker.run_id,
        "model_uri": outcome["model_uri"],
        "registered_model_version": outcome["registered"],
        "tracking_uri": uri,
        "tracking_failure": tracker.failure,
        "prefect_flow_run_id": flow_run_id,
        "prefect_task_runs": executor.task_runs,
        "compute": outcome["compute"],
    }


def train_tracked(config: ExperimentConfig, views: RunViews, run_dir: Path, partition_file: str | None,
                  writer: TrackingWriter, tags: dict[str, str], executor: PrefectExecutor) -> dict[str, Any]:
    """The rounds, each handed to the run's MLflow `writer` as it commits (never waited for), then the
    summary, the model (registered on request) and the run's final status, waited for: returns
    {figures, model_uri, registered (the registry version), compute (``compute.json``'s record)}."""
    writer.submit("set_tags", tags)  # a resumed or extended run: today's flow run and names
    if config.tracking.system_metrics:
        writer.submit("start_system_metrics", config.tracking.system_metrics_interval)
    logger = progress_logger()
    experiment, total = views.experiment, config.federation.rounds
    started = time.perf_counter()
    rounds_done_here = 0
    outcome: dict[str, Any] = {"registered": None}

    def on_start(history: list[dict[str, Any]], prepared: PreparedRun) -> None:
        choice = prepared.compute  # resolved by `prepare`, possibly on another worker
        outcome["compute"] = choice.to_json()
        writer.submit("log_dataset", f"{config.data.dataset} {prepared.partition_method} "
                      f"K={config.federation.num_clients} seed {config.seed}", prepared.partition_hash,
                      str(RunPaths(run_dir).partition))
        writer.submit("set_tags", {"partition_hash": prepared.partition_hash, **choice.tags()})
        for line in [f"{experiment}: {compute_line(choice)}", f"{experiment}: {split_line(config)}",
                     *([f"{experiment}: resuming after round {len(history)} of {total}"] if history else [])]:
            print(line, flush=True)
            logger.info(line)
        writer.submit("sync", history)

    def on_round(record: dict[str, Any]) -> None:
        nonlocal rounds_done_here
        rounds_done_here += 1
        writer.submit("log_round", record)
        line = round_line(record, total, time.perf_counter() - started, rounds_done_here)
        print(line, flush=True)
        logger.info(line)

    try:
        history = run_experiment(config, run_dir, executor, on_round=on_round, partition_file=partition_file,
                                 on_start=on_start)
        outcome["figures"] = figures = run_figures(history)
        writer.submit("log_summary", history)
        dataset = load_experiment_dataset(config.data, config.seed)
        outcome["model_uri"] = model_uri = writer.call(
            "log_model", final_model(config, run_dir), dataset.x_test[:2].numpy(), completed_rounds(run_dir))
        if config.tracking.register_model and model_uri is not None:
            outcome["registered"] = writer.call("register_model", config.tracking.register_model, model_uri, {
                "method": config.algorithm.name, "method_label": views.label, "seed": config.seed,
                "final_accuracy": f"{figures['final_accuracy']:.6f}", "experiment": experiment})
    except BaseException:
        writer.submit("finish", "FAILED")
        writer.close(timeout=FAILED_RUN_TRACKING_WAIT)
        raise
    writer.call("finish", "FINISHED")
    writer.close()
    return outcome
