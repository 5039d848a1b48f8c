"""The Prefect training flow with real Prefect (test harness) and a real MLflow sqlite store."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from fedcme_core.common.checkpoints import load_checkpoint
from fedcme_core.client.compute import native_bf16
from fedcme_core.config import load_config
from fedcme_core.rounds import RunPaths, final_model, load_experiment_dataset, load_server_state
from flows.orchestration.task_records import wait_for_task_run_records
from flows.orchestration.train import run_training
from flows.tracking.run import ROUND_METRICS

from .conftest import REPO_ROOT
from .helpers import same_state

# Every test runs on the session's real Prefect server and most train through the whole flow.
pytestmark = pytest.mark.slow

SMOKE = str(REPO_ROOT / "configs" / "smoke.yaml")


@pytest.fixture(autouse=True)
def _prefect(prefect_server):
    """Every test here runs against the session's Prefect test server."""


def train(tmp_path: Path, experiment: str, **overrides):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    summary = run_training(load_config(SMOKE, overrides=overrides), experiment, runs_dir=str(tmp_path / "runs"),
                           tracking_uri=uri)
    return summary, MlflowClient(tracking_uri=uri)


def test_a_task_result_is_registered_by_weak_reference_so_a_recycled_id_draws_no_edge():
    """Prefect links an input to any earlier result by id(); a plain dict result is kept by id alone,
    and once freed its address is reused by a later argument (CI drew round 2's second phase from
    evaluate r1). A sealed result carries a weak reference that Prefect checks on lookup."""
    from prefect import flow
    from prefect.context import FlowRunContext
    from prefect.utilities.engine import get_state_for_result

    from flows.orchestration.tasks import Sealed, step_task, unsealed

    def toy_step(value: int) -> dict[str, int]:
        return {"value": value}

    toy = step_task("toy", toy_step)

    @flow(name="toy-lineage")
    def lineage() -> tuple[dict[str, int], bool, list]:
        state = toy(Sealed(3), return_state=True)
        sealed_result = state.result()
        linked = get_state_for_result(sealed_result) is not None  # the live result itself still links
        entries = [entry for entry in FlowRunContext.get().run_results.values()
                   if entry[0].state_details.task_run_id == state.state_details.task_run_id]
        return unsealed(sealed_result), linked, entries

    result, linked, entries = lineage()
    assert result == {"value": 3} and linked
    # Every entry of the task's result is checked by weak reference: none is kept by id() alone.
    assert entries and all(ref is not None for _, _, ref in entries)


def test_two_round_fedcme_run_is_tracked_in_mlflow(tmp_path):
    overrides = {"runner.kind": "threads", "runner.workers": 2, "runner.client_tasks": "worker"}
    summary, client = train(tmp_path, "smoke", **overrides)

    run = client.get_run(summary["mlflow_run_id"])
    for metric in ROUND_METRICS:
        if metric == "time/exchange_seconds" or metric.startswith(("eval/", "train/", "time/round", "time/phase")):
            # One round numbering everywhere: the console's round 1 is step 1 (fedcme_core.results.records).
            assert [m.step for m in client.get_metric_history(run.info.run_id, metric)] == [1, 2], metric
    assert run.data.params["algorithm.name"] == "fedcme" and run.data.params["federation.rounds"] == "2"
    assert run.data.tags["dataset"] == "synthetic" and len(run.data.tags["partition_hash"]) == 64
    assert run.data.tags["git_commit"]
    # The layout and precision the run chose (both auto), as its run directory records them: bf16
    # only where the CPU computes it natively.
    recorded = json.loads((Path(summary["run_dir"]) / "compute.json").read_text())
    assert run.data.tags["compute"] == recorded["name"]
    assert recorded["precision"] == "fp32" or native_bf16(torch.device("cpu"))
    assert run.data.tags["compute_chosen_by"] == recorded["chosen_by"] in ("calibration", "machine cache")
    assert run.info.status == "FINISHED"
    # prepare; per round 6 steps + 2 phases x 2 worker tasks (runner.client_tasks: worker)
    assert summary["prefect_task_runs"] == 1 + 2 * 10
    assert wait_for_task_run_records(summary["prefect_flow_run_id"], 21) == 21
    runs = task_runs(summary["prefect_flow_run_id"])
    groups = sorted(run.name for run in runs if run.name.startswith("local-train-group"))
    assert [name.split(" c")[0] for name in groups] == sorted(f"local-train-group r{r} p{p}" for r in (1, 2)
                                                              for p in (1, 2) for _ in range(2))
    # The graph (Prefect's task inputs) is the round's order: no argument draws an edge; each step
    # waits for the one before, the exchange for every first-phase task and the second phase for it.
    by_id = {str(run.id): run.name for run in runs}
    assert all(inputs == [] for run in runs for name, inputs in run.task_inputs.items() if name != "wait_for")
    waits = {run.name.split(" c")[0]: sorted({by_id[str(item.id)].split(" c")[0] for item in run.task_inputs.get("wait_for", [])})
             for run in runs}
    assert waits["prepare"] == [] and waits["select r1"] == ["prepare"] and waits["select r2"] == ["commit r1"]
    assert waits["exchange r2"] == ["local-train-group r2 p1"] and waits["local-train-group r2 p2"] == ["exchange r2"]
    assert waits["aggregate r2"] == ["local-train-group r2 p2"] and waits["commit r2"] == ["evaluate r2"]
    # The flow run is named by its experiment, and its Logs tab shows the run's progress.
    assert flow_run(summary["prefect_flow_run_id"]).name == "smoke"
    def round_lines(messages: list[str]) -> list[str]:
        return sorted(line.split("  acc")[0] for line in messages if line.startswith("round"))

    logs = flow_run_logs(summary["prefect_flow_run_id"], lambda messages: len(round_lines(messages)) >= 2
                         and any(line.startswith("smoke: compute ") for line in messages))
    assert round_lines(logs) == ["round    1/2", "round    2/2"]
    assert any(line.startswith("smoke: compute ") for line in logs)
    artifacts = [item.path for item in client.list_artifacts(run.info.run_id, "matching")]
    assert artifacts == ["matching/round-0001.json", "matching/round-0002.json"]
    matching = json.loads(Path(client.download_artifacts(run.info.run_id, artifacts[1], str(tmp_path))).read_text())
    assert len(matching["pairs"]) == 2 and len(matching["evaluation_vectors"]) == 4

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    loaded = mlflow.pytorch.load_model(summary["model_uri"])
    config = load_config(SMOKE)
    dataset = load_experiment_dataset(config.data, config.seed)
    with torch.no_grad():
        accuracy = (loaded(dataset.x_test).argmax(dim=1) == dataset.y_test).float().mean().item()
        features = loaded.eval().features(dataset.x_test[:3])  # the project's class: features() and classify()
        assert torch.equal(loaded.classify(features).argmax(dim=1), loaded(dataset.x_test[:3]).argmax(dim=1))
    assert accuracy == pytest.approx(summary["last_accuracy"])
    assert np.isclose(client.get_metric_history(run.info.run_id, "eval/test_accuracy")[-1].value, accuracy)

    # Source and dataset, as the MLflow UI shows them; the model logged once, at the last round's step.
    assert run.data.tags["mlflow.source.type"] == "JOB"
    assert run.data.tags["mlflow.source.git.commit"] == run.data.tags["git_commit"]
    (dataset_input,) = run.inputs.dataset_inputs
    partition_hash = run.data.tags["partition_hash"]
    assert dataset_input.dataset.digest == partition_hash[:36] and dataset_input.dataset.name.startswith("synthetic")
    assert {tag.key: tag.value for tag in dataset_input.tags}["fedcme.partition_sha256"] == partition_hash
    (model,) = client.search_logged_models([run.info.experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'")
    assert model.tags["fedcme.current"] == "true" and model.tags["fedcme.rounds"] == "2"
    assert {metric.key: metric.step for metric in model.metrics}.get("eval/test_accuracy") == 2


def flow_run(flow_run_id: str):
    """The flow run as the server holds it, read back through Prefect's client API."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id)


def flow_run_logs(flow_run_id: str, wanted, timeout: float = 60.0) -> list[str]:
    """The messages of a flow run's Logs tab, once `wanted(messages)` holds (bounded wait: logs reach
    the server from a background worker, and Prefect's own lines may come first)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    deadline = time.monotonic() + timeout
    while True:
        with get_client(sync_client=True) as client:
            messages = [log.message for log in
                        client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))]
        if wanted(messages) or time.monotonic() > deadline:
            return messages
        time.sleep(0.5)


def task_runs(flow_run_id: str) -> list:
    """A flow run's task runs, read back through Prefect's client API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return runs


def test_phase_two_checkpoints_hold_the_counterparts_classifier(tmp_path):
    summary, _ = train(tmp_path, "barrier", **{"runner.keep_round_files": True, "runner.workers": 2})

    paths = RunPaths(Path(summary["run_dir"]))
    history = load_server_state(paths.root, 2)["history"]
    # The UI names each task run by step, round (1-based, as the console), client and phase.
    wait_for_task_run_records(summary["prefect_flow_run_id"], summary["prefect_task_runs"])
    names = sorted(run.name for run in task_runs(summary["prefect_flow_run_id"]))
    expected = [f"local-train r{record['round'] + 1} c{client} p{phase}"
                for record in history for client in record["selected"] for phase in (1, 2)]
    assert [name for name in names if name.startswith("local-train")] == sorted(expected)
    steps = ("select", "match", "exchange", "aggregate", "evaluate", "commit")
    assert [name for name in names if not name.startswith("local-train")] == sorted(
        ["prepare", *(f"{step} r{round_number}" for step in steps for round_number in (1, 2))])
    checked = 0
    for record in history:
        for first, second in record["algorithm"]["pairs"]:
            for receiver, donor in ((first, second), (second, first)):
                phase_two = load_checkpoint(paths.exchanged_checkpoint(record["round"], receiver))["model"]
                donor_swap = load_checkpoint(paths.swap_checkpoint(record["round"], donor))["model"]
                own_swap = load_checkpoint(paths.swap_checkpoint(record["round"], receiver))["model"]
                assert torch.equal(phase_two["classifier.weight"], donor_swap["classifier.weight"])
                assert torch.equal(phase_two["classifier.bias"], donor_swap["classifier.bias"])
                assert torch.equal(phase_two["backbone.0.weight"], own_swap["backbone.0.weight"])
                checked += 1
    assert checked == 8


def test_a_run_gives_the_process_its_torch_thread_count_back(tmp_path):
    """A run trains on its runner's threads per worker and then restores the process's own count, so
    that what runs next in the process (another in-process run, a test's) is not trained on it."""
    before = torch.get_num_threads()
    train(tmp_path, "threads-back", **{"runner.kind": "sequential", "runner.threads_per_worker": before + 1,
                                       "federation.rounds": 1})
    assert torch.get_num_threads() == before


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


def test_serve_builds_a_scheduled_deployment_of_the_training_flow():
    from flows.orchestration.deploy import training_deployment

    deployment = training_deployment(SMOKE, "nightly", cron="0 2 * * *", overrides={"federation.rounds": 3},
                                     timezone="Europe/Berlin")
    on_demand = training_deployment(SMOKE, "by-hand")

    assert deployment.name == "nightly" and deployment.flow_name == "fedcme-train"
    assert [(item.schedule.cron, item.schedule.timezone) for item in deployment.schedules] == [
        ("0 2 * * *", "Europe/Berlin")]
    # The config validated once, when the deployment is built: its plain values, which each run's
    # parameter check (the deployment's parameter schema, then train_flow's) turns back into it.
    config = load_config(SMOKE, overrides={"federation.rounds": 3})
    assert deployment.parameters["config"] == config.model_dump(mode="json")
    assert "config_file" not in deployment.parameters and "overrides" not in deployment.parameters
    # A scheduled run trains an experiment of its own; an on-demand deployment trains the one it names.
    assert deployment.parameters["dated"] is True and on_demand.parameters["dated"] is False


@pytest.mark.parametrize("option, value, message", [
    ("--timezone", "Mars/Base", "fedcme: error: --timezone 'Mars/Base': not an IANA time zone name (e.g. Europe/Berlin)"),
    ("--cron", "0 99 * * *", "fedcme: error: --cron '0 99 * * *': not a cron expression (e.g. \"0 2 * * *\")"),
])
def test_serve_names_a_bad_schedule_in_one_line(option, value, message):
    arguments = ["serve", "--config", SMOKE, "--experiment", "nightly", "--cron", "0 2 * * *", option, value]
    result = subprocess.run([sys.executable, "-m", "flows.cli", *arguments], capture_output=True, text=True, timeout=120)

    assert result.returncode == 2 and result.stderr.strip() == message


def test_every_scheduled_run_is_an_experiment_of_its_own_named_in_the_ui(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = load_config(SMOKE, overrides={"federation.rounds": 1})
    options = {"runs_dir": str(tmp_path / "runs"), "tracking_uri": uri, "dated": True}
    first = run_training(config, "nightly", **options)
    time.sleep(1.1)  # the next trigger, a second later
    second = run_training(config, "nightly", **options)

    names = [Path(summary["run_dir"]).name for summary in (first, second)]
    assert names[0] != names[1] and all(re.fullmatch(r"nightly-\d{8}-\d{6}", name) for name in names)
    assert [flow_run(summary["prefect_flow_run_id"]).name for summary in (first, second)] == names
    assert first["rounds"] == second["rounds"] == 1  # each trained its own round; neither resumed the other


def test_an_extended_run_has_one_current_model_and_tags_the_one_it_supersedes(tmp_path):
    first, client = train(tmp_path, "extended", **{"federation.rounds": 1})
    extended, _ = train(tmp_path, "extended", **{"federation.rounds": 2})

    run = client.get_run(extended["mlflow_run_id"])
    assert first["mlflow_run_id"] == extended["mlflow_run_id"]
    models = client.search_logged_models([run.info.experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'")
    by_rounds = {model.tags["fedcme.rounds"]: model for model in models}
    assert sorted(by_rounds) == ["1", "2"]
    assert by_rounds["2"].tags["fedcme.current"] == "true"
    assert by_rounds["1"].tags["fedcme.current"] == "false"
    assert by_rounds["1"].tags["fedcme.superseded_by"] == by_rounds["2"].model_id
    assert run.data.tags["model_uri"] == extended["model_uri"] == by_rounds["2"].model_uri
    # One final accuracy (the mean of the last 5 rounds), logged again at step 0 when the run is extended.
    accuracy = [m.value for m in client.get_metric_history(run.info.run_id, "eval/test_accuracy")]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "final_accuracy")] == [0, 0]
    assert run.data.metrics["final_accuracy"] == pytest.approx(sum(accuracy) / 2) == extended["final_accuracy"]


def test_fedcme_train_resumes_on_another_device_only_with_allow_device_change(tmp_path, capsys):
    """A resume on another device is refused in one line naming --allow-device-change, before any flow or
    MLflow run is opened; with the flag, the run records this device's layout and precision and goes on."""
    from flows.cli import main

    runs, uri = tmp_path / "runs", f"sqlite:///{tmp_path / 'mlflow.db'}"
    command = ["train", "--config", SMOKE, "--experiment", "moved", "--runs-dir", str(runs), "--tracking-uri", uri,
               "--set", "runner.kind=sequential"]
    assert main([*command, "--set", "federation.rounds=1"]) == 0
    paths = RunPaths(runs / "moved")
    record = json.loads(paths.compute.read_text())
    record["device"] = {"type": "cuda", "name": "NVIDIA H100 80GB HBM3"}  # as if round 1 had trained on a GPU
    paths.compute.write_text(json.dumps(record))
    capsys.readouterr()

    assert main(command) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "trained on cuda (NVIDIA H100 80GB HBM3)" in error[0], error
    assert "--allow-device-change" in error[0] and not paths.server_state(2).exists()
    assert len(MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("fedcme-smoke").experiment_id])) == 1

    assert main([*command, "--allow-device-change"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["rounds"] == 2 and summary["compute"]["device"]["type"] == "cpu"
    assert json.loads(paths.compute.read_text())["device"]["type"] == "cpu"  # calibrated anew for the CPU
