"""``cifar_cnn64``: the CIFAR CNN of the FedAvg paper's experiments (McMahan et al. 2017; TensorFlow's
cifar10 tutorial model, without its local response normalisation), 3x32x32 -> 64x28x28 -> 64x14x14 ->
64x10x10 -> 64x5x5 -> 1600 -> 384 -> 192 -> C. phi is the last linear layer (d = 192) or the last two
(d = 384: phi is 384 -> 192 -> C)."""

from __future__ import annotations

from fedcme_core.client.architectures.base import Architecture, InputShape
from fedcme_core.common.lazy import lazy_module

nn = lazy_module("torch.nn")


def backbone(input_shape: InputShape) -> nn.Sequential:
    """theta: [B, 3, 32, 32] -> [B, 192]."""
    return nn.Sequential(
        nn.Conv2d(3, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 5 * 5, 384), nn.ReLU(), nn.Linear(384, 192), nn.ReLU(),
    )


# Inference batch 256: a first choice, not measured, kept small because its activations are wide (64
# channels), as fmnist_cnn's, where a large batch did not pay.
ARCHITECTURE = Architecture("cifar_cnn64", (3, 32, 32), inference_batch=256, feature_dims=(192, 384),
                            backbone=backbone)
