"""How a run reads in MLflow's and Prefect's UIs (issue #54): run names that show the seed, a logged model
named by its experiment, params without another source's settings, summary figures without float
noise, the accuracy curve's ticks and title, the flow run's tags and its summary's link."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedcme_core.config.params import load_params
from fedcme_core.config.schema import config_from_dict
from flows.tracking.names import experiment_name, flow_run_tags, model_name, run_name
from flows.tracking.views import accuracy_figure, rounded, run_params, summary_markdown

from .conftest import REPO_ROOT

GRID_FILES = sorted((REPO_ROOT / "configs").glob("params-*.yaml")) + [REPO_ROOT / "params.yaml"]


@pytest.mark.parametrize("params_file", GRID_FILES, ids=lambda path: Path(path).name)
def test_every_grid_cell_has_a_run_name_of_its_own_that_opens_with_its_seed(params_file):
    params = load_params(params_file)
    names = {}
    for cell in params.all_cells():
        config = params.cell_config(*cell)
        names[experiment_name(*cell)] = name = run_name(config, params.label(cell[0]))
        assert name.startswith(f"s{config.seed} {params.label(cell[0])} · ")
    assert len(set(names.values())) == len(names)


def test_a_run_name_is_seed_label_then_setting():
    config = config_from_dict({"seed": 1, "partition": {"alpha": 0.1}, "algorithm": {"name": "fedcme", "mu": 0.01},
                               "federation": {"num_clients": 50, "clients_per_round": 20}})
    assert run_name(config, "FedCME(0.01) class-count weights w/o exchange") == (
        "s1 FedCME(0.01) class-count weights w/o exchange · fmnist α=0.1 K50 M20")


@pytest.mark.parametrize("experiment, name", [
    ("fmnist-a1.0-k10m10-fedcme-mu001-s0", "fmnist-a1_0-k10m10-fedcme-mu001-s0"),
    ("nightly-20261202-020000", "nightly-20261202-020000"),
    ("a/b:c%d'e\"f", "a_b_c_d_e_f"),
])
def test_the_logged_model_is_named_by_its_experiment_in_the_characters_mlflow_allows(experiment, name):
    from mlflow.utils.validation import _validate_logged_model_name

    assert model_name(experiment) == name
    _validate_logged_model_name(name)  # MLflow's own check of the name log_model is given


def test_params_leave_out_the_synthetic_sources_settings_unless_the_run_is_on_synthetic_data():
    real = config_from_dict({"data": {"dataset": "fmnist"}})
    synthetic = config_from_dict({"data": {"dataset": "synthetic"}})

    assert not [key for key in run_params(real) if key.startswith("data.synthetic.")]
    assert set(real.flat()) - set(run_params(real)) == {"data.synthetic.num_train", "data.synthetic.num_test",
                                                        "data.synthetic.shape", "data.synthetic.noise"}
    assert run_params(synthetic) == synthetic.flat()


def test_a_summary_figure_is_rounded_to_six_decimals():
    assert rounded(0.7059200000000001) == 0.70592
    assert rounded(0.12345649) == 0.123456 and rounded(1) == 1.0


def test_the_flow_runs_tags_name_a_short_commit_and_tell_fedcme_variants_apart():
    params = load_params(REPO_ROOT / "configs" / "params-smoke.yaml")
    commit = "0123456789abcdef0123456789abcdef01234567"
    tags = {method: flow_run_tags(params.cell_config(method, *cell[1:]), commit, "smoke", params.label(method))
            for cell in [next(iter(params.all_cells()))] for method in ("fedcme-mu001", "fedcme-no-exchange")}

    assert tags["fedcme-mu001"] == ["commit:0123456789ab", "method:FedCME(0.01)", "algorithm:fedcme", "seed:0",
                                    "grid:smoke"]
    assert tags["fedcme-no-exchange"][1:3] == ["method:FedCME w/o exchange", "algorithm:fedcme"]
    assert flow_run_tags(params.cell_config(*next(iter(params.all_cells()))), "unknown")[0] == "commit:unknown"


def test_the_training_summary_links_the_mlflow_run_to_its_page():
    figures = {"final_accuracy": 0.5, "best_accuracy": 0.6, "best_round": 2, "last_accuracy": 0.55, "rounds": 2}
    url = "http://127.0.0.1:5000/#/experiments/1/runs/abc"

    assert "| MLflow run | [abc](http://127.0.0.1:5000/#/experiments/1/runs/abc) |" in summary_markdown(
        "cell", "FedAvg", figures, "abc", url)
    assert "| MLflow run | not tracked |" in summary_markdown("cell", "FedAvg", figures, None)


@pytest.mark.parametrize("rounds", [2, 5, 10])
def test_the_accuracy_curve_ticks_whole_rounds_only_and_is_titled_by_the_run(rounds):
    import matplotlib.pyplot as plt

    history = [{"round": index, "test_accuracy": 0.1 * index} for index in range(rounds)]
    figure = accuracy_figure(history, "eval/test_accuracy", "s0 FedAvg · fmnist α=1.0 K10 M10")
    try:
        axes = figure.axes[0]
        figure.canvas.draw()
        low, high = axes.get_xlim()
        ticks = [tick for tick in axes.get_xticks() if low <= tick <= high]
        assert ticks and all(float(tick).is_integer() for tick in ticks), ticks
        assert axes.get_title() == "s0 FedAvg · fmnist α=1.0 K10 M10"
    finally:
        plt.close(figure)
