"""RunTracker against a real MLflow sqlite store: one round numbering, runs begun before it, the warm-up."""

from __future__ import annotations

import time

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from flows.tracking import RunTracker, warm_up

from .test_records import record


def open_tracker(tmp_path) -> RunTracker:
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    return RunTracker.open(f"sqlite:///{tmp_path / 'mlflow.db'}", "fedcme", "run", run_dir, params={}, tags={})


def steps(tracker: RunTracker, metric: str = "test_accuracy") -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in MlflowClient(tracker.uri).get_metric_history(tracker.run_id, metric)]


def test_rounds_are_logged_as_steps_from_one_with_matching_artifacts_of_the_same_number(tmp_path):
    tracker = open_tracker(tmp_path)
    history = [record(0, test_accuracy=0.1).to_dict(), record(1, test_accuracy=0.2).to_dict()]

    assert tracker.sync(history) == 2
    assert tracker.sync(history) == 0  # nothing twice

    assert steps(tracker) == [(1, 0.1), (2, 0.2)]
    artifacts = [item.path for item in MlflowClient(tracker.uri).list_artifacts(tracker.run_id, "matching")]
    assert artifacts == ["matching/round-0001.json", "matching/round-0002.json"]


def test_a_run_begun_with_steps_from_zero_keeps_its_numbering_when_resumed(tmp_path):
    tracker = open_tracker(tmp_path)
    client = MlflowClient(tracker.uri)
    now = int(time.time() * 1000)
    client.log_batch(tracker.run_id, metrics=[Metric("test_accuracy", 0.1, now, 0), Metric("test_accuracy", 0.2, now, 1)])

    resumed = open_tracker(tmp_path)  # the same run, reopened from the run directory's record
    history = [record(index, test_accuracy=0.1 * (index + 1)).to_dict() for index in range(3)]

    assert resumed.run_id == tracker.run_id
    assert resumed.sync(history) == 1
    assert [step for step, _ in steps(resumed)] == [0, 1, 2]


def test_the_warm_up_opens_the_store_and_builds_mlflows_package_map_that_log_model_checks_against(tmp_path, monkeypatch):
    from mlflow.utils import requirements_utils

    monkeypatch.setattr(requirements_utils, "_PACKAGES_TO_MODULES", None)
    thread = warm_up(f"sqlite:///{tmp_path / 'mlflow.db'}")

    assert (tmp_path / "mlflow.db").is_file()
    assert thread is not None, "MLflow no longer has _init_packages_to_modules_map: the warm-up builds nothing"
    thread.join(timeout=60)
    assert "torch" in requirements_utils._PACKAGES_TO_MODULES and "mlflow" in requirements_utils._PACKAGES_TO_MODULES
