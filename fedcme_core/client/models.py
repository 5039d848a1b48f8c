"""Models of the FedCME experiments, split into feature extractor and classifier.

FedCME (Nie et al., arXiv:2307.08574) writes a model as w = (theta, phi): theta is the
feature extractor (every layer up to the penultimate representation, whose output is the
*feature*), phi the classifier (the final linear layer). Classifier exchange swaps phi,
feature alignment acts on theta's output, so every model here exposes

    logits = model.classify(model.features(x)),   features: [B, d],  logits: [B, C]

and names its classifier parameters ``classifier.*``. MOON's variant inserts a projection
head (linear d->d, ReLU, linear d->p) between the backbone and the classifier, as in
MOON's official code; the projection is then part of theta and the classifier reads the
p-dimensional projection.

The paper's classifiers are "one or two linear layers" (``model.classifier_layers``). With two,
the backbone's last linear layer and its ReLU move into phi (cifar_cnn: theta ends at the 120-d
layer and phi is 120 -> 84 -> C). The function and the initial weights are those of one layer (the
same layers, built in the same order); only the split, and so what is exchanged and aligned, moves.
With MOON's head, phi's first layer reads the projection: p -> h -> C, h the moved layer's width.
Each architecture's module (:mod:`fedcme_core.client.architectures`) declares its backbone, its input
shape and its feature dimension per split; :func:`build_model` builds any registered one.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from fedcme_core.client.architectures import (  # noqa: F401 - the names models are built by
    ARCHITECTURES, MODEL_INFERENCE_BATCH, MODEL_INPUT_SHAPES, MODEL_NAMES, InputShape, architecture,
    check_classifier_layers, check_input_shape,
)

CLASSIFIER_PREFIX = "classifier."
DeviceSetting = Literal["auto", "cpu", "cuda"]


class SplitModel(nn.Module):
    """A backbone, an optional projection head (MOON) and a linear classifier; `inference_batch_size`
    is the batch of its no-grad passes (:data:`fedcme_core.client.architectures.MODEL_INFERENCE_BATCH`)."""

    def __init__(self, backbone: nn.Module, backbone_dim: int, num_classes: int, projection_dim: int | None = None,
                 inference_batch_size: int | None = None, hidden: nn.Linear | None = None):
        super().__init__()
        self.backbone = backbone
        self.inference_batch_size = inference_batch_size
        if projection_dim is None:
            self.projection = None
            self.feature_dim = backbone_dim
        else:
            self.projection = nn.Sequential(
                nn.Linear(backbone_dim, backbone_dim), nn.ReLU(), nn.Linear(backbone_dim, projection_dim)
            )
            self.feature_dim = projection_dim
        if hidden is None:  # phi = one linear layer: d -> C
            self.classifier: nn.Module = nn.Linear(self.feature_dim, num_classes)
        else:  # phi = two linear layers: d -> h -> C (`hidden` is d -> h, moved out of the backbone)
            if hidden.in_features != self.feature_dim:
                hidden = nn.Linear(self.feature_dim, hidden.out_features)
            self.classifier = nn.Sequential(hidden, nn.ReLU(), nn.Linear(hidden.out_features, num_classes))
        self.num_classes = num_classes

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """theta(x): [B, C_in, H, W] -> [B, d]."""
        hidden = self.backbone(x)  # [B, backbone_dim]
        if self.projection is not None:
            hidden = self.projection(hidden)  # [B, projection_dim]
        return hidden

    def classify(self, features: torch.Tensor) -> torch.Tensor:
        """phi(h): [B, d] -> logits [B, num_classes]."""
        return self.classifier(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.features(x))


def build_model(name: str, num_classes: int = 10, projection_dim: int | None = None, seed: int | None = None,
                classifier_layers: int = 1, input_shape: InputShape | None = None) -> SplitModel:
    """Build the registered architecture `name` (:data:`fedcme_core.client.architectures.ARCHITECTURES`)
    with a classifier over `num_classes`; with `seed`, its initial weights are a function of the seed
    alone. `classifier_layers` is how many of the last linear layers form the classifier phi (1, or 2
    where the architecture declares two feature dimensions). `input_shape` is the dataset's (C, H, W):
    needed by an architecture that adapts to it, checked against one built for a fixed shape."""
    declared = architecture(name)
    check_classifier_layers(name, classifier_layers)
    if declared.adapts and input_shape is None:
        raise ValueError(f"model.name: {name} adapts to the dataset's input shape; give build_model its input_shape")
    check_input_shape(name, input_shape, "the dataset")
    backbone_dim = declared.feature_dims[0]
    fork_devices: list = []
    with torch.random.fork_rng(devices=fork_devices, enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        backbone = declared.backbone(tuple(input_shape) if input_shape is not None else declared.input_shape)
        hidden = None
        if classifier_layers == 2:
            # The backbone ends [..., Linear(h_in, h), ReLU]: that Linear becomes phi's first layer.
            *kept, hidden, _ = list(backbone)
            if not isinstance(hidden, nn.Linear) or hidden.in_features != declared.feature_dims[1]:
                raise ValueError(f"model.classifier_layers: {name}'s backbone does not end with the "
                                 f"Linear({declared.feature_dims[1]}, {backbone_dim}) and ReLU its feature_dims declare")
            backbone, backbone_dim = nn.Sequential(*kept), hidden.in_features
        return SplitModel(backbone, backbone_dim, num_classes, projection_dim, declared.inference_batch, hidden)


def is_classifier_key(key: str) -> bool:
    """True for the state-dict keys of phi (the classifier)."""
    return key.startswith(CLASSIFIER_PREFIX)


def parameter_split(model: nn.Module) -> tuple[int, int]:
    """(parameters of theta, parameters of phi): what stays and what an exchange of phi moves."""
    classifier = sum(p.numel() for name, p in model.named_parameters() if is_classifier_key(name))
    return sum(p.numel() for p in model.parameters()) - classifier, classifier


def classifier_keys(state: dict) -> list[str]:
    return [key for key in state if is_classifier_key(key)]


def extractor_keys(state: dict) -> list[str]:
    return [key for key in state if not is_classifier_key(key)]


def resolve_device(setting: DeviceSetting = "auto") -> torch.device:
    """`auto` takes CUDA when present, else the CPU; `cuda` without a GPU is an error."""
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if setting == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' was requested but no CUDA device is available")
    return torch.device(setting)
