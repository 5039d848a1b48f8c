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
A run directory belongs to one process at a time (``fedcme_core.rounds.lock``).
What the run shows in the UIs (README, "MLflow"): its name and tags (flows.tracking.names), its MLflow
experiment (smoke and scheduled runs apart from the grids'), the summary, figure, system metrics
and registered model (flows.tracking.run), and the Prefect flow run's tags, version and artifacts
(flows.tracking.views).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.runtime import flow_run

from fedcme_core.client.evaluation import torch_threads
from fedcme_core.config.schema import ExperimentConfig
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
from fedcme_core.data.partition_file import load_partition
from fedcme_core.results.records import round_line

from flows.common.command import check_device, keep_project_errors_off_the_console
from flows.orchestration.preflight import check_run
from flows.tracking.names import flow_run_tags, method_label, mlflow_experiment_for, run_name
from flows.orchestration.tasks import PrefectExecutor, make_task_runner, worker_layout
from flows.tracking.run import RunTracker, git_commit
from flows.tracking.writer import TrackingWriter, mlflow_log_to
from flows.tracking.store import check_reachable, resolve_tracking_uri, warm_up
from flows.orchestration.task_records import uses_temporary_server, wait_for_task_run_records
from flows.tracking.views import label_flow_run, progress_logger, publish_artifacts, run_figures, run_tags

PROJECT_DIR = Path(__file__).resolve().parents[2]
COMMIT = git_commit(PROJECT_DIR)  # the flow's version: a flow run is traced to its code
FAILED_RUN_TRACKING_WAIT = 10.0  # seconds a failed or interrupted run waits for its queued MLflow calls


def compute_line(choice) -> str:
    """`compute channels_last+fp32 (calibration: nchw+fp32 2210/s, channels_last+fp32 3120/s)`."""
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


@flow(name="fedcme-train", flow_run_name=flow_run_name, persist_result=False, version=COMMIT)
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
) -> dict[str, Any]:
    """Train one experiment (resuming it if its run directory holds completed rounds).

    `config` is the validated config; the flow reads no config file. Parse once per entry point:
    a command (``fedcme train``, the DVC train stage) validates its file once and calls the flow
    with that object, which Prefect's parameter check passes through as it is (a pydantic model is
    not validated again). A deployment (flows.orchestration.deploy) cannot hold an object between runs: its
    parameters hold the config's plain values, validated when it was built, and Prefect's parameter
    check turns them into an ExperimentConfig once, as each run starts: that run's one parse.
    With `dated` (a scheduled deployment), each run is an experiment of its own, named by its
    scheduled start (:func:`dated_experiment`), so every trigger trains anew. `method_label` and
    `grid` (a DVC grid cell's) name the run (flows.tracking.names); `mlflow_experiment` None: chosen by the
    kind of run (:func:`flows.tracking.names.mlflow_experiment_for`: scheduled and smoke runs apart);
    `mlflow_parent_run_id` the grid run's parent run (flows.tracking.grid), under which it nests."""
    if dated:
        experiment = dated_experiment(experiment, flow_run.scheduled_start_time)
    views = {"label": method_label, "grid": grid, "parent_run_id": mlflow_parent_run_id,
             "mlflow_experiment": mlflow_experiment_for(config, mlflow_experiment, scheduled=dated)}
    return train(config, experiment, runs_dir, tracking_uri, partition_file, views)


def train(
    config: ExperimentConfig,
    experiment: str,
    runs_dir: str = "runs",
    tracking_uri: str | None = None,
    partition_file: str | None = None,
    views: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train `experiment` holding its run directory (a command's process holds it already; a
    deployment's run takes it here, and stops at once when another process holds it)."""
    check_device(config.device)
    views = views or {"label": None, "grid": None, "mlflow_experiment": mlflow_experiment_for(config)}
    layout = worker_layout(config.runner)
    # the runner's intra-op threads for the run; the process's own count is back once it ends
    with hold_run(experiment_run_dir(runs_dir, experiment)), torch_threads(layout[1]):
        check_run(config, experiment_run_dir(runs_dir, experiment), partition_file)  # before the MLflow run opens
        return train_held(config, experiment, runs_dir, tracking_uri, partition_file, views, layout)


def train_held(
    config: ExperimentConfig,
    experiment: str,
    runs_dir: str,
    tracking_uri: str | None,
    partition_file: str | None,
    views: dict[str, Any],
    layout: tuple[int, int],
) -> dict[str, Any]:
    """The run itself: tracker opened, rounds run and logged, then the run's summary, figure, model
    (registered on request), the flow run's tags and artifacts. `layout`: the runner's (parallel
    client trainings, torch threads each), whose threads the caller has set."""
    logger = progress_logger()
    label = views["label"] or method_label(config)
    flow_run_id = str(flow_run.get_id())
    label_flow_run(flow_run_id, flow_run_tags(config, COMMIT, views["grid"]), COMMIT)
    run_dir = experiment_run_dir(runs_dir, experiment)
    if config.runner.dask_address:  # workers elsewhere resolve the tasks' paths with their own working directory
        run_dir = run_dir.resolve()
    uri = resolve_tracking_uri(tracking_uri)
    tags = run_tags(config, experiment, COMMIT, flow_run_id, label, views["grid"], views.get("parent_run_id"),
                    temporary_prefect=uses_temporary_server())
    tracker = RunTracker.open(uri, views["mlflow_experiment"], run_name(config, label), run_dir,
                              params=config.flat(), tags=tags)
    with mlflow_log_to(run_dir):
        writer = TrackingWriter(tracker)  # every MLflow call from here on: the rounds never wait for the store
        history, figures, model_uri, registered, executor = train_tracked(
            config, experiment, run_dir, partition_file, writer, tags, label, layout, logger)
        experiment_id = tracker.experiment_id()
    publish_artifacts(experiment, label, figures, uri, experiment_id, tracker.run_id)
    summary = {
        "experiment": experiment,
        "rounds": completed_rounds(run_dir),
        "final_accuracy": figures["final_accuracy"],  # mean of the last 5 rounds, as everywhere
        "last_accuracy": figures["last_accuracy"],
        "best_accuracy": figures["best_accuracy"],
        "run_dir": str(run_dir),
        "mlflow_run_id": tracker.run_id,
        "model_uri": model_uri,
        "registered_model_version": registered,
        "tracking_uri": uri,
        "tracking_failure": tracker.failure,
        "prefect_flow_run_id": flow_run_id,
        "prefect_task_runs": executor.task_runs,
    }
    return summary


def train_tracked(config: ExperimentConfig, experiment: str, run_dir: Path, partition_file: str | None,
                  writer: TrackingWriter, tags: dict[str, str], label: str, layout: tuple[int, int], logger):
    """The rounds, each handed to the run's MLflow `writer` as it commits (never waited for), then the
    summary, the model (registered on request) and the run's final status, waited for: returns
    (history, figures, model URI, registered version, the executor)."""
    writer.submit("set_tags", tags)  # a resumed or extended run: today's flow run and names
    if config.tracking.system_metrics:
        writer.submit("start_system_metrics", config.tracking.system_metrics_interval)
    total = config.federation.rounds
    started = time.perf_counter()
    rounds_done_here = 0

    def on_start(history: list[dict[str, Any]]) -> None:
        partition = load_partition(RunPaths(run_dir).partition)
        choice = run_compute_choice(run_dir)  # resolved by `prepare`, possibly on another worker
        writer.submit("log_dataset", f"{config.data.dataset} {partition.params['method']} "
                      f"K={config.federation.num_clients} seed {config.seed}", partition.content_hash,
                      str(RunPaths(run_dir).partition))
        writer.submit("set_tags", {"partition_hash": partition.content_hash, **choice.tags()})
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

    executor = PrefectExecutor(layout[1], layout[0], config.runner.client_tasks)
    try:
        history = run_experiment(config, run_dir, executor, on_round=on_round, partition_file=partition_file,
                                 on_start=on_start)
        figures = run_figures(history)
        writer.submit("log_summary", history)
        dataset = load_experiment_dataset(config.data, config.seed)
        model_uri = writer.call("log_model", final_model(config, run_dir), dataset.x_test[:2].numpy(),
                                completed_rounds(run_dir))
        registered = None
        if config.tracking.register_model and model_uri is not None:
            registered = writer.call("register_model", config.tracking.register_model, model_uri, {
                "method": config.algorithm.name, "method_label": label, "seed": config.seed,
                "final_accuracy": f"{figures['final_accuracy']:.6f}", "experiment": experiment})
    except BaseException:
        writer.submit("finish", "FAILED")
        writer.close(timeout=FAILED_RUN_TRACKING_WAIT)
        raise
    writer.call("finish", "FINISHED")
    writer.close()
    return history, figures, model_uri, registered, executor


def run_training(config: ExperimentConfig, experiment: str, ready: Callable[[], None] | None = None,
                 **parameters: Any) -> dict[str, Any]:
    """Run `train_flow` for one experiment on the task runner its `runner` section names.

    `config` is the validated config, as the entry point parsed it once
    (:func:`fedcme_core.config.load_config`, or a params file's cell); it is passed down as it is,
    never written out and read back in this process. `ready` (a command's
    wait for its Prefect server) is called just before the flow starts, after the work that needs
    no Prefect: the checks, the dataset and the MLflow store (:func:`~flows.tracking.store.warm_up`).
    The run directory is held (:func:`fedcme_core.rounds.lock.hold_run`; a command holds it from
    its first second) until the end: a second command on it stops at once, in one line. Everything
    the run can check before training is checked then (:func:`flows.orchestration.preflight.check_run`), before
    the flow or its MLflow run is opened. `parameters` are
    :func:`train_flow`'s: runs_dir, tracking_uri, partition_file, mlflow_experiment, dated, and the
    names of a DVC grid cell, `method_label` (``methods.<name>.label``), `grid` (``report.name``) and
    `mlflow_parent_run_id` (its grid run's parent, flows.tracking.grid)."""
    if not isinstance(config, ExperimentConfig):
        raise TypeError(f"run_training takes a validated ExperimentConfig (fedcme_core.config.load_config), "
                        f"got {type(config).__name__}")
    # A bad dataset or device, or an unreachable tracking server, stops us here, before anything is written.
    load_experiment_dataset(config.data, config.seed)
    check_device(config.device)
    uri = resolve_tracking_uri(parameters.get("tracking_uri"))
    check_reachable(uri)
    if config.runner.kind == "dask" and config.runner.dask_address:
        from flows.orchestration.dask_cluster import probe_workers

        probe_workers(config.runner.dask_address, config, Path(parameters.get("runs_dir", "runs")))
    run_dir = experiment_run_dir(parameters.get("runs_dir", "runs"), experiment)
    with hold_run(run_dir):
        check_run(config, run_dir, parameters.get("partition_file"))  # before any flow or MLflow run is opened
        return run_held(config, experiment, uri, ready, parameters)


def run_held(config: ExperimentConfig, experiment: str, uri: str, ready: Callable[[], None] | None,
             parameters: dict[str, Any]) -> dict[str, Any]:
    """`run_training` past its checks, its run directory held."""
    warm_up(uri)
    if ready is not None:
        ready()
    keep_project_errors_off_the_console()
    configured_flow = train_flow.with_options(task_runner=make_task_runner(config.runner, config.device))
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
