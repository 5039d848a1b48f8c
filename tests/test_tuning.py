"""Tuned baselines on a validation split (#56 item 3): the stratified seeded hold-out, the choice by
validation accuracy, the grid file's tune section, and that tuning never reads the test set."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcme_core.config.schema import config_from_dict
from fedcme_core.data.datasets import Dataset, hold_out_validation
from fedcme_core.data.sources import DataError
from fedcme_core.data.validation import class_holdout, validation_split
from fedcme_core.config.sections import TuneSection
from fedcme_core.results.tuning import choose, validation_score
from fedcme_core.rounds.run_record import config_json


# ------------------------------------------------------------------ the split
def test_class_holdout_rounds_half_up():
    assert [class_holdout(count, 0.5) for count in (1, 2, 3, 4)] == [1, 1, 2, 2]
    assert class_holdout(10, 0.25) == 3  # 2.5 -> 3
    assert class_holdout(7, 0.0) == 0


def test_validation_split_is_stratified_and_partitions_the_rows():
    labels = np.array([0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 2])  # 4 / 2 / 6 of classes 0 / 1 / 2
    train, validation = validation_split(labels, 0.5, seed=7)
    assert np.bincount(labels[validation], minlength=3).tolist() == [2, 1, 3]
    assert np.bincount(labels[train], minlength=3).tolist() == [2, 1, 3]
    assert sorted([*train, *validation]) == list(range(12))
    assert list(train) == sorted(train) and list(validation) == sorted(validation)
    assert train.dtype == validation.dtype == np.int64


def test_validation_split_is_seeded():
    labels = np.repeat(np.arange(3), 20)
    first, again, other = (validation_split(labels, 0.3, seed)[1] for seed in (1, 1, 2))
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other)
    assert len(first) == 3 * 6


def test_validation_split_of_zero_holds_out_nothing():
    train, validation = validation_split(np.array([1, 0, 1]), 0.0, seed=0)
    assert train.tolist() == [0, 1, 2] and validation.tolist() == []


@pytest.mark.parametrize("fraction, labels, words", [
    (1.0, [0, 1], "must be in [0, 1)"),
    (-0.1, [0, 1], "must be in [0, 1)"),
    (0.1, [0, 1, 1], "holds out 0"),
])
def test_validation_split_refuses_bad_fractions(fraction, labels, words):
    with pytest.raises(DataError, match=r"data\.validation_fraction") as error:
        validation_split(np.array(labels), fraction, seed=0)
    assert words in str(error.value) and "\n" not in str(error.value)


def tiny_dataset() -> Dataset:
    x_train = torch.arange(8, dtype=torch.float32).view(8, 1, 1, 1)
    y_train = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    x_test = torch.full((3, 1, 1, 1), -1.0)
    return Dataset("tiny", x_train, y_train, x_test, torch.tensor([0, 1, 0]), 2, (0.0,), (1.0,))


def test_hold_out_validation_removes_the_rows_from_training_and_evaluates_on_them():
    dataset = tiny_dataset()
    train, validation = validation_split(dataset.y_train.numpy(), 0.5, seed=4)
    kept = hold_out_validation(dataset, 0.5, seed=4)
    assert kept.x_train.flatten().tolist() == [float(row) for row in train]
    assert torch.equal(kept.x_test, dataset.x_test)  # an ordinary run still evaluates on the test set
    tuning = hold_out_validation(dataset, 0.5, seed=4, evaluate_on="validation")
    assert tuning.x_test.flatten().tolist() == [float(row) for row in validation]
    assert tuning.y_test.tolist() == dataset.y_train[torch.from_numpy(validation)].tolist()
    assert hold_out_validation(dataset, 0.0, seed=4) is dataset


def test_config_json_is_unchanged_at_the_defaults():
    plain = config_json(config_from_dict({}))
    assert "validation_fraction" not in plain and "evaluate_on" not in plain
    explicit = config_json(config_from_dict({"data": {"validation_fraction": 0.0, "evaluate_on": "test"}}))
    assert explicit == plain
    tuned = config_from_dict({"data": {"validation_fraction": 0.2, "evaluate_on": "validation"}})
    assert '"validation_fraction": 0.2' in config_json(tuned)


def test_evaluating_on_validation_needs_a_fraction():
    from fedcme_core.config.files import ConfigError

    with pytest.raises(ConfigError, match=r"^config: data\.evaluate_on: validation needs a data\.validation_fraction"):
        config_from_dict({"data": {"evaluate_on": "validation"}})


# ----------------------------------------------------------------- the choice
def history(*accuracies: float) -> list[dict]:
    return [{"round": index, "test_accuracy": value} for index, value in enumerate(accuracies)]


def test_validation_score_is_the_mean_of_the_last_five_rounds():
    assert validation_score(history(0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6)) == pytest.approx(0.4)  # (.2+.3+.4+.5+.6)/5
    assert validation_score(history(0.2, 0.4)) == pytest.approx(0.3)  # fewer rounds: all of them
    assert validation_score(list(reversed(history(0.0, 1.0, 0.0, 0.0, 0.0, 0.0)))) == pytest.approx(0.2)


def test_choose_takes_the_best_score_and_breaks_ties_by_candidate_order():
    candidates = [{"training.lr": 0.005}, {"training.lr": 0.01}, {"training.lr": 0.05}]
    index, scores = choose(candidates, [history(0.5, 0.6), history(0.7, 0.8), history(0.8, 0.7)])
    assert index == 1 and scores == pytest.approx([0.55, 0.75, 0.75])  # 0.01 and 0.05 tie: 0.01 is given first
    with pytest.raises(ValueError, match="one history each"):
        choose(candidates, [history(0.5)])


def test_candidate_grid_is_the_product_in_order():
    tune = TuneSection(rounds=1, seed=0, validation_fraction=0.1, methods={"m": {"training.lr": [1, 2], "training.momentum": [3, 4]}})
    assert tune.candidates("m") == [
        {"training.lr": 1, "training.momentum": 3}, {"training.lr": 1, "training.momentum": 4},
        {"training.lr": 2, "training.momentum": 3}, {"training.lr": 2, "training.momentum": 4}]


# ------------------------------------------------------- the tune section and the choice's use
def grid_values(tune: dict | None = None, **base: dict) -> dict:
    values = {
        "base": {**SYNTHETIC_BASE, **base},
        "methods": {"fedavg": {"name": "fedavg"}, "fedprox": {"name": "fedprox", "mu": 0.01, "label": "FedProx"}},
        "grid": {"datasets": ["fmnist"], "partitions": ["a0.5"], "clients": [[6, 4]], "seeds": [0],
                 "methods": ["fedavg", "fedprox"]},
    }
    if tune is not None:
        values["tune"] = tune
    return values


SYNTHETIC_BASE = {
    "device": "cpu",
    "data": {"dataset": "fmnist"},
    "partition": {"method": "dirichlet", "alpha": 0.5, "min_size": 5},
    "federation": {"num_clients": 6, "clients_per_round": 4, "rounds": 2},
    "training": {"local_epochs": 1, "batch_size": 32, "channels_last": False, "precision": "fp32"},
    "model": {"name": "fmnist_cnn"},
    "algorithm": {"name": "fedavg"},
    "runner": {"kind": "sequential"},
}
TUNE = {"rounds": 2, "seed": 1, "validation_fraction": 0.25, "methods": {"fedprox": {"training.lr": [0.001, 0.05]}}}


def test_tune_section_gives_the_candidates_and_their_configs():
    from fedcme_core.config.params import params_from_dict

    params = params_from_dict(grid_values({**TUNE, "methods": {"fedprox": {"training.lr": [0.01, 0.05],
                                                                           "algorithm.mu": [0.1]}}}))
    assert params.tune_candidates("fedprox") == [{"training.lr": 0.01, "algorithm.mu": 0.1},
                                                 {"training.lr": 0.05, "algorithm.mu": 0.1}]
    config = params.tune_config("fedprox", params.tune_candidates("fedprox")[1])
    assert (config.training.lr, config.algorithm.mu, config.seed, config.federation.rounds) == (0.05, 0.1, 1, 2)
    assert (config.data.validation_fraction, config.data.evaluate_on) == (0.25, "validation")
    assert params.tune_cell("fedprox") == ("fedprox", "fmnist", "a0.5", 6, 4, 1)
    assert params_from_dict(grid_values()).tune is None  # opt-in


@pytest.mark.parametrize("tune, words", [
    ({**TUNE, "methods": {"moon": {"training.lr": [0.1]}}}, "tune.methods: moon not in grid.methods"),
    ({**TUNE, "methods": {"fedprox": {"seed": [1, 2]}}}, "tune.methods.fedprox.seed: a grid dimension"),
    ({**TUNE, "methods": {"fedprox": {"data.train_subset": [100]}}}, "fedprox.data.train_subset: not a hyper-parameter"),
    ({**TUNE, "methods": {"fedprox": {"algorithm.name": ["fedavg"]}}}, "fedprox.algorithm.name: the method's algorithm"),
    ({**TUNE, "methods": {"fedprox": {"training.lr": []}}}, "fedprox.training.lr: no values"),
    ({**TUNE, "methods": {"fedprox": {"training.lr": [-1.0]}}}, "[tune fedprox]: training.lr"),
    ({**TUNE, "round": 2}, "tune.round: unknown key"),
    ({**TUNE, "validation_fraction": 0}, "tune.validation_fraction"),
])
def test_a_bad_tune_section_is_one_line(tune, words):
    from fedcme_core.config.files import ConfigError
    from fedcme_core.config.params import params_from_dict

    with pytest.raises(ConfigError) as error:
        params_from_dict(grid_values(tune), source="grid.yaml")
    assert words in str(error.value) and "\n" not in str(error.value) and str(error.value).startswith("grid.yaml")


def test_base_holds_out_nothing_in_a_grid_file():
    from fedcme_core.config.files import ConfigError
    from fedcme_core.config.params import params_from_dict

    with pytest.raises(ConfigError, match="base.data.validation_fraction: the grid's train stages"):
        params_from_dict(grid_values(data={"dataset": "fmnist", "validation_fraction": 0.1}))


def test_the_choice_lands_in_the_cell_config(tmp_path):
    import json

    from fedcme_core.config.files import ConfigError
    from fedcme_core.config.params import params_from_dict
    from flows.pipeline.tune import apply_choice, read_choice, tuning_file

    params = params_from_dict(grid_values(TUNE))
    with pytest.raises(ConfigError, match="no tuning record of fedprox"):
        read_choice(params, "fedprox", tmp_path)
    candidates = [{"values": values} for values in params.tune_candidates("fedprox")]
    tuning_file("fedprox", tmp_path).write_text(json.dumps({"candidates": candidates, "choice": {"training.lr": 0.05}}))
    cell = ("fedprox", "fmnist", "a0.5", 6, 4, 0)
    tuned = apply_choice(params.cell_config(*cell), read_choice(params, "fedprox", tmp_path))
    assert tuned.training.lr == 0.05 and tuned.algorithm.mu == 0.01 and tuned.seed == 0
    assert read_choice(params, "fedavg", tmp_path) == {}  # not tuned: trains as written
    assert apply_choice(params.cell_config(*cell), {}) is params.cell_config(*cell)
    stale = params_from_dict(grid_values({**TUNE, "methods": {"fedprox": {"training.lr": [0.1, 0.2]}}}))
    with pytest.raises(ConfigError, match="not those of tune.methods.fedprox"):
        read_choice(stale, "fedprox", tmp_path)


# ------------------------------------------------------- the test set is never read
def prepared_copy(folder, arrays: dict) -> str:
    from fedcme_core.data.prepared import save_prepared

    save_prepared("fmnist", arrays, folder)
    return str(folder)


def test_the_choice_is_the_same_when_the_test_set_is_noise(tmp_path):
    from fedcme_core.config.params import params_from_dict
    from fedcme_core.data.catalog import SourceSettings, SyntheticSpec, read_source
    from flows.pipeline.tune import in_process, tune_method

    arrays = dict(read_source("synthetic", SourceSettings(synthetic=SyntheticSpec(
        num_train=240, num_test=100, seed=3))).arrays)
    rng = np.random.default_rng(0)
    noise = {**arrays, "x_test": rng.normal(size=(37, 1, 28, 28)).astype(np.float32),
             "y_test": rng.integers(0, 10, size=37).astype(np.int64)}
    params = params_from_dict(grid_values(TUNE))
    records = [tune_method(params, "fedprox", in_process(tmp_path / f"runs-{name}"),
                           prepared_dir=prepared_copy(tmp_path / name, data))
               for name, data in (("real", arrays), ("noise", noise))]
    real, noised = records
    assert real["candidates"] == noised["candidates"]  # the same validation curves, score by score
    assert real["chosen"] == noised["chosen"] and real["choice"] == noised["choice"]
    assert [len(candidate["validation_accuracy"]) for candidate in real["candidates"]] == [2, 2]
    assert real["choice"] == params.tune_candidates("fedprox")[real["chosen"]]


def test_no_client_trains_on_the_validation_rows(tmp_path):
    from fedcme_core.config.params import params_from_dict
    from fedcme_core.data.catalog import SourceSettings, SyntheticSpec, read_source
    from fedcme_core.data.partition_file import make_partition
    from fedcme_core.rounds.setup import load_experiment_dataset

    arrays = dict(read_source("synthetic", SourceSettings(synthetic=SyntheticSpec(num_train=240, num_test=100,
                                                                                   seed=3))).arrays)
    params = params_from_dict(grid_values(TUNE))
    config = params.tune_config("fedprox", params.tune_candidates("fedprox")[0],
                                prepared_dir=prepared_copy(tmp_path / "data", arrays))
    dataset = load_experiment_dataset(config.data, config.seed)
    train_rows, validation_rows = validation_split(arrays["y_train"], 0.25, config.seed)
    assert len(dataset.y_train) == len(train_rows) and len(dataset.y_test) == len(validation_rows)
    assert torch.equal(dataset.x_train, torch.from_numpy(arrays["x_train"][train_rows]).sub(
        dataset.mean[0]).div(dataset.std[0]))  # the partitioned training split is the kept rows
    partition = make_partition(dataset.y_train.numpy(), config.partition, config.federation.num_clients, config.seed)
    dealt = np.concatenate([train_rows[client] for client in partition.clients])  # rows of the original training set
    assert len(dealt) == len(train_rows) and not set(dealt.tolist()) & set(validation_rows.tolist())


# ------------------------------------------------------------------ the report
def test_report_gives_the_choice_and_the_candidates_curves(tmp_path):
    import json

    from fedcme_core.config.params import params_from_dict
    from flows.pipeline.tune import tuning_file
    from flows.report.tuning import add_tuning_section

    record = {"method": "fedprox", "tuned": True, "setting": "FMNIST α=0.5 K=6 M=4", "rounds": 2, "seed": 1,
              "validation_fraction": 0.25, "chosen": 1, "choice": {"training.lr": 0.05},
              "candidates": [{"values": {"training.lr": 0.001}, "score": 0.4, "validation_accuracy": [0.3, 0.5]},
                             {"values": {"training.lr": 0.05}, "score": 0.6, "validation_accuracy": [0.5, 0.7]}]}
    (tmp_path / "tuning").mkdir()
    tuning_file("fedprox", tmp_path / "tuning").write_text(json.dumps(record))
    markdown, png = tmp_path / "reports" / "results.md", tmp_path / "reports" / "figures" / "accuracy.png"
    png.parent.mkdir(parents=True)
    markdown.write_text("# Results\n")
    assert add_tuning_section(params_from_dict(grid_values(TUNE)), markdown, png, tmp_path / "tuning")
    text = markdown.read_text()
    assert text.startswith("# Results\n\n## Tuning\n") and "25% of the training set held out" in text
    assert "### FedProx: training.lr=0.05\n" in text and "| **training.lr=0.05** | **60.00** |" in text
    assert "| training.lr=0.001 | 40.00 |" in text and "![tuning](figures/accuracy-tuning.png)" in text
    assert (png.parent / "accuracy-tuning.png").read_bytes().startswith(b"\x89PNG")
    markdown.write_text("# Results\n")  # a grid without a tune section: no section, the old figure goes
    assert not add_tuning_section(params_from_dict(grid_values()), markdown, png, tmp_path / "tuning")
    assert markdown.read_text() == "# Results\n" and not (png.parent / "accuracy-tuning.png").exists()


# ------------------------------------------------------- the stages: the train stage's choice, MLflow
def test_the_train_stage_trains_the_cell_with_the_choice(tmp_path, monkeypatch):
    import argparse
    import json

    from fedcme_core.config.params import params_from_dict
    from flows.pipeline import stages
    from flows.pipeline.tune import tuning_file

    params = params_from_dict(grid_values(TUNE))
    monkeypatch.chdir(tmp_path)
    tuning_file("fedprox").parent.mkdir()
    tuning_file("fedprox").write_text(json.dumps({
        "candidates": [{"values": values} for values in params.tune_candidates("fedprox")],
        "choice": {"training.lr": 0.001}}))
    trained = {}

    def run_training(config, experiment, **_):
        trained[experiment] = config
        raise KeyboardInterrupt  # the config is what this test wants: stop before any training

    for method in ("fedprox", "fedavg"):
        arguments = argparse.Namespace(method=method, dataset="fmnist", partition="a0.5", clients=6, per_round=4,
                                       seed=0, params="grid.yaml", runs_dir=str(tmp_path / "runs"))
        with pytest.raises(KeyboardInterrupt):
            stages.train_cell(arguments, params, run_training)
    assert trained["fmnist-a0.5-k6m4-fedprox-s0"].training.lr == 0.001  # tuned: the choice
    assert trained["fmnist-a0.5-k6m4-fedprox-s0"].algorithm.mu == 0.01
    assert trained["fmnist-a0.5-k6m4-fedavg-s0"].training.lr == params.base.training.lr  # not tuned: as written


def test_a_tuning_is_an_mlflow_parent_of_its_own(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from fedcme_core.config.params import params_from_dict
    from flows.pipeline.tune import open_tune_parent
    from flows.tracking.grid import open_grid_parent

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    params = params_from_dict(grid_values(TUNE))
    parent = open_tune_parent(params, tmp_path / "grid.yaml", "fedprox")

    assert parent is not None and open_tune_parent(params, tmp_path / "grid.yaml", "fedprox") == parent  # found again
    assert open_grid_parent(params, tmp_path / "grid.yaml", uri) != parent
    run = MlflowClient(uri).get_run(parent)
    assert run.info.run_name == "tune fedprox" and run.info.status == "RUNNING"
    assert (run.data.tags["run_kind"], run.data.tags["method"]) == ("tune", "fedprox")
