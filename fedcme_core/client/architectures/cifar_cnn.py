"""``cifar_cnn``: "simple-cnn" of MOON / NIID-Bench, 3x32x32 -> 6x14x14 -> 16x5x5 -> 400 -> 120 -> 84
-> C. phi is the last linear layer (d = 84) or the last two (d = 120: phi is 120 -> 84 -> C)."""

from __future__ import annotations

from fedcme_core.client.architectures.base import Architecture, InputShape
from fedcme_core.common.lazy import lazy_module

nn = lazy_module("torch.nn")


def backbone(input_shape: InputShape) -> nn.Sequential:
    """theta: [B, 3, 32, 32] -> [B, 84]."""
    return nn.Sequential(
        nn.Conv2d(3, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
    )


# Inference batch 1024: the largest that pays (bench/evaluation.py; BENCHMARKS.md, "No-grad batch per model").
ARCHITECTURE = Architecture("cifar_cnn", (3, 32, 32), inference_batch=1024, feature_dims=(84, 120),
                            backbone=backbone)
