"""``fmnist_cnn``: the CNN of the FedAvg paper (McMahan et al. 2017) for Fashion-MNIST,
1x28x28 -> 32x12x12 -> 64x4x4 -> 1024 -> 512 -> C. phi is the last linear layer (d = 512) or the
last two (d = 1024: theta ends at the flatten, phi is 1024 -> 512 -> C)."""

from __future__ import annotations

from fedcme_core.client.architectures.base import Architecture, InputShape
from fedcme_core.common.lazy import lazy_module

nn = lazy_module("torch.nn")


def backbone(input_shape: InputShape) -> nn.Sequential:
    """theta: [B, 1, 28, 28] -> [B, 512]."""
    return nn.Sequential(
        nn.Conv2d(1, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 4 * 4, 512), nn.ReLU(),
    )


# Inference batch 128: the largest that pays (bench/evaluation.py; BENCHMARKS.md, "No-grad batch per model").
ARCHITECTURE = Architecture("fmnist_cnn", (1, 28, 28), inference_batch=128, feature_dims=(512, 1024),
                            backbone=backbone)
