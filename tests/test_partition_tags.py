"""The grid's partition dimension (fedcme_core.config.partition_tags) and a method's `setup`, in a grid cell's config."""

from __future__ import annotations

import pytest
import yaml

from fedcme_core.config.schema import ConfigError, PartitionConfig
from fedcme_core.config.params import params_from_dict
from fedcme_core.config.sections import setting_label
from fedcme_core.config.partition_tags import (
    entry_partition_tag,
    parse_partition_tag,
    partition_description,
    partition_label,
    partition_overrides,
)
from flows.tracking.names import experiment_name, partition_name
from flows.pipeline.stages import build_parser

from .conftest import REPO_ROOT


@pytest.mark.parametrize(("tag", "overrides", "label"), [
    ("a0.1", {"partition.alpha": 0.1}, "α=0.1"),
    ("a1.0", {"partition.alpha": 1.0}, "α=1.0"),
    ("a0.05", {"partition.alpha": 0.05}, "α=0.05"),
    ("c2", {"partition.method": "labels_per_client", "partition.labels_per_client": 2}, "#C=2"),
    ("c10", {"partition.method": "labels_per_client", "partition.labels_per_client": 10}, "#C=10"),
])
def test_a_tag_means_its_overrides_and_its_label(tag, overrides, label):
    assert partition_overrides(tag) == overrides
    assert partition_label(tag) == label


@pytest.mark.parametrize(("tag", "message"), [
    ("x3", "'x3' is not a partition tag; write a<alpha> (Dirichlet alpha) or c<k> (k labels per client)"),
    ("a", "'a' is not a partition tag"),
    ("a0", "'a0' is not a partition tag"),
    ("a-0.5", "'a-0.5' is not a partition tag"),
    ("anan", "'anan' is not a partition tag"),
    ("c0", "'c0' is not a partition tag"),
    ("c02", "'c02' is not a partition tag"),
    ("c2.5", "'c2.5' is not a partition tag"),
    ("a1", "'a1' is spelled a1.0"),
    ("a0.10", "'a0.10' is spelled a0.1"),
    (0.1, "0.1 is not a partition tag"),
])
def test_a_bad_tag_says_what_to_write(tag, message):
    with pytest.raises(ValueError) as error:
        parse_partition_tag(tag)

    assert str(error.value).startswith(message)


@pytest.mark.parametrize(("partition", "description"), [
    ({"method": "dirichlet", "alpha": 0.1}, "dirichlet(0.1)"),
    ({"method": "lognormal_dirichlet", "alpha": 0.5}, "lognormal_dirichlet(0.5)"),
    ({"method": "iid", "alpha": 0.5}, "iid"),
    ({"method": "labels_per_client", "labels_per_client": 2}, "labels_per_client(2)"),
])
def test_the_csv_describes_a_partition_by_its_method(partition, description):
    assert partition_description(PartitionConfig(**partition)) == description


def test_committed_metrics_without_a_partition_key_have_the_tag_of_their_alpha():
    assert entry_partition_tag({"alpha": 0.1}) == "a0.1" and entry_partition_tag({"alpha": 1}) == "a1.0"
    assert entry_partition_tag({"alpha": None, "partition": "c2"}) == "c2"


def test_names_and_labels_of_either_family():
    assert partition_name("fmnist", "a0.1", 50, 0) == "fmnist-a0.1-k50-s0"
    assert experiment_name("fedavg", "cifar10", "a0.1", 50, 20, 0) == "cifar10-a0.1-k50m20-fedavg-s0"
    assert experiment_name("fedavg", "cifar10", "c2", 10, 10, 1) == "cifar10-c2-k10m10-fedavg-s1"
    assert setting_label("cifar10", "a0.1", 50, 20) == "CIFAR-10 α=0.1 K=50 M=20"
    assert setting_label("cifar10", "c2", 10, 10) == "CIFAR-10 #C=2 K=10 M=10"


def test_the_stages_cli_takes_a_tag_and_refuses_a_bad_one(capsys):
    parser = build_parser()

    arguments = parser.parse_args(["partition", "--dataset", "fmnist", "--partition", "c2", "--clients", "10",
                                   "--seed", "0"])
    with pytest.raises(SystemExit):
        parser.parse_args(["partition", "--dataset", "fmnist", "--partition", "0.1", "--clients", "10", "--seed", "0"])

    assert arguments.partition == "c2"
    assert "argument --partition: '0.1' is not a partition tag" in capsys.readouterr().err


# ----------------------------------------------------------------------------- a grid file's cells
def grid_file(**changes) -> dict:
    """params.yaml, with `changes` ({"grid.partitions": [...]}) set."""
    values = yaml.safe_load((REPO_ROOT / "params.yaml").read_text(encoding="utf-8"))
    for dotted, value in changes.items():
        section, key = dotted.split(".", 1)
        values[section][key] = value
    return values


def test_a_c2_cell_partitions_by_two_labels_per_client_and_an_a_cell_by_alpha():
    params = params_from_dict(grid_file(**{"grid.partitions": ["a0.1", "c2"]}))

    labels = params.cell_config("fedavg", "fmnist", "c2", 10, 10, 0).partition
    dirichlet = params.cell_config("fedavg", "fmnist", "a0.1", 10, 10, 0).partition

    assert (labels.method, labels.labels_per_client) == ("labels_per_client", 2)
    assert (dirichlet.method, dirichlet.alpha, dirichlet.labels_per_client) == ("dirichlet", 0.1, None)
    # The partition stage partitions by what the train stage's config says.
    assert params.partition_config("c2") == labels and params.partition_config("a0.1") == dirichlet
    assert [cell[2] for cell in params.grid.cells()][:4] == ["a0.1", "a0.1", "c2", "c2"]


def test_setup_overrides_land_in_the_cells_of_its_method_only_after_the_dataset_model():
    values = grid_file()
    values["methods"]["fedcme-e4"] = {"name": "fedcme", "mu": 0.01, "label": "FedCME(0.01) E=4",
                                      "setup": {"training.local_epochs": 4, "model.classifier_layers": 2,
                                                "data.augment": "crop_flip"}}
    values["grid"]["methods"] = ["fedavg", "fedcme-e4"]
    params = params_from_dict(values)

    changed = params.cell_config("fedcme-e4", "fmnist", "a1.0", 10, 10, 0)
    plain = params.cell_config("fedavg", "fmnist", "a1.0", 10, 10, 0)

    assert (changed.training.local_epochs, changed.model.classifier_layers, changed.augmentation) == (4, 2, "crop_flip")
    assert changed.model.name == "fmnist_cnn" and changed.algorithm.name == "fedcme"
    assert (plain.training.local_epochs, plain.model.classifier_layers, plain.augmentation) == (2, 1, "none")
    assert "setup" not in params.methods["fedcme-e4"].algorithm.model_dump()


def test_a_setup_value_the_cell_refuses_is_one_line_naming_the_cell():
    values = grid_file()
    values["methods"]["fedavg"] = {"name": "fedavg", "setup": {"model.classifier_layers": 3}}

    with pytest.raises(ConfigError) as error:
        params_from_dict(values, source="p.yaml")

    assert str(error.value).startswith("p.yaml [grid cell fedavg fmnist a1.0 K=10 M=10 seed=0]: "
                                       "model.classifier_layers")
    assert "\n" not in str(error.value)
