"""What an architecture declares before it is built (no torch): the record of the registry
(:mod:`fedcme_core.client.architectures`), which :func:`fedcme_core.client.models.build_model` reads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

InputShape = tuple[int, int, int]  # (channels, height, width) of one sample


@dataclass(frozen=True)
class Architecture:
    """One model architecture, declared in a module of its own.

    `name`: its ``model.name``. `input_shape`: the (C, H, W) it is built for, or None when it adapts to
    the dataset's (its backbone is given the dataset's shape). `inference_batch`: the batch of its
    no-grad passes (test-set evaluation, SPEC step 7's local features and evaluation vectors).
    `feature_dims[n - 1]`: the feature dimension d (the input of the classifier phi, without MOON's head)
    when phi is its last n linear layers (``model.classifier_layers: n``), so the splits it supports are
    1 .. len(feature_dims). `backbone(input_shape)`: a new ``nn.Sequential`` theta, [B, C, H, W] ->
    [B, feature_dims[0]], built with the global torch RNG (the builder seeds it); with two entries in
    `feature_dims` it ends ``[..., Linear(feature_dims[1], feature_dims[0]), ReLU]``, the layer that
    ``model.classifier_layers: 2`` moves into phi.
    """

    name: str
    input_shape: InputShape | None
    inference_batch: int
    feature_dims: tuple[int, ...]
    backbone: Callable[[InputShape], Any]

    @property
    def classifier_layers(self) -> tuple[int, ...]:
        """The values of ``model.classifier_layers`` it supports."""
        return tuple(range(1, len(self.feature_dims) + 1))

    @property
    def adapts(self) -> bool:
        """True when it is built for the dataset's input shape, whatever it is."""
        return self.input_shape is None
