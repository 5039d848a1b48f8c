"""The model architectures as a table, without importing torch.

:mod:`fedcme_core.client.models` builds the architectures. The config (:mod:`fedcme_core.config.schema`,
a layer above) checks a dataset against its model's input shape and the model's classifier split, and
validating a config must not cost torch's import: `fedcme train` validates the whole params file before
it starts anything; so this module imports only the standard library (``fedcme_core.client`` imports
nothing on its own either). Adding a model is one entry of :data:`ARCHITECTURES` plus its builder in
:mod:`fedcme_core.client.models`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Architecture:
    """What is known of an architecture before it is built.

    `input_shape`: (channels, height, width) of the images it is built for. `inference_batch`: the
    batch of its no-grad passes (test-set evaluation, SPEC step 7's local features and evaluation
    vectors). `feature_dims[n - 1]`: the feature dimension d (the input of the classifier phi, without
    MOON's head) when phi is its last n linear layers (``model.classifier_layers: n``), so the splits it
    supports are 1 .. len(feature_dims).
    """

    input_shape: tuple[int, int, int]
    inference_batch: int
    feature_dims: tuple[int, ...]

    @property
    def classifier_layers(self) -> tuple[int, ...]:
        """The values of ``model.classifier_layers`` it supports."""
        return tuple(range(1, len(self.feature_dims) + 1))


# Inference batches: fmnist_cnn's and cifar_cnn's are the largest batch that pays (bench/evaluation.py;
# BENCHMARKS.md, "No-grad batch per model", gives the figures). cifar_cnn64's (256) and resnet18_gn's
# (128) are a first choice, not measured, kept small because their activations are wide (64 channels and
# more), as fmnist_cnn's, where a large batch did not pay.
ARCHITECTURES: dict[str, Architecture] = {
    # The CNN of the FedAvg paper: 1x28x28 -> 32x12x12 -> 64x4x4 -> 1024 -> 512 -> C.
    "fmnist_cnn": Architecture((1, 28, 28), 128, feature_dims=(512, 1024)),
    # "simple-cnn" of MOON / NIID-Bench: 3x32x32 -> 6x14x14 -> 16x5x5 -> 400 -> 120 -> 84 -> C.
    "cifar_cnn": Architecture((3, 32, 32), 1024, feature_dims=(84, 120)),
    # The CIFAR CNN of the FedAvg paper's experiments: 3x32x32 -> 64x14x14 -> 64x5x5 -> 1600 -> 384 -> 192 -> C.
    "cifar_cnn64": Architecture((3, 32, 32), 256, feature_dims=(192, 384)),
    # ResNet-18 with GroupNorm and a CIFAR stem: 3x32x32 -> ... -> 512x4x4 -> 512 -> C (one linear layer).
    "resnet18_gn": Architecture((3, 32, 32), 128, feature_dims=(512,)),
}

MODEL_NAMES = tuple(ARCHITECTURES)
MODEL_INPUT_SHAPES: dict[str, tuple[int, int, int]] = {name: a.input_shape for name, a in ARCHITECTURES.items()}
MODEL_INFERENCE_BATCH: dict[str, int] = {name: a.inference_batch for name, a in ARCHITECTURES.items()}


def check_classifier_layers(name: str, classifier_layers: int) -> None:
    """Raise a one-line ValueError naming ``model.classifier_layers`` and the model when the model
    cannot split off `classifier_layers` linear layers as its classifier."""
    supported = ARCHITECTURES[name].classifier_layers
    if classifier_layers not in supported:
        choices = " or ".join(str(layers) for layers in supported)
        raise ValueError(f"model.classifier_layers: model {name} offers a classifier of {choices} linear "
                         f"layer{'s' if supported[-1] > 1 else ''}, not {classifier_layers!r}")
