"""RunTracker against a real MLflow sqlite store: one round numbering under the grouped metric names,
runs begun before them, the summary, the warm-up, and a store shared by several commands (a fresh one opened at once, a busy one)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import mlflow
import pytest
from mlflow.entities import Metric
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from fedcme_core.algorithms import RecordSection
from flows.common import shared_stores
from flows.common.errors import TrackingError
from flows.common.shared_stores import FirstUse
from flows.tracking.run import RunTracker
from flows.tracking.store import open_client, warm_up

from .conftest import REPO_ROOT
from .test_records import record


def open_tracker(tmp_path) -> RunTracker:
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    return RunTracker.open(f"sqlite:///{tmp_path / 'mlflow.db'}", "fedcme", "run", run_dir, params={}, tags={})


def steps(tracker: RunTracker, metric: str = "eval/test_accuracy") -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in MlflowClient(tracker.uri).get_metric_history(tracker.run_id, metric)]


def test_rounds_are_logged_as_steps_from_one_with_matching_artifacts_of_the_same_number(tmp_path):
    tracker = open_tracker(tmp_path)
    # Round 2 as a record written before the algorithm section (FedCME's keys at its top level).
    legacy = {key: value for key, value in record(1, test_accuracy=0.2).to_dict().items() if key != "algorithm"}
    history = [record(0, test_accuracy=0.1).to_dict(), {**legacy, "pairs": [[3, 1]], "evaluation_vectors": {3: [0.5, 1.0]}}]

    assert tracker.sync(history) == 2
    assert tracker.sync(history) == 0  # nothing twice

    assert steps(tracker) == [(1, 0.1), (2, 0.2)]
    client = MlflowClient(tracker.uri)
    artifacts = [item.path for item in client.list_artifacts(tracker.run_id, "matching")]
    assert artifacts == ["matching/round-0001.json", "matching/round-0002.json"]
    for number, path in enumerate(artifacts, start=1):
        logged = json.loads(Path(client.download_artifacts(tracker.run_id, path, str(tmp_path))).read_text())
        assert logged == {"round": number, "selected": [3, 1], "pairs": [[3, 1]], "evaluation_vectors": {"3": [0.5, 1.0]},
                          "failures": {}}


def test_a_round_without_matching_or_failures_logs_no_round_file(tmp_path):
    tracker = open_tracker(tmp_path)
    fedavg = [record(index, algorithm=RecordSection()).to_dict() for index in range(2)]
    fedavg[1]["failures"] = {"3": "non-finite training loss nan"}

    assert tracker.sync(fedavg) == 2

    client = MlflowClient(tracker.uri)
    assert [item.path for item in client.list_artifacts(tracker.run_id, "matching")] == ["matching/round-0002.json"]
    assert steps(tracker) == [(1, 0.25), (2, 0.25)]


def test_a_run_begun_under_the_old_flat_names_gets_every_round_under_the_grouped_names_when_resumed(tmp_path):
    tracker = open_tracker(tmp_path)
    client = MlflowClient(tracker.uri)
    now = int(time.time() * 1000)
    client.log_batch(tracker.run_id, metrics=[Metric("test_accuracy", 0.1, now, 0), Metric("test_accuracy", 0.2, now, 1)])

    resumed = open_tracker(tmp_path)  # the same run, reopened from the run directory's record
    history = [record(index, test_accuracy=0.1 * (index + 1)).to_dict() for index in range(3)]

    assert resumed.run_id == tracker.run_id
    assert resumed.sync(history) == 3
    assert [step for step, _ in steps(resumed)] == [1, 2, 3]
    assert [step for step, _ in steps(resumed, "train/loss")] == [1, 2, 3]
    assert [step for step, _ in steps(resumed, "test_accuracy")] == [0, 1]  # the old history is left as it was


def test_the_summary_is_the_mean_of_the_last_five_rounds_rounded_at_step_0_and_moves_on_when_a_run_is_extended(
        tmp_path):
    tracker = open_tracker(tmp_path)
    history = [record(index, test_accuracy=0.9 - 0.1 * index).to_dict() for index in range(6)]  # falling
    tracker.sync(history[:2])
    tracker.log_summary(history[:2])
    assert tracker.summary_logged(history[:2]) and not tracker.summary_logged(history)
    tracker.sync(history)
    tracker.log_summary(history)  # the run extended to 6 rounds: a lower value, logged later at the same step

    run = MlflowClient(tracker.uri).get_run(tracker.run_id)
    assert run.data.metrics["final_accuracy"] == 0.6  # (0.8 + 0.7 + 0.6 + 0.5 + 0.4) / 5
    # One point per run end, at step 0; (0.9 + 0.8) / 2 is 0.8500000000000001 in floats, logged rounded.
    assert steps(tracker, "final_accuracy") == [(0, 0.85), (0, 0.6)]
    assert run.data.metrics["best_accuracy"] == 0.9
    assert tracker.summary_logged(history) and not tracker.summary_logged(history[:2])
    figures = [item.path for item in MlflowClient(tracker.uri).list_artifacts(tracker.run_id, "figures")]
    assert figures == ["figures/accuracy.png"]


def test_the_warm_up_opens_the_store_and_builds_mlflows_package_map_that_log_model_checks_against(tmp_path, monkeypatch):
    from mlflow.utils import requirements_utils

    monkeypatch.setattr(requirements_utils, "_PACKAGES_TO_MODULES", None)
    thread = warm_up(f"sqlite:///{tmp_path / 'mlflow.db'}")

    assert (tmp_path / "mlflow.db").is_file()
    assert thread is not None, "MLflow no longer has _init_packages_to_modules_map: the warm-up builds nothing"
    thread.join(timeout=60)
    assert "torch" in requirements_utils._PACKAGES_TO_MODULES and "mlflow" in requirements_utils._PACKAGES_TO_MODULES


OPEN_AT_ONCE = """
import sys, time
from pathlib import Path
from flows.tracking.run import RunTracker
from tests.test_records import record
folder, name = Path(sys.argv[1]), sys.argv[2]
(folder / name).mkdir()
while not (folder / "go").exists():  # every process past its imports, then all at once
    time.sleep(0.005)
tracker = RunTracker.open(f"sqlite:///{folder / 'mlflow.db'}", "fedcme", name, folder / name, params={"a": 1}, tags={})
tracker.sync([record(0).to_dict(), record(1).to_dict()])
assert tracker.failure is None, tracker.failure
"""


@pytest.mark.slow
def test_a_fresh_store_opened_by_several_commands_at_once_serves_them_all(tmp_path):
    names = [f"run{index}" for index in range(4)]
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    processes = [subprocess.Popen([sys.executable, "-c", OPEN_AT_ONCE, str(tmp_path), name], cwd=REPO_ROOT,
                                  env=environment, stderr=subprocess.PIPE, text=True) for name in names]
    while not all((tmp_path / name).is_dir() for name in names):
        assert all(process.poll() is None for process in processes), [p.stderr.read()[-2000:] for p in processes]
        time.sleep(0.05)
    time.sleep(1.0)  # the last one is past its mkdir and polling for the start
    (tmp_path / "go").touch()
    errors = [process.communicate(timeout=300)[1] for process in processes]

    assert [process.returncode for process in processes] == [0] * 4, [error[-2000:] for error in errors]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("fedcme").experiment_id])
    assert sorted(run.info.run_name for run in runs) == names
    assert all([m.step for m in client.get_metric_history(run.info.run_id, "eval/test_accuracy")] == [1, 2] for run in runs)
    assert FirstUse(tmp_path / "mlflow.db", "mlflow", mlflow.__version__).is_done()


def test_a_schema_being_created_by_another_command_is_waited_for_with_a_bound(tmp_path):
    database = tmp_path / "mlflow.db"
    other = FirstUse(database, "mlflow", mlflow.__version__)
    assert other.try_begin()  # another command is creating the schema

    with pytest.raises(TrackingError, match=r"another command has been creating its schema for over 1 s .*mlflow\.db\.lock"):
        open_client(f"sqlite:///{database}", timeout=1.0)
    assert not database.exists()

    other.abandon()
    open_client(f"sqlite:///{database}").search_experiments()
    assert other.is_done()


def hold_busy(database: Path, seconds: float) -> threading.Thread:
    """Hold an exclusive sqlite lock on `database` for `seconds` (on a thread; returns once it holds)."""
    holding = threading.Event()

    def hold() -> None:
        connection = sqlite3.connect(database, isolation_level=None)
        connection.execute("begin exclusive")
        holding.set()
        time.sleep(seconds)
        connection.execute("commit")
        connection.close()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    holding.wait(timeout=30)
    return thread


@pytest.mark.slow
def test_a_round_that_meets_a_busy_store_is_retried_and_logged_once(tmp_path):
    tracker = open_tracker(tmp_path)
    tracker.sync([record(0, test_accuracy=0.1).to_dict()])
    thread = hold_busy(tmp_path / "mlflow.db", 22.0)  # longer than MLflow's own 20 s wait (its sqlite busy_timeout)

    tracker.log_round(record(1, test_accuracy=0.2).to_dict())
    thread.join()

    assert tracker.failure is None
    assert steps(tracker) == [(1, 0.1), (2, 0.2)]


def test_a_store_busy_past_the_bound_is_one_warning_and_the_round_is_logged_later(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(shared_stores, "BUSY_ATTEMPTS", 2)
    tracker = open_tracker(tmp_path)
    history = [record(0, test_accuracy=0.1).to_dict(), record(1, test_accuracy=0.2).to_dict()]
    tracker.sync(history[:1])
    capsys.readouterr()
    calls = []

    def busy(*args, **kwargs):
        calls.append(args)
        raise MlflowException("(sqlite3.OperationalError) database is locked")

    monkeypatch.setattr(tracker.client, "log_batch", busy)  # the store stays busy past the bound
    tracker.log_round(history[1])
    tracker.log_round(history[1])  # tracking is off for the run: no second try, no second warning

    assert len(calls) == 2
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1 and "MLflow tracking failed" in warning[0] and "database is locked" in warning[0], warning
    assert "fedcme sync --experiment run" in warning[0]
    resumed = open_tracker(tmp_path)  # as `fedcme sync` or a resumed run does, once the store answers
    assert resumed.sync(history) == 1
    assert steps(resumed) == [(1, 0.1), (2, 0.2)]


def test_a_schema_creation_killed_midway_leaves_nothing_a_later_command_cannot_use(tmp_path):
    database = tmp_path / "mlflow.db"
    (tmp_path / "mlflow.db.partial").write_bytes(b"half a schema")  # what a killed creation leaves

    open_client(f"sqlite:///{database}").search_experiments()

    assert database.is_file() and not (tmp_path / "mlflow.db.partial").exists()
    assert FirstUse(database, "mlflow", mlflow.__version__).is_done()
