"""The Prefect training flow with real Prefect (test harness) and a real MLflow sqlite store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from fedcme_core.checkpoints import load_checkpoint
from fedcme_core.config import load_config
from fedcme_core.rounds import RunPaths, final_model, load_experiment_dataset, load_server_state
from flows.tracking import ROUND_METRICS
from flows.train import run_training, wait_for_task_run_records

from .conftest import REPO_ROOT
from .helpers import same_state

SMOKE = str(REPO_ROOT / "configs" / "smoke.yaml")


@pytest.fixture(autouse=True)
def _prefect(prefect_server):
    """Every test here runs against the session's Prefect test server."""


def train(tmp_path: Path, experiment: str, **overrides):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    summary = run_training(SMOKE, experiment, overrides=overrides, runs_dir=str(tmp_path / "runs"), tracking_uri=uri)
    return summary, MlflowClient(tracking_uri=uri)


def test_two_round_fedcme_run_is_tracked_in_mlflow(tmp_path):
    overrides = {"runner.kind": "threads", "runner.workers": 2, "runner.client_tasks": "worker"}
    summary, client = train(tmp_path, "smoke", **overrides)

    run = client.get_run(summary["mlflow_run_id"])
    for metric in ROUND_METRICS:
        if metric == "exchange_seconds" or metric.startswith(("test", "train", "round", "phase")):
            assert [m.step for m in client.get_metric_history(run.info.run_id, metric)] == [0, 1], metric
    assert run.data.params["algorithm.name"] == "fedcme" and run.data.params["federation.rounds"] == "2"
    assert run.data.tags["dataset"] == "synthetic" and len(run.data.tags["partition_hash"]) == 64
    assert run.data.tags["git_commit"]
    # The layout and precision the run chose (training.channels_last: auto), as its run directory records them.
    recorded = json.loads((Path(summary["run_dir"]) / "compute.json").read_text())
    assert run.data.tags["compute"] == recorded["name"] and run.data.tags["compute"].endswith("+fp32")
    assert run.data.tags["compute_chosen_by"] == recorded["chosen_by"] in ("calibration", "machine cache")
    assert run.info.status == "FINISHED"
    # prepare; per round 6 steps + 2 phases x 2 worker tasks (runner.client_tasks: worker)
    assert summary["prefect_task_runs"] == 1 + 2 * 10
    assert wait_for_task_run_records(summary["prefect_flow_run_id"], 21) == 21
    groups = [name for name in task_run_names(summary["prefect_flow_run_id"]) if name.startswith("local-train-group")]
    assert [name.split(" c")[0] for name in groups] == sorted(f"local-train-group r{r} p{p}" for r in (1, 2)
                                                              for p in (1, 2) for _ in range(2))
    artifacts = [item.path for item in client.list_artifacts(run.info.run_id, "matching")]
    assert artifacts == ["matching/round-0000.json", "matching/round-0001.json"]
    matching = json.loads(Path(client.download_artifacts(run.info.run_id, artifacts[1], str(tmp_path))).read_text())
    assert len(matching["pairs"]) == 2 and len(matching["evaluation_vectors"]) == 4

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    loaded = mlflow.pytorch.load_model(summary["model_uri"])
    config = load_config(SMOKE)
    dataset = load_experiment_dataset(config.data, config.seed)
    with torch.no_grad():
        accuracy = (loaded(dataset.x_test).argmax(dim=1) == dataset.y_test).float().mean().item()
    assert accuracy == pytest.approx(summary["final_accuracy"])
    assert np.isclose(client.get_metric_history(run.info.run_id, "test_accuracy")[-1].value, accuracy)


def task_run_names(flow_run_id: str) -> list[str]:
    """The names of a flow run's task runs, read back through Prefect's client API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return sorted(run.name for run in runs)


def test_phase_two_checkpoints_hold_the_counterparts_classifier(tmp_path):
    summary, _ = train(tmp_path, "barrier", **{"runner.keep_round_files": True, "runner.workers": 2})

    paths = RunPaths(Path(summary["run_dir"]))
    history = load_server_state(paths.root, 2)["history"]
    # The UI names each task run by step, round (1-based, as the console), client and phase.
    wait_for_task_run_records(summary["prefect_flow_run_id"], summary["prefect_task_runs"])
    names = task_run_names(summary["prefect_flow_run_id"])
    expected = [f"local-train r{record['round'] + 1} c{client} p{phase}"
                for record in history for client in record["selected"] for phase in (1, 2)]
    assert [name for name in names if name.startswith("local-train")] == sorted(expected)
    steps = ("select", "match", "exchange", "aggregate", "evaluate", "commit")
    assert [name for name in names if not name.startswith("local-train")] == sorted(
        ["prepare", *(f"{step} r{round_number}" for step in steps for round_number in (1, 2))])
    checked = 0
    for record in history:
        for first, second in record["pairs"]:
            for receiver, donor in ((first, second), (second, first)):
                phase_two = load_checkpoint(paths.exchanged_checkpoint(record["round"], receiver))["model"]
                donor_swap = load_checkpoint(paths.swap_checkpoint(record["round"], donor))["model"]
                own_swap = load_checkpoint(paths.swap_checkpoint(record["round"], receiver))["model"]
                assert torch.equal(phase_two["classifier.weight"], donor_swap["classifier.weight"])
                assert torch.equal(phase_two["classifier.bias"], donor_swap["classifier.bias"])
                assert torch.equal(phase_two["backbone.0.weight"], own_swap["backbone.0.weight"])
                checked += 1
    assert checked == 8


@pytest.mark.parametrize("compute", [{}, {"training.channels_last": True, "training.precision": "bf16"}],
                         ids=["default", "channels_last-bf16"])
def test_sequential_threads_and_dask_give_the_same_model(tmp_path, compute):
    runners = {
        "sequential": {"runner.kind": "sequential"},
        "threads": {"runner.kind": "threads", "runner.workers": 2},
        "threads-task-per-worker": {"runner.kind": "threads", "runner.workers": 2, "runner.client_tasks": "worker"},
        "dask": {"runner.kind": "dask", "runner.workers": 2},
    }
    models = {}
    for name, overrides in runners.items():
        summary, _ = train(tmp_path, name, **overrides, **compute, **{"runner.threads_per_worker": 1})
        models[name] = final_model(load_config(SMOKE), summary["run_dir"])

    assert same_state(models["sequential"], models["threads"])
    assert same_state(models["sequential"], models["threads-task-per-worker"])
    assert same_state(models["sequential"], models["dask"])


def test_killed_run_resumes_to_the_same_model_without_duplicate_steps(tmp_path, prefect_server):
    overrides = ["--set", "federation.rounds=3", "--set", "runner.workers=2"]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    command = [sys.executable, "-m", "flows.cli", "train", "--config", SMOKE, "--experiment", "killed",
               "--runs-dir", str(tmp_path / "runs"), "--tracking-uri", uri, *overrides]
    environment = {**os.environ, "PREFECT_API_URL": prefect_server}
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    round_one = RunPaths(tmp_path / "runs" / "killed").round_dir(1)
    deadline = time.monotonic() + 300
    while not (round_one.exists() and any(round_one.glob("*.pt"))):
        assert process.poll() is None, process.stdout.read().decode()
        assert time.monotonic() < deadline, "round 1 never started"
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()

    killed_at = len(load_server_state(tmp_path / "runs" / "killed", 1)["history"])
    summary, client = train(tmp_path, "killed", **{"federation.rounds": 3, "runner.workers": 2})
    straight, _ = train(tmp_path, "straight", **{"federation.rounds": 3, "runner.workers": 2})

    assert killed_at == 1
    config = load_config(SMOKE, overrides={"federation.rounds": 3})
    assert same_state(final_model(config, summary["run_dir"]), final_model(config, straight["run_dir"]))
    assert summary["final_accuracy"] == straight["final_accuracy"]
    for metric in ("test_accuracy", "train_loss", "round_seconds"):
        assert [m.step for m in client.get_metric_history(summary["mlflow_run_id"], metric)] == [0, 1, 2]


def test_serve_builds_a_scheduled_deployment_of_the_training_flow():
    from flows.deploy import training_deployment

    deployment = training_deployment(SMOKE, "nightly", cron="0 2 * * *", overrides={"federation.rounds": 3})

    assert deployment.name == "nightly" and deployment.flow_name == "fedcme-train"
    assert [schedule.schedule.cron for schedule in deployment.schedules] == ["0 2 * * *"]
    assert deployment.parameters["config_file"] == SMOKE
    assert deployment.parameters["overrides"] == {"federation.rounds": 3}
