"""A researcher's own model: a toy architecture added to the registry in one line, checked against the
dataset by the config, built with the split it declares, and trained by FedCME for one round."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedcme_core.client import architectures
from fedcme_core.client.architectures import Architecture, registry
from fedcme_core.client.models import build_model, classifier_keys, parameter_split
from fedcme_core.config.files import ConfigError
from fedcme_core.rounds import final_model, run_experiment


def toy_backbone(input_shape: tuple[int, int, int]) -> nn.Sequential:
    """theta: flatten -> 12 -> 6, for any input shape (it adapts)."""
    channels, height, width = input_shape
    return nn.Sequential(nn.Flatten(), nn.Linear(channels * height * width, 12), nn.ReLU(), nn.Linear(12, 6), nn.ReLU())


# The module of a new architecture declares this much; the registry gets one line.
TOY = Architecture("toy_mlp", None, inference_batch=32, feature_dims=(6, 12), backbone=toy_backbone)
FIXED_TOY = Architecture("toy_fixed", (3, 4, 4), inference_batch=32, feature_dims=(6, 12), backbone=toy_backbone)


@pytest.fixture
def toy_models(monkeypatch):
    monkeypatch.setitem(architectures.ARCHITECTURES, "toy_mlp", TOY)  # the one line, in ARCHITECTURES
    monkeypatch.setitem(architectures.ARCHITECTURES, "toy_fixed", FIXED_TOY)


def test_the_builder_reads_the_declared_split_and_the_datasets_shape(toy_models):
    one = build_model("toy_mlp", num_classes=3, seed=0, input_shape=(1, 5, 5))
    two = build_model("toy_mlp", num_classes=3, seed=0, input_shape=(1, 5, 5), classifier_layers=2)
    inputs = torch.randn(4, 1, 5, 5)

    assert one.feature_dim == 6 and two.feature_dim == 12 and one.inference_batch_size == 32
    assert parameter_split(one) == (25 * 12 + 12 + 12 * 6 + 6, 6 * 3 + 3)
    assert classifier_keys(two.state_dict()) == ["classifier.0.weight", "classifier.0.bias", "classifier.2.weight",
                                                 "classifier.2.bias"]
    assert torch.equal(one(inputs), two(inputs))  # the same layers and weights: only the split moved
    with pytest.raises(ValueError, match="model.name: toy_mlp adapts to the dataset's input shape; give build_model"):
        build_model("toy_mlp")
    with pytest.raises(ValueError, match=r"model.name: toy_fixed expects inputs \(3, 4, 4\), but data.dataset the "
                                         r"dataset gives \(1, 5, 5\)"):
        build_model("toy_fixed", input_shape=(1, 5, 5))


def test_the_config_checks_a_dataset_against_the_toy_models_in_one_line(toy_models, synthetic_config):
    adapts = synthetic_config({"model.name": "toy_mlp", "data.synthetic.shape": [2, 3, 3]})

    assert adapts.model.name == "toy_mlp" and adapts.input_shape == (2, 3, 3)
    with pytest.raises(ConfigError, match=r"^config: model.name: toy_fixed expects inputs \(3, 4, 4\), but "
                                          r"data.dataset synthetic gives \(1, 28, 28\)$"):
        synthetic_config({"model.name": "toy_fixed"})
    with pytest.raises(ConfigError, match=r"^config: model.name: unknown model 'toy'; choose one of .*, toy_fixed$"):
        synthetic_config({"model.name": "toy"})
    with pytest.raises(ValueError, match="architecture name 'toy_mlp' is declared twice"):
        registry([TOY, FIXED_TOY, TOY])


def test_fedcme_trains_the_toy_model_for_one_round(toy_models, synthetic_config, tmp_path):
    config = synthetic_config({"model.name": "toy_mlp", "model.classifier_layers": 2, "federation.rounds": 1,
                               "data.synthetic.shape": [1, 6, 6], "runner.kind": "sequential",
                               "training.channels_last": False, "training.precision": "fp32"})

    history = run_experiment(config, tmp_path / "run")
    model = final_model(config, tmp_path / "run")
    initial = build_model("toy_mlp", 10, seed=None, input_shape=(1, 6, 6), classifier_layers=2)

    assert config.algorithm.name == "fedcme" and [record["round"] for record in history] == [0]  # round indices start at 0
    assert 0.0 <= history[0]["test_accuracy"] <= 1.0
    assert len(history[0]["algorithm"]["pairs"]) == 2  # FedCME matched the 4 selected clients in pairs
    assert model.backbone[1].in_features == 36 and model.feature_dim == 12
    assert set(model.state_dict()) == set(initial.state_dict())
