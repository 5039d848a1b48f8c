"""Models: shapes, the extractor / classifier split, seeded initialisation, device setting."""

from __future__ import annotations

import pytest
import torch

from fedcme_core.client.models import build_model, classifier_keys, extractor_keys, resolve_device


@pytest.mark.parametrize(
    "name, shape, feature_dim",
    [("fmnist_cnn", (1, 28, 28), 512), ("cifar_cnn", (3, 32, 32), 84)],
)
def test_features_then_classify_is_the_forward_pass(name, shape, feature_dim):
    model = build_model(name, num_classes=10, seed=0)
    inputs = torch.randn(3, *shape)

    features = model.features(inputs)
    logits = model.classify(features)

    assert features.shape == (3, feature_dim)
    assert logits.shape == (3, 10)
    assert torch.equal(logits, model(inputs))


def test_moon_variant_classifies_the_projection():
    model = build_model("cifar_cnn", num_classes=10, projection_dim=256, seed=0)

    features = model.features(torch.randn(2, 3, 32, 32))

    assert features.shape == (2, 256)
    assert model.classifier.in_features == 256
    assert any(key.startswith("projection.") for key in extractor_keys(model.state_dict()))


def test_classifier_is_exactly_the_last_linear_layer():
    state = build_model("fmnist_cnn", seed=0).state_dict()

    assert classifier_keys(state) == ["classifier.weight", "classifier.bias"]
    assert set(classifier_keys(state)) | set(extractor_keys(state)) == set(state)
    assert state["classifier.weight"].shape == (10, 512)


def test_same_seed_same_weights_and_global_rng_untouched():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)

    first = build_model("cifar_cnn", seed=7).state_dict()
    after = torch.rand(1)
    second = build_model("cifar_cnn", seed=7).state_dict()
    third = build_model("cifar_cnn", seed=8).state_dict()

    assert torch.equal(before, after)
    assert all(torch.equal(first[key], second[key]) for key in first)
    assert not torch.equal(first["classifier.weight"], third["classifier.weight"])


def test_unknown_model_is_named():
    with pytest.raises(ValueError, match="model.name: unknown model 'vgg'"):
        build_model("vgg")


def test_device_setting():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            resolve_device("cuda")
