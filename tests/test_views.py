"""What a researcher sees of a training run, read through the tools' own clients: MLflow's
search_runs, get_run, artifacts and registry; Prefect's read_flow_run and artifacts."""

from __future__ import annotations

import subprocess

import pytest
from mlflow.tracking import MlflowClient

from fedcme_core.config import load_config
from fedcme_core.config.schema import ConfigError, config_from_dict
from flows.tracking.names import method_label, mlflow_experiment_for, run_name
from flows.orchestration.train import run_training
from flows.tracking.views import git_commit, mlflow_run_url, prefect_flow_run_url

from .conftest import REPO_ROOT

SMOKE = str(REPO_ROOT / "configs" / "smoke.yaml")


def prefect_views(flow_run_id: str):
    """(the flow run, {artifact key: artifact}) as Prefect's UI shows them."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run_id)
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    return run, {artifact.key: artifact for artifact in artifacts}


@pytest.mark.slow
def test_a_grid_cell_is_found_by_its_tags_with_its_summary_figure_system_metrics_and_registered_model(
        tmp_path, prefect_server):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    summary = run_training(load_config(SMOKE, overrides={"tracking.system_metrics_interval": 1.0}), "views",
                           runs_dir=str(tmp_path / "runs"), tracking_uri=uri, method_label="FedCME (ours)",
                           grid="paper")
    client = MlflowClient(tracking_uri=uri)

    experiment = client.get_experiment_by_name("fedcme-smoke")  # synthetic data: apart from the grids' runs
    (run,) = client.search_runs([experiment.experiment_id],
                                "tags.method_label = 'FedCME (ours)' and tags.grid = 'paper' and tags.seed = '0'")
    assert run.info.run_id == summary["mlflow_run_id"]
    assert run.info.run_name == "s0 FedCME (ours) · synthetic α=0.5 K8 M4"
    assert run.data.tags["method"] == "fedcme" and run.data.tags["setting"] == "synthetic α=0.5 K8 M4"
    accuracy = [m.value for m in client.get_metric_history(run.info.run_id, "eval/test_accuracy")]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == [1, 2]
    assert {"eval/test_loss", "time/round_seconds", "clients/aggregated"} <= set(run.data.metrics)
    assert "test_accuracy" not in run.data.metrics
    assert run.data.metrics["final_accuracy"] == round(sum(accuracy) / 2, 6) == round(summary["final_accuracy"], 6)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "final_accuracy")] == [0]  # a bar per run
    assert [item.path for item in client.list_artifacts(run.info.run_id, "figures")] == ["figures/accuracy.png"]
    (model,) = client.search_logged_models([experiment.experiment_id], f"source_run_id = '{run.info.run_id}'")
    assert model.name == "views"  # the experiment's, not "model"
    assert run.data.params["data.synthetic.num_train"]  # synthetic data: its source's settings are params
    assert any(key.startswith("system/cpu_utilization") for key in run.data.metrics), sorted(run.data.metrics)
    assert run.data.tags["prefect_flow_run_id"] == summary["prefect_flow_run_id"]
    assert run.data.tags["prefect_flow_run"].endswith(summary["prefect_flow_run_id"])

    flow_run, artifacts = prefect_views(summary["prefect_flow_run_id"])
    # The commit read as the run started (a commit landing during the test moves HEAD on, not the run's).
    commit = run.data.tags["git_commit"]
    head = git_commit(REPO_ROOT)  # "unknown" outside a git checkout
    assert commit == head == "unknown" or subprocess.run(["git", "merge-base", "--is-ancestor", commit, head],
                                                         cwd=REPO_ROOT).returncode == 0
    assert {f"commit:{commit[:12]}", "method:FedCME (ours)", "algorithm:fedcme", "seed:0", "grid:paper"} <= set(
        flow_run.tags)
    assert flow_run.flow_version == commit == run.data.tags["mlflow.source.git.commit"]
    # Prefect stores a link artifact as the markdown of its link: the run's page in MLflow's UI.
    url = mlflow_run_url(uri, experiment.experiment_id, run.info.run_id)
    assert url.endswith(f"/#/experiments/{experiment.experiment_id}/runs/{run.info.run_id}")
    assert artifacts["mlflow-run"].data == f"[MLflow run {run.info.run_id}]({url})"
    assert artifacts["training-summary"].type == "markdown"
    assert f"{summary['final_accuracy']:.4f}" in artifacts["training-summary"].data
    assert f"| MLflow run | [{run.info.run_id}]({url}) |" in artifacts["training-summary"].data


@pytest.mark.slow
def test_without_system_metrics_and_with_a_registered_model(tmp_path, prefect_server):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    overrides = {"tracking.system_metrics": False, "tracking.register_model": "fedcme-smoke-model",
                 "federation.rounds": 1}
    summary = run_training(load_config(SMOKE, overrides=overrides), "plain", runs_dir=str(tmp_path / "runs"),
                           tracking_uri=uri)
    client = MlflowClient(tracking_uri=uri)

    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.run_name.startswith("s0 FedCME(0.01) · ") and run.data.tags["grid"] == "none"
    assert not [key for key in run.data.metrics if key.startswith("system/")]
    (version,) = client.search_model_versions("name = 'fedcme-smoke-model'")
    assert str(version.version) == summary["registered_model_version"] == "1" and version.run_id == run.info.run_id
    assert version.tags["method"] == "fedcme" and version.tags["seed"] == "0"
    assert float(version.tags["final_accuracy"]) == pytest.approx(run.data.metrics["final_accuracy"])


@pytest.mark.parametrize("algorithm, label", [({"name": "fedcme", "mu": 0.01}, "FedCME(0.01)"),
                                              ({"name": "fedprox", "mu": 0.001}, "FedProx(0.001)"),
                                              ({"name": "fedrs", "alpha": 0.5}, "FedRS(0.5)"),
                                              ({"name": "fedavg"}, "FedAvg")])
def test_a_plain_run_is_named_by_its_method_label_and_seed(algorithm, label):
    config = config_from_dict({"seed": 2, "partition": {"alpha": 1.0},
                               "federation": {"num_clients": 10, "clients_per_round": 10}, "algorithm": algorithm})
    assert method_label(config) == label
    assert run_name(config) == f"s2 {label} · fmnist α=1.0 K10 M10"
    assert mlflow_experiment_for(config) == "fedcme" and mlflow_experiment_for(config, scheduled=True) == "fedcme-scheduled"


def test_a_bad_tracking_section_is_one_line():
    with pytest.raises(ConfigError) as raised:
        config_from_dict({"tracking": {"system_metrics": "sometimes"}})
    assert str(raised.value).splitlines() == ["config: tracking.system_metrics: Input should be a valid boolean, "
                                              "unable to interpret input"]


def test_a_bad_register_model_name_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    from flows.cli import main

    monkeypatch.chdir(tmp_path)
    status = main(["train", "--config", SMOKE, "--experiment", "named", "--register-model", "/etc/model"])

    error = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(error) == 1, error
    assert error[0].startswith("fedcme: error: ") and "tracking.register_model" in error[0], error
    assert list(tmp_path.iterdir()) == []


def test_a_temporary_servers_flow_run_links_to_the_ui_that_serves_its_records(monkeypatch):
    # The temporary server's port dies with its command; `prefect server start` serves PREFECT_HOME at 4200.
    monkeypatch.delenv("FEDCME_PREFECT_UI_URL", raising=False)
    assert prefect_flow_run_url("abc", temporary=True) == "http://127.0.0.1:4200/runs/flow-run/abc"
    monkeypatch.setenv("FEDCME_PREFECT_UI_URL", "http://lab:4300/")
    assert prefect_flow_run_url("abc", temporary=True) == "http://lab:4300/runs/flow-run/abc"


def test_one_object_names_tags_and_links_a_run(monkeypatch):
    from flows.tracking.views import RunViews

    monkeypatch.delenv("FEDCME_PREFECT_UI_URL", raising=False)
    config = load_config(SMOKE)
    views = RunViews.start(config, "cell", label="FedCME (ours)", grid="paper", parent_run_id="p1")
    plain = RunViews.start(config, "plain")

    assert (views.label, plain.label) == ("FedCME (ours)", "FedCME(0.01)")
    assert (views.mlflow_experiment, RunViews.start(config, "n", scheduled=True).mlflow_experiment) == (
        "fedcme-smoke", "fedcme-scheduled")
    assert views.commit == git_commit(REPO_ROOT) and views.run_name(config).startswith("s0 FedCME (ours) · ")
    assert views.flow_run_tags(config) == [f"commit:{views.commit[:12]}", "method:FedCME (ours)", "algorithm:fedcme",
                                           "seed:0", "grid:paper"]
    assert plain.flow_run_tags(config)[1] == "method:FedCME(0.01)"
    tags = views.mlflow_tags(config, "abc", temporary_prefect=True)
    assert tags["mlflow.parentRunId"] == "p1" and tags["experiment"] == "cell" and tags["grid"] == "paper"
    assert tags["prefect_flow_run"] == "http://127.0.0.1:4200/runs/flow-run/abc" and tags["git_commit"] == views.commit
    assert "mlflow.parentRunId" not in plain.mlflow_tags(config, None) and plain.mlflow_tags(config, None)["grid"] == "none"
