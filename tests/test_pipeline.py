"""The DVC pipeline for real: `dvc repro` of the smoke grid in a temporary copy of the repository."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from .conftest import REPO_ROOT
from .helpers import dvc_checkout, run_checked

# Real `dvc repro` runs of the smoke grid on Fashion-MNIST under one temporary Prefect server.
pytestmark = pytest.mark.slow

EXPERIMENTS = ["fmnist-a0.5-k100m2-fedavg-s0", "fmnist-a0.5-k100m2-fedcme-mu001-s0", "fmnist-a0.5-k100m2-scaffold-s0",
               "fmnist-a0.5-k100m2-fedcme-no-exchange-s0"]
PARTITION = Path("data/partitions/fmnist-a0.5-k100-s0")
METHODS = [name.split("-k100m2-")[1].removesuffix("-s0") for name in EXPERIMENTS]


def stages_run(output: str) -> list[str]:
    return re.findall(r"Running stage '([^']+)'", output)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, mirror, prefect_server):
    """A copy of the repository (git init, dvc init) whose params.yaml is the smoke grid, reproduced once."""
    workdir = tmp_path_factory.mktemp("repo")
    environment = dvc_checkout(REPO_ROOT, workdir, REPO_ROOT / "configs" / "params-smoke.yaml", mirror, {
        **os.environ, "PREFECT_API_URL": prefect_server, "MLFLOW_TRACKING_URI": f"sqlite:///{workdir / 'mlflow.db'}"})
    shutil.copy2(REPO_ROOT / ".dvc" / "config", workdir / ".dvc" / "config")
    shutil.copytree(REPO_ROOT / ".dvc" / "plots", workdir / ".dvc" / "plots")  # `dvc init -f` left none
    run_checked(["git", "add", "-A"], workdir, environment)
    run_checked(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"], workdir, environment)
    first = run_checked(["dvc", "repro"], workdir, environment)
    return workdir, environment, first


def test_repro_creates_every_declared_output(pipeline):
    workdir, _, output = pipeline

    assert {"prepare@fmnist", "report"} <= set(stages_run(output))
    expected = [
        "data/prepared/fmnist/meta.json",
        "data/prepared/fmnist/x_train.npy",
        PARTITION / "partition.npz",
        PARTITION / "class_counts.json",
        PARTITION / "heatmap.png",
        "reports/results.md",
        "reports/figures/accuracy.png",
        "reports/figures/accuracy-ablation.png",  # the smoke grid has an ablation run
        "reports/results.csv",
        *[f"models/{name}.pt" for name in EXPERIMENTS],
        *[f"reports/summary/{method}.json" for method in METHODS],
        "reports/curves/fmnist-a0.5-k100m2.csv",
        "reports/curves/fmnist-a0.5-k100m2-ablation.csv",
        *[f"metrics/{name}.json" for name in EXPERIMENTS],
        *[f"metrics/about/{name}.json" for name in EXPERIMENTS],
        *[f"metrics/{name}.csv" for name in EXPERIMENTS],
        *[f"metrics/matching/{name}.json" for name in EXPERIMENTS],
    ]
    missing = [str(path) for path in expected if not (workdir / path).is_file()]
    assert missing == []
    counts = json.loads((workdir / PARTITION / "class_counts.json").read_text())
    assert sum(counts["sizes"]) == 6000  # the partition covers the params' seeded train_subset
    report = (workdir / "reports" / "results.md").read_text()
    # No placeholder: the matching figure is there exactly when the report has a picture to link.
    assert (workdir / "reports/figures/accuracy-matching.png").is_file() == ("![matching]" in report)
    assert "| FedAvg |" in report and "| FedCME(0.01) |" in report and "FedCME w/o exchange" in report
    assert "| SCAFFOLD |" in report
    # The report stage reads the grid file's methods: the no-exchange run checks the paper's exchange claim.
    assert "| classifier exchange helps | FMNIST α=0.5 K=100 M=2 | FedCME(0.01) − FedCME w/o exchange |" in report
    summary = (workdir / "reports" / "results.csv").read_text().splitlines()
    assert len(summary) == 1 + len(EXPERIMENTS) and all(line.startswith("smoke,") for line in summary[1:])
    assert all(",dirichlet(0.5),0.5,100,2," in line for line in summary[1:])  # what trained each row
    about = json.loads((workdir / "metrics" / "about" / f"{EXPERIMENTS[0]}.json").read_text())
    assert (about["partition"], about["alpha"], about["setting"]) == ("a0.5", 0.5, "FMNIST α=0.5 K=100 M=2")
    # What computed it, in the about record and every row of the summary.
    assert about["device"] == "cpu" and about["compute"].split("+")[1] in ("fp32", "bf16") and about["machine"]
    assert all(line.endswith(f",{about['compute']},cpu,{about['machine']}") for line in summary[1:])
    matching = json.loads((workdir / "metrics" / "matching" / f"{EXPERIMENTS[1]}.json").read_text())
    assert [record["round"] for record in matching["rounds"]] == [1, 2]
    assert len(matching["class_counts"]) == 100 and matching["seed"] == 0


def test_second_repro_does_nothing(pipeline):
    workdir, environment, _ = pipeline

    output = run_checked(["dvc", "repro"], workdir, environment)

    assert stages_run(output) == []


GRID_PARENTS = "tags.run_kind = 'grid' and tags.grid = 'smoke'"


def grid_runs(workdir: Path) -> tuple[MlflowClient, str, list]:
    """MLflow's client of the checkout's store, the grid's MLflow experiment and its parent runs, oldest first."""
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    experiment_id = client.get_experiment_by_name("fedcme").experiment_id
    parents = client.search_runs([experiment_id], GRID_PARENTS, order_by=["attributes.start_time ASC"])
    return client, experiment_id, parents


def children_of(client: MlflowClient, experiment_id: str, parent_id: str) -> dict[str, str]:
    """{experiment: run id} of the runs nested under `parent_id` (MLflow's mlflow.parentRunId tag)."""
    return {run.data.tags["experiment"]: run.info.run_id
            for run in client.search_runs([experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'")}


def recorded_runs(workdir: Path) -> dict[str, str]:
    """{experiment: MLflow run id} as the grid's run directories record them."""
    return {name: json.loads((workdir / "runs" / name / "mlflow.json").read_text())["run_id"] for name in EXPERIMENTS}


def test_the_grid_run_is_one_mlflow_parent_with_its_experiments_nested_and_the_report(pipeline):
    workdir, environment, output = pipeline

    client, experiment_id, parents = grid_runs(workdir)

    (parent,) = parents  # the second `dvc repro` ran nothing, and made no other
    assert parent.info.status == "FINISHED"
    commit = run_checked(["git", "rev-parse", "HEAD"], workdir, environment).strip()
    assert {key: parent.data.tags.get(key) for key in ("grid", "commit", "params_file")} == {
        "grid": "smoke", "commit": commit, "params_file": "params.yaml"}
    assert f"MLflow: the grid's parent run '{parent.info.run_name}' holds 4 experiment runs: " in output
    children = client.search_runs([experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(child.data.tags["experiment"] for child in children) == sorted(EXPERIMENTS)
    assert {child.info.run_id for child in children} == set(recorded_runs(workdir).values())
    for child in children:  # each experiment's own run, with its grouped per-round metrics
        experiment = child.data.tags["experiment"]
        assert child.info.status == "FINISHED"
        assert [m.step for m in client.get_metric_history(child.info.run_id, "eval/test_accuracy")] == [1, 2]
        assert {"train/loss", "final_accuracy"} <= set(child.data.metrics)
        # The chart view's bar chart: one point per run at step 0, rounded (no float noise).
        (final,) = client.get_metric_history(child.info.run_id, "final_accuracy")
        assert final.step == 0 and final.value == round(final.value, 6)
        assert child.info.run_name.startswith("s0 ") and child.info.run_name.endswith(" · fmnist α=0.5 K100 M2")
        assert not [key for key in child.data.params if key.startswith("data.synthetic.")]  # fmnist: none
        (model,) = client.search_logged_models([experiment_id], f"source_run_id = '{child.info.run_id}'")
        assert model.name == experiment.replace(".", "_")
        matching = [item.path for item in client.list_artifacts(child.info.run_id, "matching")]
        if experiment in (EXPERIMENTS[0], EXPERIMENTS[2]):  # FedAvg, SCAFFOLD: no matching, no round files
            assert matching == []
        elif experiment == EXPERIMENTS[1]:
            assert matching == ["matching/round-0001.json", "matching/round-0002.json"]
    # The report: the table, the CSV, the figures and the summary files as artifacts of the parent.
    assert [item.path for item in client.list_artifacts(parent.info.run_id, "reports")] == [
        "reports/figures", "reports/methods.json", "reports/results.csv", "reports/results.md", "reports/summary"]
    figures = [item.path for item in client.list_artifacts(parent.info.run_id, "reports/figures")]
    assert {"reports/figures/accuracy.png", "reports/figures/accuracy-ablation.png"} <= set(figures)
    # The per-method summary: a table and tags of the parent, fractions as the report's summary files hold
    # them (one seed: no std), and no metric, so MLflow's chart view opens on the children's.
    assert parent.data.metrics == {} and parent.data.tags["experiments"] == "4"
    table = json.loads(Path(client.download_artifacts(parent.info.run_id, "reports/methods.json",
                                                      str(workdir / "downloaded"))).read_text())
    rows = {row[0]: dict(zip(table["columns"], row)) for row in table["data"]}
    assert sorted(rows) == sorted(METHODS)
    for method in METHODS:
        summary = json.loads((workdir / "reports" / "summary" / f"{method}.json").read_text())
        assert rows[method]["final_accuracy"] == pytest.approx(summary["final_accuracy"], abs=1e-6)
        assert 0 < rows[method]["final_accuracy"] <= 1 and rows[method]["seeds"] == 1
        assert rows[method]["final_accuracy_std"] is None
        assert parent.data.tags[f"summary/{method}"].startswith(f"{rows[method]['label']}: final ")


def test_check_run_passes_a_finished_grid_and_names_what_is_missing(pipeline):
    workdir, environment, _ = pipeline
    check = [sys.executable, str(REPO_ROOT / "tools" / "check_run.py")]

    passed = subprocess.run(check, cwd=workdir, env=environment, capture_output=True, text=True)
    summary = workdir / "reports" / "results.csv"
    kept = summary.read_bytes()
    summary.write_bytes(kept.rsplit(b"\n", 2)[0] + b"\n")  # one experiment's row lost
    try:
        failed = subprocess.run(check, cwd=workdir, env=environment, capture_output=True, text=True)
    finally:
        summary.write_bytes(kept)

    assert passed.returncode == 0, passed.stderr
    assert "all 4 experiments listed" in passed.stdout
    assert failed.returncode == 1
    assert failed.stderr == "check_run: reports/results.csv: 3 experiment rows, the grid has 4\n"


def test_metrics_params_and_plots_work_offline(pipeline):
    workdir, environment, _ = pipeline

    metrics = run_checked(["dvc", "metrics", "show"], workdir, environment)
    params = run_checked(["dvc", "params", "diff", "--all"], workdir, environment)
    run_checked(["dvc", "plots", "show", "-o", "plots-html"], workdir, environment)

    assert "final_accuracy" in metrics and "reports/summary/fedcme-mu001.json" in metrics
    assert "methods.fedcme-mu001" in params
    page = (workdir / "plots-html" / "index.html").read_text()
    assert "vegaEmbed" in page and not re.search(r"<script[^>]+src=", page)


def flat_values(values, prefix=""):
    """(key, value) of a nested metrics dict, keys dotted as `dvc metrics show` names them."""
    for key, value in values.items():
        yield from flat_values(value, f"{prefix}{key}.") if isinstance(value, dict) else [(f"{prefix}{key}", value)]


def test_metrics_are_numbers_and_the_summary_has_every_method(pipeline):
    workdir, environment, _ = pipeline

    shown = json.loads(run_checked(["dvc", "metrics", "show", "--json"], workdir, environment))
    files = {name: entry["data"] for revision in shown.values() for name, entry in revision["data"].items()}

    summaries = {f"reports/summary/{method}.json" for method in METHODS}
    assert set(files) == {*summaries, *(f"metrics/{name}.json" for name in EXPERIMENTS)}
    assert [(name, key) for name, values in files.items() for key, value in flat_values(values)
            if not isinstance(value, (int, float, type(None)))] == []
    # One unit in one table: fractions in the experiments' files and in the per-method summary rows.
    assert all(0 <= value <= 1 for name, values in files.items() for key, value in flat_values(values)
               if "accuracy" in key and value is not None)
    columns = {key for values in files.values() for key, _ in flat_values(values)}
    # Five columns in all (rounds_to_target is null, so not listed, where no run reached the target).
    assert {"final_accuracy", "final_local_accuracy", "best_accuracy", "accuracy_at.2/5"} <= columns <= {
        "final_accuracy", "final_local_accuracy", "best_accuracy", "accuracy_at.2/5", "rounds_to_target"}
    fedavg = json.loads((workdir / "metrics" / f"{EXPERIMENTS[0]}.json").read_text())["final_accuracy"]
    assert files["reports/summary/fedavg.json"]["final_accuracy"] == pytest.approx(fedavg, abs=1e-6)


def test_dvc_metrics_show_fits_150_columns(pipeline):
    workdir, environment, _ = pipeline

    shown = run_checked(["dvc", "metrics", "show"], workdir, {**environment, "COLUMNS": "150"})

    lines = shown.splitlines()
    assert len(lines) == 1 + len(EXPERIMENTS) + len(METHODS), shown
    assert max(len(line) for line in lines) <= 150, shown


def test_the_plot_overlays_the_methods_of_a_setting_with_integer_rounds_in_percent(pipeline):
    workdir, environment, _ = pipeline

    shown = json.loads(run_checked(["dvc", "plots", "show", "--json"], workdir, environment))["data"]

    (overlay,) = shown["reports/curves/fmnist-a0.5-k100m2.csv"]
    spec = overlay["content"]
    line = spec["spec"]["layer"][1]["encoding"]
    assert spec["spec"]["encoding"]["x"]["axis"]["format"] == "d" and line["color"]["field"] == "method"
    assert line["y"]["title"] == "test accuracy (%)"
    # The legend shows each line's colour and dash (one legend: same field and title), not band-coloured circles.
    assert line["strokeDash"]["legend"] == line["color"]["legend"] and line["color"]["legend"]["symbolType"] == "stroke"
    assert spec["spec"]["layer"][0]["encoding"]["fill"] == {**line["color"], "field": "band", "legend": None}
    values = spec["data"]["values"]
    # The chart's title is the setting in words (a facet header), not the CSV's path.
    assert spec["facet"]["field"] == "setting" and {row["setting"] for row in values} == {"FMNIST α=0.5 K=100 M=2"}
    assert "title" not in spec
    assert sorted({row["method"] for row in values}) == ["FedAvg", "FedCME(0.01)", "SCAFFOLD"]
    assert sorted({row["round"] for row in values}) == ["1", "2"]
    fedavg = [float(row["accuracy"]) for row in values if row["method"] == "FedAvg"]
    history = (workdir / "metrics" / f"{EXPERIMENTS[0]}.csv").read_text().splitlines()
    column = history[0].split(",").index("test_accuracy")
    assert fedavg == pytest.approx([100 * float(line.split(",")[column]) for line in history[1:]], abs=1e-4)
    assert "reports/curves/fmnist-a0.5-k100m2-ablation.csv" in shown
    assert not any(name.startswith("metrics/") for name in shown)  # no chart per experiment


def test_make_compare_fits_a_terminal(pipeline):
    workdir, environment, _ = pipeline
    width = 150
    # As after `make run` in a fresh clone: the commit has no dvc.lock and no results, so every
    # dependency's hash differs from it; and one param changed for the next experiment.
    params = workdir / "params.yaml"
    kept = params.read_text()
    params.write_text(kept.replace("    batch_size: 64\n", "    batch_size: 32\n", 1))  # the next experiment, not run
    try:
        shown = run_checked(["make", "-s", "--no-print-directory", "compare", f"VENV={Path(sys.executable).parent.parent}"],
                    workdir, {**environment, "COLUMNS": str(width)})
    finally:
        params.write_text(kept)

    lines = shown.splitlines()
    # The commit has no results (reports/ is not committed): one line says so instead of a row of "!".
    assert re.match(r"Not shown: (master|main): no results in that commit", lines[0]), shown
    header = lines[1].split()
    # Each method headed by its label (params.yaml's methods.<key>.label), as the report and MLflow name it.
    assert header == ["Experiment", "Created", "FedAvg", "(%)", "FedCME(0.01)", "(%)", "FedCME", "w/o", "exchange", "(%)",
                      "SCAFFOLD", "(%)", "base.training.batch_size"], shown
    assert lines[2].split()[0] == "workspace" and len(lines) == 3, shown
    assert "!" not in shown and max(len(line) for line in lines) <= width, shown


def test_changing_one_method_reruns_only_its_train_stage_and_the_report(pipeline):
    workdir, environment, _ = pipeline
    params = workdir / "params.yaml"
    params.write_text(params.read_text().replace("{name: fedcme, mu: 0.01, label: FedCME(0.01)}",
                                                 "{name: fedcme, mu: 0.05, label: FedCME(0.01)}"))

    output = run_checked(["dvc", "repro"], workdir, environment)

    assert stages_run(output) == ["train@fedcme-mu001-fmnist-a0.5-clients0-0", "report"]


def test_a_published_figure_reruns_only_the_report_which_sets_it_beside_ours(pipeline):
    workdir, environment, _ = pipeline
    params = workdir / "params.yaml"
    params.write_text(params.read_text().replace("  published: []", (
        "  published: [{method: scaffold, dataset: fmnist, partition: a0.5, clients: [100, 2], accuracy: 99.5, "
        "source: a paper}]")))

    output = run_checked(["dvc", "repro"], workdir, environment)

    assert stages_run(output) == ["report"]
    report = (workdir / "reports" / "results.md").read_text(encoding="utf-8")
    row = next(line for line in report.splitlines() if line.startswith("| SCAFFOLD | FMNIST α=0.5 K=100 M=2 |"))
    assert "| 99.50 |" in row and "| no: below by more than" in row and row.endswith("| a paper |")


def test_partition_output_is_byte_identical_across_runs(pipeline):
    workdir, environment, _ = pipeline
    before = {name: (workdir / PARTITION / name).read_bytes() for name in ("partition.npz", "class_counts.json")}

    run_checked(["dvc", "repro", "--force", "--single-item", "partition@fmnist-a0.5-clients0-0"], workdir, environment)

    after = {name: (workdir / PARTITION / name).read_bytes() for name in before}
    assert after == before


@pytest.mark.slow
def test_dvc_exp_run_of_the_same_grid_reuses_its_parent_and_a_changed_grid_has_its_own(pipeline):
    workdir, environment, _ = pipeline
    client, experiment_id, before = grid_runs(workdir)
    runs = recorded_runs(workdir)
    # The earlier tests changed FedCME(0.01)'s mu: another grid run, whose report adopted the runs it reused.
    first, second = before
    assert first.data.tags["grid_key"] != second.data.tags["grid_key"]
    assert children_of(client, experiment_id, second.info.run_id) == runs
    (replaced,) = children_of(client, experiment_id, first.info.run_id).items()
    assert replaced[0] == EXPERIMENTS[1] and replaced[1] != runs[EXPERIMENTS[1]]  # the run with the old mu

    # The same commit and params through `dvc exp run`: a train stage and the report find the same parent.
    output = run_checked(["dvc", "exp", "run", "--force", "--single-item", "train@fedavg-fmnist-a0.5-clients0-0", "report"],
                 workdir, environment)

    assert stages_run(output) == ["train@fedavg-fmnist-a0.5-clients0-0", "report"]
    client, experiment_id, after = grid_runs(workdir)
    assert [parent.info.run_id for parent in after] == [first.info.run_id, second.info.run_id]
    assert client.get_run(second.info.run_id).info.status == "FINISHED"
