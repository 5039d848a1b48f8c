"""The grid run's parent MLflow run (flows.tracking.grid) against a real sqlite store, read back through
MLflow's own client: one parent however many stages look for it at once, its children, the report's
artifacts and per-method summary (a table and tags, no metric: MLflow's chart view opens on the children),
and a tracking failure that stops nothing. The real `dvc repro` of the
smoke grid checks the same through the stages (tests/test_pipeline.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from fedcme_core.config.params import load_params
from flows.tracking import grid as tracking_grid
from flows.tracking.names import experiment_name
from flows.tracking.run import RunTracker
from flows.tracking.grid import (PARENT_TAG, close_grid_parent, grid_key, method_table, open_grid_parent,
                                 parent_metrics)

from .conftest import REPO_ROOT
from .test_records import record

SMOKE = REPO_ROOT / "configs" / "params-smoke.yaml"
PARENTS = "tags.run_kind = 'grid' and tags.grid = 'smoke'"


def experiment_id(client: MlflowClient) -> str:
    return client.get_experiment_by_name("fedcme").experiment_id


OPEN_AT_ONCE = """
import sys, time
from pathlib import Path
from fedcme_core.config.params import load_params
from flows.tracking.grid import open_grid_parent
folder, name, params_file = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
params = load_params(params_file)
(folder / name).touch()
while not (folder / "go").exists():  # every process past its imports, then all at once
    time.sleep(0.005)
print(open_grid_parent(params, params_file, f"sqlite:///{folder / 'mlflow.db'}"))
"""


@pytest.mark.slow
def test_stages_that_look_for_the_parent_at_once_share_one(tmp_path):
    names = ["s0", "s1", "s2"]
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    processes = [subprocess.Popen([sys.executable, "-c", OPEN_AT_ONCE, str(tmp_path), name, str(SMOKE)], cwd=REPO_ROOT,
                                  env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for name in names]
    while not all((tmp_path / name).exists() for name in names):
        assert all(process.poll() is None for process in processes), [p.stderr.read()[-2000:] for p in processes]
        time.sleep(0.05)
    (tmp_path / "go").touch()
    outputs = [process.communicate(timeout=300) for process in processes]

    assert [process.returncode for process in processes] == [0] * 3, [error[-2000:] for _, error in outputs]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (parent,) = client.search_runs([experiment_id(client)], PARENTS)
    assert {output.strip() for output, _ in outputs} == {parent.info.run_id}
    assert parent.info.status == "RUNNING"
    params = load_params(SMOKE)
    assert parent.data.tags["grid_key"] == grid_key(params, parent.data.tags["commit"])
    assert parent.data.tags["params_file"] == str(SMOKE)


def test_the_report_closes_the_parent_with_its_files_summary_table_and_exactly_the_grids_runs_as_children(
        tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    params = load_params(SMOKE)
    parent = open_grid_parent(params, SMOKE, uri)
    cells = list(params.all_cells())
    runs_dir = tmp_path / "runs"
    trackers = {}
    for index, cell in enumerate(cells[:2]):  # the first nested by its stage, the second (no parent found) adopted
        experiment = experiment_name(*cell)
        tags = {"experiment": experiment, "grid": "smoke", **({PARENT_TAG: parent} if index == 0 else {})}
        trackers[experiment] = RunTracker.open(uri, "fedcme", experiment, runs_dir / experiment, params={}, tags=tags)
        trackers[experiment].sync([record(0, test_accuracy=0.2).to_dict(), record(1, test_accuracy=0.4).to_dict()])
    stale = RunTracker.open(uri, "fedcme", "stale", tmp_path / "stale", params={}, tags={PARENT_TAG: parent})
    reports = tmp_path / "reports"
    (reports / "figures").mkdir(parents=True)
    (reports / "results.md").write_text("# results\n")
    (reports / "figures" / "accuracy.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    files = {reports / "results.md": "reports", reports / "figures" / "accuracy.png": "reports/figures"}
    metrics = {"fedavg": {"final_accuracy": 0.7059200000000001, "best_accuracy": 0.75, "seeds": 2.0,
                          "final_accuracy_std": 0.01},
               "fedcme-mu001": {"final_accuracy": 0.7, "best_accuracy": 0.8, "seeds": 1.0, "final_accuracy_std": None}}

    closed = close_grid_parent(params, SMOKE, report_files=files, metrics=metrics, runs_dir=runs_dir, tracking_uri=uri)
    again = close_grid_parent(params, SMOKE, report_files=files, metrics=metrics, runs_dir=runs_dir, tracking_uri=uri)

    client = MlflowClient(uri)
    (found,) = client.search_runs([experiment_id(client)], PARENTS)  # the second report found the same parent
    assert closed == again == parent == found.info.run_id
    assert found.info.status == "FINISHED"
    assert found.data.metrics == {}  # the chart view draws no one-bar chart of the parent's
    assert json.loads(found.data.tags["mlflow.loggedArtifacts"]) == [{"path": "reports/methods.json", "type": "table"}]
    assert found.data.tags["experiments"] == "2"
    assert found.data.tags["summary/fedavg"] == "FedAvg: final 70.59 ± 1.00 % (2 seeds), best 75.00 %"
    assert found.data.tags["summary/fedcme-mu001"] == "FedCME(0.01): final 70.00 % (1 seed), best 80.00 %"
    assert [item.path for item in client.list_artifacts(parent, "reports")] == [
        "reports/figures", "reports/methods.json", "reports/results.md"]
    table = json.loads(Path(client.download_artifacts(parent, "reports/methods.json", str(tmp_path))).read_text())
    assert table["columns"] == ["method", "label", "seeds", "final_accuracy", "final_accuracy_std", "best_accuracy",
                                "final (%)"]
    assert table["data"] == [["fedavg", "FedAvg", 2, 0.70592, 0.01, 0.75, "70.59 ± 1.00"],
                             ["fedcme-mu001", "FedCME(0.01)", 1, 0.7, None, 0.8, "70.00"]]
    assert [item.path for item in client.list_artifacts(parent, "reports/figures")] == ["reports/figures/accuracy.png"]
    children = client.search_runs([experiment_id(client)], f"tags.{PARENT_TAG} = '{parent}'")
    assert sorted(child.info.run_id for child in children) == sorted(t.run_id for t in trackers.values())
    assert all(child.data.metrics["eval/test_accuracy"] == pytest.approx(0.4) for child in children)
    assert PARENT_TAG not in client.get_run(stale.run_id).data.tags  # not the grid's: let go
    assert capsys.readouterr().out.count("MLflow: the grid's parent run 'grid smoke @ ") == 2


def test_the_summary_figures_are_fractions_per_method_with_the_std_over_seeds():
    summaries = {"fedavg": {"final_accuracy": 0.5, "best_accuracy": 0.6, "accuracy_at": {"2/5": 0.3}},
                 "fedcme": {"final_accuracy": 0.7, "best_accuracy": 0.8}}
    entries = [{"method_name": "fedavg", "seed": seed, "setting": setting, "final_accuracy": value}
               for seed, setting, value in [(0, "a", 0.4), (0, "b", 0.6), (1, "a", 0.5), (1, "b", 0.7)]]
    entries.append({"method_name": "fedcme", "seed": 0, "setting": "a", "final_accuracy": 0.7})

    figures = parent_metrics(summaries, entries)

    # fedavg: per-seed means 0.5 and 0.6 (over the settings), their sample std; fedcme: one seed, no std.
    assert figures == {"fedavg": {"final_accuracy": 0.5, "best_accuracy": 0.6, "seeds": 2.0,
                                  "final_accuracy_std": pytest.approx(0.0707107)},
                       "fedcme": {"final_accuracy": 0.7, "best_accuracy": 0.8, "seeds": 1.0, "final_accuracy_std": None}}
    table = method_table(figures, {"fedavg": "FedAvg"})
    assert table["final (%)"] == ["50.00 ± 7.07", "70.00"] and table["label"] == ["FedAvg", "fedcme"]
    assert table["final_accuracy_std"] == [0.070711, None]  # rounded to 6 decimals


def test_a_tracking_failure_is_one_warning_line_and_no_parent(tmp_path, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise MlflowException("the store said no\nand more")

    monkeypatch.setattr(tracking_grid, "find_or_create_parent", broken)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    params = load_params(SMOKE)

    assert open_grid_parent(params, SMOKE, uri) is None
    assert close_grid_parent(params, SMOKE, report_files={}, metrics={}, tracking_uri=uri) is None

    warnings = [line for line in capsys.readouterr().err.splitlines() if "mlflow.store.db" not in line]
    assert warnings == [
        "warning: MLflow grid parent run: opening it failed (the store said no); the stage goes on without it",
        "warning: MLflow grid parent run: logging the report failed (the store said no); the stage goes on without it",
    ]
