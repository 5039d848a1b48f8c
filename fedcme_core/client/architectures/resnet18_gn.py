"""``resnet18_gn``: ResNet-18 (He et al. 2016; BasicBlock, [2, 2, 2, 2], widths 64/128/256/512) for
32x32 inputs, with GroupNorm in place of BatchNorm: 3x32x32 -> ... -> 512x4x4 -> 512 -> C. It has one
linear layer, so phi is that layer only (d = 512)."""

from __future__ import annotations

from fedcme_core.client.architectures.base import Architecture, InputShape
from fedcme_core.common.lazy import lazy_module

nn = lazy_module("torch.nn")
layers = lazy_module("fedcme_core.client.layers")


def backbone(input_shape: InputShape) -> nn.Sequential:
    """theta: [B, 3, 32, 32] -> [B, 512]. A 3x3 stride-1 stem without max pool, and GroupNorm with 2
    groups in place of every BatchNorm (the shortcuts' included), as Hsieh et al. 2020 ("The Non-IID
    Data Quagmire of Decentralized Machine Learning", ICML) for learning on non-IID data, where
    BatchNorm's batch statistics differ across clients; GroupNorm has no running statistics, so the
    model's state is all parameters. 3x32x32 -> 64x32x32 -> 128x16x16 -> 256x8x8 -> 512x4x4 -> average
    pool -> 512. Convolutions are initialised as torchvision's ResNet (Kaiming normal, fan out),
    GroupNorm to weight 1, bias 0."""
    modules = [nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False), layers.group_norm(64), nn.ReLU()]
    in_channels = 64
    for out_channels, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        modules += [layers.BasicBlock(in_channels, out_channels, stride), layers.BasicBlock(out_channels, out_channels, 1)]
        in_channels = out_channels
    network = nn.Sequential(*modules, layers.GlobalAveragePool(), nn.Flatten())
    for module in network.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
    return network


# Inference batch 128: a first choice, not measured, kept small because its activations are wide.
ARCHITECTURE = Architecture("resnet18_gn", (3, 32, 32), inference_batch=128, feature_dims=(512,), backbone=backbone)
