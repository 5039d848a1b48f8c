"""``fedcme sync``: a run directory's committed rounds and final model logged into MLflow after the fact,
when tracking failed mid-run (the run itself lost nothing: its rounds are committed on disk)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedcme_core.rounds import RunError, RunPaths, completed_rounds, final_model, load_experiment_dataset, load_server_state
from fedcme_core.rounds.run_record import recorded_config

from flows.common.errors import TrackingError
from flows.tracking.names import mlflow_experiment_for, run_name
from flows.tracking.run import RunTracker
from flows.tracking.store import resolve_tracking_uri
from flows.tracking.views import git_commit, run_params, run_tags


def sync_run(run_dir: str | Path, tracking_uri: str | None = None, mlflow_experiment: str | None = None) -> dict[str, Any]:
    """Log what MLflow lacks of a run directory: its committed rounds (under the grouped metric names,
    flows.tracking.run), its summary (``final_accuracy`` and the figure) and its final model, then end the
    run FINISHED. Idempotent: when nothing is missing it logs nothing and leaves the run's status be.
    A run already in MLflow is found through the run directory's record; a new one goes to
    `mlflow_experiment` (None: chosen as for training, flows.tracking.names.mlflow_experiment_for).
    The config is the run directory's record, parsed once: this command did not train the run
    (another process did), so it holds no config object of its own."""
    paths = RunPaths(run_dir)
    if not paths.config.is_file():
        raise RunError(f"{paths.root}: not a run directory (no config.json)")
    rounds = completed_rounds(paths.root)
    if rounds == 0:
        raise RunError(f"{paths.root}: no completed round to log")
    config = recorded_config(paths.root, rounds)
    uri = resolve_tracking_uri(tracking_uri)
    history = load_server_state(paths.root, rounds)["history"]
    tracker = RunTracker.open(
        uri, mlflow_experiment_for(config, mlflow_experiment), run_name(config), paths.root, params=run_params(config),
        tags=run_tags(config, paths.root.name, git_commit()), reopen=False,
    )
    logged = tracker.sync(history)
    summary = not tracker.summary_logged(history) and tracker.failure is None
    if summary:
        tracker.log_summary(history)
    model_uri = tracker.logged_model_uri()
    model = model_uri is None and tracker.failure is None
    if model:
        dataset = load_experiment_dataset(config.data, config.seed)
        model_uri = tracker.log_model(final_model(config, paths.root), dataset.x_test[:2].numpy(), rounds)
    if tracker.failure is None and (logged or summary or model or tracker.status() != "FINISHED"):
        tracker.finish("FINISHED")
    if tracker.failure is not None:
        raise TrackingError(f"MLflow tracking store {uri}: {tracker.failure}")
    return {"run_dir": str(paths.root), "rounds": rounds, "rounds_logged": logged, "summary_logged": summary,
            "model_logged": model, "mlflow_run_id": tracker.run_id, "model_uri": model_uri, "tracking_uri": uri}
