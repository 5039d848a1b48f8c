"""The larger models, cifar_cnn64 and resnet18_gn: shapes, the extractor / classifier split and
everything that follows it (exchange, alignment, MOON's head), the split refused at config
validation, seeded construction, the calibration's cost, and whole runs that resume bit for bit."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch
from torch import nn

from fedcme_core.client import compute as compute_module
from fedcme_core.client.architectures import ARCHITECTURES, MODEL_INPUT_SHAPES
from fedcme_core.client.compute import Compute, resolve
from fedcme_core.client.models import build_model, classifier_keys, extractor_keys, parameter_split
from fedcme_core.config.files import ConfigError
from fedcme_core.rounds import completed_rounds, final_model, load_server_state, run_experiment, split_line
from fedcme_core.server.exchange import swap_parts

from .conftest import REPO_ROOT
from .helpers import same_state
from .test_federation import CrashingExecutor, without_timings

NEW_MODELS = ("cifar_cnn64", "resnet18_gn")
# A resnet18_gn round costs seconds even on tiny data (its 11M-parameter checkpoints are written, hashed
# and read several times a round), so its whole runs are in the full suite only.
RESNET_RUN = pytest.param("resnet18_gn", marks=pytest.mark.slow)
CPU = torch.device("cpu")


def conv(in_channels: int, out_channels: int, kernel: int, bias: bool = True) -> int:
    return in_channels * out_channels * kernel * kernel + (out_channels if bias else 0)


def linear(in_features: int, out_features: int) -> int:
    return in_features * out_features + out_features


CIFAR_CNN64_EXTRACTOR = 3 * 64 * 25 + 64 + 64 * 64 * 25 + 64 + 1600 * 384 + 384 + 384 * 192 + 192


def resnet18_gn_extractor() -> int:
    """ResNet-18's parameters without its classifier: bias-free convolutions, GroupNorm's weight and bias."""
    def group_norm(channels: int) -> int:
        return 2 * channels

    def block(in_channels: int, out_channels: int) -> int:
        count = conv(in_channels, out_channels, 3, bias=False) + group_norm(out_channels)
        count += conv(out_channels, out_channels, 3, bias=False) + group_norm(out_channels)
        if in_channels != out_channels:  # the 1x1 downsampling shortcut
            count += conv(in_channels, out_channels, 1, bias=False) + group_norm(out_channels)
        return count

    count, in_channels = conv(3, 64, 3, bias=False) + group_norm(64), 64
    for width in (64, 128, 256, 512):
        count += block(in_channels, width) + block(width, width)
        in_channels = width
    return count


@pytest.mark.parametrize("name, feature_dim", [("cifar_cnn64", 192), ("resnet18_gn", 512)])
def test_shapes_and_features_then_classify_is_the_forward_pass(name, feature_dim):
    model = build_model(name, num_classes=10, seed=0)
    inputs = torch.randn(3, 3, 32, 32)

    features = model.features(inputs)
    logits = model.classify(features)

    assert MODEL_INPUT_SHAPES[name] == (3, 32, 32)
    assert features.shape == (3, feature_dim) and model.feature_dim == feature_dim
    assert logits.shape == (3, 10)
    assert torch.equal(logits, model(inputs))


@pytest.mark.parametrize("name, layers", [(name, layers) for name, architecture in ARCHITECTURES.items()
                                          for layers in architecture.classifier_layers])
def test_the_table_gives_each_models_feature_dimension_per_split(name, layers):
    model = build_model(name, seed=0, classifier_layers=layers)

    features = model.features(torch.randn(2, *ARCHITECTURES[name].input_shape))

    assert features.shape == (2, ARCHITECTURES[name].feature_dims[layers - 1]) == (2, model.feature_dim)
    assert model.inference_batch_size == ARCHITECTURES[name].inference_batch


def test_cifar_cnn64_split_counted_by_hand():
    model = build_model("cifar_cnn64", seed=0)
    state = model.state_dict()

    assert classifier_keys(state) == ["classifier.weight", "classifier.bias"]
    assert state["classifier.weight"].shape == (10, 192)
    assert parameter_split(model) == (CIFAR_CNN64_EXTRACTOR, linear(192, 10))


def test_resnet18_gn_split_counted_by_formula_and_groupnorm_everywhere():
    model = build_model("resnet18_gn", seed=0)
    norms = [module for module in model.modules() if isinstance(module, nn.GroupNorm)]

    assert classifier_keys(model.state_dict()) == ["classifier.weight", "classifier.bias"]
    assert parameter_split(model) == (resnet18_gn_extractor(), linear(512, 10))
    assert sum(parameter_split(model)) == 11_173_962  # the CIFAR ResNet-18 of the literature, norm affine included
    assert len(norms) == 1 + 8 * 2 + 3 and all(norm.num_groups == 2 for norm in norms)  # stem, 8 blocks, 3 shortcuts
    assert not any(isinstance(module, nn.modules.batchnorm._BatchNorm) for module in model.modules())
    assert list(model.buffers()) == []  # no running statistics: the state is all parameters, all averaged


def test_cifar_cnn64_two_layer_classifier_moves_the_192_layer_into_phi():
    one, two = build_model("cifar_cnn64", seed=5), build_model("cifar_cnn64", seed=5, classifier_layers=2)
    inputs = torch.randn(4, 3, 32, 32)

    assert two.feature_dim == 384 and two.features(inputs).shape == (4, 384)
    assert [(layer.in_features, layer.out_features) for layer in two.classifier if isinstance(layer, nn.Linear)] == [
        (384, 192), (192, 10)]
    assert classifier_keys(two.state_dict()) == [
        "classifier.0.weight", "classifier.0.bias", "classifier.2.weight", "classifier.2.bias"]
    assert parameter_split(two) == (CIFAR_CNN64_EXTRACTOR - linear(384, 192), linear(384, 192) + linear(192, 10))
    assert torch.equal(one(inputs), two(inputs))  # the same layers and weights: only the split moved


def test_moons_head_sits_between_backbone_and_either_classifier():
    resnet = build_model("resnet18_gn", projection_dim=256, seed=0)
    cnn = build_model("cifar_cnn64", projection_dim=256, seed=0, classifier_layers=2)
    inputs = torch.randn(2, 3, 32, 32)

    assert resnet.features(inputs).shape == (2, 256) and resnet.classifier.in_features == 256
    assert resnet.projection[0].in_features == 512
    assert cnn.projection[0].in_features == 384 and cnn.features(inputs).shape == (2, 256)
    assert (cnn.classifier[0].in_features, cnn.classifier[0].out_features) == (256, 192)


def test_resnet18_gn_refuses_a_two_layer_classifier_in_one_line_without_torch(tmp_path):
    """At config validation (`fedcme train` and `fedcme check` validate before torch is imported)."""
    config = tmp_path / "resnet.yaml"
    config.write_text("data:\n  dataset: cifar10\nmodel:\n  name: resnet18_gn\n  classifier_layers: 2\n")
    script = ("import sys\n"
              "from fedcme_core.config import load_config\n"
              "from fedcme_core.config.files import ConfigError\n"
              f"try:\n    load_config({str(config)!r})\n"
              "except ConfigError as error:\n    print(error)\n"
              "print(sorted(name for name in sys.modules if name.split('.')[0] == 'torch'))\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, check=True)

    message, torch_modules = result.stdout.strip().split("\n")
    assert message == (f"{config}: model.classifier_layers: model resnet18_gn offers a classifier of 1 linear layer, "
                       "not 2")
    assert torch_modules == "[]"


def test_the_two_layer_refusal_holds_for_the_builder_and_not_for_cifar_cnn64(synthetic_config):
    cifar = {"data.dataset": "cifar10"}

    with pytest.raises(ConfigError, match=r"model\.classifier_layers: model resnet18_gn offers .* 1 linear layer, not 2"):
        synthetic_config({**cifar, "model.name": "resnet18_gn", "model.classifier_layers": 2})
    with pytest.raises(ValueError, match="model.classifier_layers: model resnet18_gn"):
        build_model("resnet18_gn", classifier_layers=2)
    assert synthetic_config({**cifar, "model.name": "cifar_cnn64", "model.classifier_layers": 2}).model.classifier_layers == 2


@pytest.mark.parametrize("name, layers", [("cifar_cnn64", 1), ("cifar_cnn64", 2), ("resnet18_gn", 1)])
def test_the_classifier_exchange_moves_exactly_the_classifier_keys(name, layers):
    a = build_model(name, seed=1, classifier_layers=layers).state_dict()
    b = build_model(name, seed=2, classifier_layers=layers).state_dict()

    a_received, b_received = swap_parts(a, b, "classifier")

    moved = {key for key in a if not torch.equal(a_received[key], a[key])}
    assert moved == set(classifier_keys(a)) and len(moved) == 2 * layers
    assert all(torch.equal(a_received[key], b[key]) and torch.equal(b_received[key], a[key]) for key in moved)
    assert all(torch.equal(a_received[key], a[key]) for key in extractor_keys(a))


@pytest.mark.parametrize("name", NEW_MODELS)
def test_seeded_construction_is_deterministic_and_leaves_the_global_stream(name):
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)

    first, second, other = (build_model(name, seed=seed).state_dict() for seed in (7, 7, 8))

    assert torch.equal(torch.rand(1), before)
    assert all(torch.equal(first[key], second[key]) for key in first)
    assert not torch.equal(first["classifier.weight"], other["classifier.weight"])
    assert not torch.equal(first["backbone.0.weight"], other["backbone.0.weight"])


def test_the_run_start_line_counts_the_split(synthetic_config):
    resnet = synthetic_config({"data.dataset": "cifar10", "model.name": "resnet18_gn"})
    cnn = synthetic_config({"data.dataset": "cifar10", "model.name": "cifar_cnn64", "model.classifier_layers": 2})

    assert split_line(resnet) == (f"model resnet18_gn: extractor {resnet18_gn_extractor():,} + classifier 5,130 "
                                  "parameters (1 layer), feature 512-d")
    assert split_line(cnn) == (f"model cifar_cnn64: extractor {CIFAR_CNN64_EXTRACTOR - linear(384, 192):,} + classifier "
                               f"{linear(384, 192) + linear(192, 10):,} parameters (2 layers), feature 384-d")


def test_a_heavy_models_calibration_times_one_step_per_candidate_and_repeat(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDCME_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(compute_module, "CALIBRATION_SECONDS", 0.01)
    calls: list[str] = []

    def slow_step(option: Compute) -> int:  # a step longer than CALIBRATION_SECONDS
        calls.append(option.name)
        time.sleep(0.02 if option.channels_last else 0.04)
        return 64

    choice = resolve("auto", "fp32", CPU, "resnet18_gn|shape", slow_step)

    assert len(calls) == 1 + 1 + compute_module.CALIBRATION_REPEATS * 2  # start-up, warm-up, one step each
    assert choice.compute == Compute(channels_last=True) and choice.chosen_by == "calibration"


def tiny_cifar_run(name: str, **more) -> dict:
    """A FedCME run on 3x32x32 synthetic data, small enough for resnet18_gn on one CPU core."""
    return {"data.synthetic.shape": [3, 32, 32], "data.synthetic.num_train": 48, "data.synthetic.num_test": 16,
            "partition.min_size": 8, "federation.num_clients": 4, "federation.clients_per_round": 2,
            "training.batch_size": 8, "training.channels_last": False, "training.precision": "fp32",
            "model.name": name, **more}


@pytest.mark.parametrize("name, layers, feature_dim", [
    ("cifar_cnn64", 1, 192), ("cifar_cnn64", 2, 384), pytest.param("resnet18_gn", 1, 512, marks=pytest.mark.slow)])
def test_fedcme_rounds_align_and_exchange_at_the_models_split(finished_run, name, layers, feature_dim):
    history, run_dir = finished_run(tiny_cifar_run(name, **{"model.classifier_layers": layers}))

    assert [record["round"] for record in history] == [0, 1]
    assert all(len(record["algorithm"]["pairs"]) == 1 for record in history)
    assert all(0.0 <= record["test_accuracy"] <= 1.0 and record["test_loss"] > 0 for record in history)
    global_features = load_server_state(run_dir, 1)["algorithm"]["global_features"]
    assert global_features["values"].shape == (10, feature_dim) and global_features["defined"].any()


@pytest.mark.parametrize("algorithm", [{"name": "moon", "mu": 1.0}, {"name": "fedrs", "alpha": 0.5},
                                       {"name": "scaffold"}, {"name": "fedcme", "exchange": "extractor"}],
                         ids=["moon", "fedrs", "scaffold", "fedcme-extractor"])
def test_every_algorithm_trains_cifar_cnn64_with_a_two_layer_classifier(tmp_path, synthetic_config, algorithm):
    config = synthetic_config(tiny_cifar_run("cifar_cnn64", **{"model.classifier_layers": 2,
                                                               "federation.rounds": 1}), algorithm=algorithm)

    history = run_experiment(config, tmp_path / "run")

    assert len(history) == 1 and 0.0 <= history[0]["test_accuracy"] <= 1.0
    assert completed_rounds(tmp_path / "run") == 1


@pytest.mark.parametrize("name", ["cifar_cnn64", RESNET_RUN])
def test_a_run_resumed_after_a_crash_at_the_exchange_is_bit_identical(tmp_path, synthetic_config, finished_run, name):
    config = synthetic_config(tiny_cifar_run(name))
    straight, straight_dir = finished_run(tiny_cifar_run(name))

    with pytest.raises(KeyboardInterrupt):
        run_experiment(config, tmp_path / "crashed", CrashingExecutor("exchange", round_index=1))
    assert completed_rounds(tmp_path / "crashed") == 1
    resumed = run_experiment(config, tmp_path / "crashed")

    assert without_timings(resumed) == without_timings(straight)
    assert same_state(final_model(config, straight_dir), final_model(config, tmp_path / "crashed"))
