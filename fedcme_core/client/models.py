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
layer and phi is 120 -> 84 -> 10; fmnist_cnn: theta ends at the 1024-d flatten and phi is
1024 -> 512 -> 10; cifar_cnn64: theta ends at the 384-d layer and phi is 384 -> 192 -> 10). The
function and the initial weights are those of one layer (the same layers, built in the same order);
only the split, and so what is exchanged and aligned, moves. With MOON's head, phi's first layer reads
the projection: p -> h -> C, h the moved layer's width. resnet18_gn has one linear layer, so its
classifier is that layer only (:func:`fedcme_core.client.architectures.check_classifier_layers`).
Each model's feature dimension per split is declared in :data:`fedcme_core.client.architectures.ARCHITECTURES`.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from fedcme_core.client.architectures import (  # noqa: F401 - the names models are built by
    ARCHITECTURES, MODEL_INFERENCE_BATCH, MODEL_INPUT_SHAPES, MODEL_NAMES, check_classifier_layers,
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


def _fmnist_backbone() -> nn.Sequential:
    # The CNN of the FedAvg paper: 1x28x28 -> 32x12x12 -> 64x4x4 -> 1024 -> 512.
    return nn.Sequential(
        nn.Conv2d(1, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 4 * 4, 512), nn.ReLU(),
    )


def _cifar_backbone() -> nn.Sequential:
    # "simple-cnn" of MOON / NIID-Bench: 3x32x32 -> 6x14x14 -> 16x5x5 -> 400 -> 120 -> 84.
    return nn.Sequential(
        nn.Conv2d(3, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
    )


def _cifar64_backbone() -> nn.Sequential:
    # The CIFAR CNN of the FedAvg paper's experiments (McMahan et al. 2017; TensorFlow's cifar10
    # tutorial model, without its local response normalisation):
    # 3x32x32 -> 64x28x28 -> 64x14x14 -> 64x10x10 -> 64x5x5 -> 1600 -> 384 -> 192.
    return nn.Sequential(
        nn.Conv2d(3, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 5 * 5, 384), nn.ReLU(), nn.Linear(384, 192), nn.ReLU(),
    )


GROUP_NORM_GROUPS = 2  # resnet18_gn: GroupNorm(2, channels), as Hsieh et al. 2020


def _group_norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(GROUP_NORM_GROUPS, channels)


class BasicBlock(nn.Module):
    """ResNet's basic block with GroupNorm: [B, c_in, H, W] -> [B, c_out, H / stride, W / stride].
    Two 3x3 convolutions (no bias), each followed by GroupNorm; the shortcut is the identity, or a
    1x1 strided convolution and GroupNorm where the shape changes; ReLU after the sum."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.norm1 = _group_norm(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, stride=1, padding=1, bias=False)
        self.norm2 = _group_norm(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                                          _group_norm(out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))



class GlobalAveragePool(nn.Module):
    """[B, C, H, W] -> [B, C, 1, 1], the mean over H and W. On the CPU it is
    ``nn.AdaptiveAvgPool2d(1)``, as before; on CUDA a plain mean, because adaptive pooling's CUDA
    backward has no deterministic kernel (it raises under ``torch.use_deterministic_algorithms``).
    Both are the same mean, within float rounding; no parameters or state."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cuda":
            return x.mean(dim=(2, 3), keepdim=True)
        return nn.functional.adaptive_avg_pool2d(x, 1)

def _resnet18_gn_backbone() -> nn.Sequential:
    """ResNet-18 (He et al. 2016; BasicBlock, [2, 2, 2, 2], widths 64/128/256/512) for 32x32 inputs:
    a 3x3 stride-1 stem without max pool, and GroupNorm with 2 groups in place of every BatchNorm
    (the shortcuts' included), as Hsieh et al. 2020 ("The Non-IID Data Quagmire of Decentralized
    Machine Learning", ICML) for learning on non-IID data, where BatchNorm's batch statistics differ
    across clients; GroupNorm has no running statistics, so the model's state is all parameters.
    3x32x32 -> 64x32x32 -> 128x16x16 -> 256x8x8 -> 512x4x4 -> average pool -> 512.
    Convolutions are initialised as torchvision's ResNet (Kaiming normal, fan out), GroupNorm to
    weight 1, bias 0."""
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False), _group_norm(64), nn.ReLU()]
    in_channels = 64
    for out_channels, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [BasicBlock(in_channels, out_channels, stride), BasicBlock(out_channels, out_channels, 1)]
        in_channels = out_channels
    backbone = nn.Sequential(*layers, GlobalAveragePool(), nn.Flatten())
    for module in backbone.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
    return backbone


_BACKBONES = {"fmnist_cnn": _fmnist_backbone, "cifar_cnn": _cifar_backbone, "cifar_cnn64": _cifar64_backbone,
              "resnet18_gn": _resnet18_gn_backbone}


def build_model(name: str, num_classes: int = 10, projection_dim: int | None = None, seed: int | None = None,
                classifier_layers: int = 1) -> SplitModel:
    """Build a model by name; with `seed`, its initial weights are a function of the seed alone.
    `classifier_layers` is how many of the last linear layers form the classifier phi (1, or 2 where the
    architecture has two: :data:`fedcme_core.client.architectures.ARCHITECTURES`)."""
    if name not in _BACKBONES:
        raise ValueError(f"model.name: unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
    check_classifier_layers(name, classifier_layers)
    backbone_dim = ARCHITECTURES[name].feature_dims[0]
    fork_devices: list = []
    with torch.random.fork_rng(devices=fork_devices, enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        backbone = _BACKBONES[name]()
        hidden = None
        if classifier_layers == 2:
            # The backbone ends [..., Linear(h_in, h), ReLU]: that Linear becomes phi's first layer.
            *kept, hidden, _ = list(backbone)
            backbone, backbone_dim = nn.Sequential(*kept), hidden.in_features
        return SplitModel(backbone, backbone_dim, num_classes, projection_dim, MODEL_INFERENCE_BATCH[name], hidden)


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
