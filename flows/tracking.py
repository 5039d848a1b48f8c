"""MLflow tracking of a training run: the only module of the project that imports mlflow.

One MLflow run per experiment, all in one MLflow experiment (default ``fedcme``) so the UI
compares them (its id kept in the run directory, so a resumed experiment
logs into the same run), the flattened config as params, tags for the git commit, the
partition hash and the dataset; each round's metrics in one ``log_batch`` call with the
round as step; each round's matching pairs and evaluation vectors as a JSON artifact; the
final global model through ``mlflow.pytorch.log_model``. The run directory's history is
the source of truth: :meth:`RunTracker.sync` logs exactly the rounds MLflow lacks, so a
crash between a round's commit and its logging leaves no step missing or duplicated.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
from mlflow.entities import Metric, Param, RunStatus, RunTag
from mlflow.tracking import MlflowClient

from fedcme_core.checkpoints import atomic_write_bytes

from .errors import TrackingError

ROUND_METRICS = (
    "test_accuracy",
    "test_loss",
    "train_loss",
    "round_seconds",
    "client_train_seconds",
    "phase1_seconds",
    "exchange_seconds",
    "phase2_seconds",
    "aggregate_seconds",
    "evaluate_seconds",
)
MAX_PARAMS_PER_BATCH = 100


def resolve_tracking_uri(explicit: str | None = None) -> str:
    """--tracking-uri, else $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working directory."""
    return explicit or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def artifact_location(uri: str) -> str | None:
    """Artifacts of a sqlite store live beside its database file (not in the working directory)."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).resolve().parent / "mlartifacts").as_uri()
    return None


def git_commit(directory: Path) -> str:
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True, text=True, timeout=10, check=True
        )
        return result.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class RunTracker:
    """The MLflow run of one experiment's run directory."""

    def __init__(self, client: MlflowClient, uri: str, run_id: str) -> None:
        self.client = client
        self.uri = uri
        self.run_id = run_id

    @classmethod
    def open(
        cls,
        uri: str,
        mlflow_experiment: str,
        run_name: str,
        run_dir: Path,
        params: Mapping[str, Any],
        tags: Mapping[str, str],
    ) -> RunTracker:
        """Check the store answers (before any training), then create or reopen the run `run_name`."""
        client = MlflowClient(tracking_uri=uri)
        try:
            found = client.get_experiment_by_name(mlflow_experiment)
            experiment_id = (
                found.experiment_id
                if found is not None
                else client.create_experiment(mlflow_experiment, artifact_location=artifact_location(uri))
            )
        except Exception as error:  # mlflow raises MlflowException, OSError, requests errors...
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise TrackingError(f"MLflow tracking store {uri} is not usable: {reason}") from None
        record_file = run_dir / "mlflow.json"
        run_id = cls._reusable_run(client, record_file, uri)
        if run_id is None:
            run = client.create_run(experiment_id, run_name=run_name, tags=dict(tags))
            run_id = run.info.run_id
            items = [Param(key, json.dumps(value) if not isinstance(value, str) else value) for key, value in params.items()]
            for start in range(0, len(items), MAX_PARAMS_PER_BATCH):
                client.log_batch(run_id, params=items[start : start + MAX_PARAMS_PER_BATCH])
            record = {"tracking_uri": uri, "experiment_id": experiment_id, "run_id": run_id}
            atomic_write_bytes(record_file, (json.dumps(record, indent=2) + "\n").encode("utf-8"))
        else:
            client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))
        return cls(client, uri, run_id)

    @staticmethod
    def _reusable_run(client: MlflowClient, record_file: Path, uri: str) -> str | None:
        if not record_file.exists():
            return None
        record = json.loads(record_file.read_text(encoding="utf-8"))
        if record.get("tracking_uri") != uri:
            return None
        try:
            client.get_run(record["run_id"])
        except Exception:
            return None
        return record["run_id"]

    def logged_rounds(self) -> set[int]:
        return {metric.step for metric in self.client.get_metric_history(self.run_id, ROUND_METRICS[0])}

    def sync(self, history: Iterable[Mapping[str, Any]]) -> int:
        """Log every round of `history` that the MLflow run lacks; returns how many were logged."""
        logged = self.logged_rounds()
        missing = [record for record in history if record["round"] not in logged]
        for record in missing:
            self.log_round(record)
        return len(missing)

    def log_round(self, record: Mapping[str, Any]) -> None:
        step = int(record["round"])
        timestamp = int(time.time() * 1000)
        metrics = [
            Metric(name, float(record[name]), timestamp, step) for name in ROUND_METRICS if record.get(name) is not None
        ]
        self.client.log_batch(self.run_id, metrics=metrics)
        matching = {
            "round": step,
            "selected": record.get("selected", []),
            "pairs": record.get("pairs", []),
            "evaluation_vectors": record.get("evaluation_vectors", {}),
        }
        self.client.log_dict(self.run_id, matching, f"matching/round-{step:04d}.json")

    def log_model(self, model, input_example: np.ndarray) -> str:
        """Log the final global model; returns its model URI (loadable by mlflow.pytorch.load_model)."""
        mlflow.set_tracking_uri(self.uri)
        with mlflow.start_run(run_id=self.run_id):
            info = mlflow.pytorch.log_model(model, name="model", input_example=input_example)
        self.client.set_tag(self.run_id, "model_uri", info.model_uri)
        return info.model_uri

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self.client.log_batch(self.run_id, tags=[RunTag(key, str(value)) for key, value in tags.items()])

    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)
