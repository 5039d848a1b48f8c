"""Layers that architectures build from (torch): ResNet's basic block with GroupNorm and a global
average pool that is deterministic on CUDA. An architecture module reads them through
``lazy_module("fedcme_core.client.layers")``, so that its declaration stays torch-free."""

from __future__ import annotations

import torch
from torch import nn

GROUP_NORM_GROUPS = 2  # resnet18_gn: GroupNorm(2, channels), as Hsieh et al. 2020


def group_norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(GROUP_NORM_GROUPS, channels)


class BasicBlock(nn.Module):
    """ResNet's basic block with GroupNorm: [B, c_in, H, W] -> [B, c_out, H / stride, W / stride].
    Two 3x3 convolutions (no bias), each followed by GroupNorm; the shortcut is the identity, or a
    1x1 strided convolution and GroupNorm where the shape changes; ReLU after the sum."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.norm1 = group_norm(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, stride=1, padding=1, bias=False)
        self.norm2 = group_norm(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                                          group_norm(out_channels))

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
