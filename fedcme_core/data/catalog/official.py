"""The paper's datasets, Fashion-MNIST and CIFAR-10: their official splits, verified, from the local
mirror or torchvision's download (:mod:`fedcme_core.data.sources`), with their fixed shapes, 10 classes
and the well-known training-set channel statistics (never derived again)."""

from __future__ import annotations

import numpy as np

from fedcme_core.data.catalog.base import Source, SourceSettings
from fedcme_core.data.sources import load_raw

# Training-set channel statistics of pixels/255 (the values used throughout the literature).
FMNIST_MEAN, FMNIST_STD = (0.2860,), (0.3530,)
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


class Official(Source):
    """An official dataset: its raw uint8 arrays come from :func:`fedcme_core.data.sources.load_raw`."""

    num_classes = 10

    def arrays(self, settings: SourceSettings) -> dict[str, np.ndarray]:
        return load_raw(self.name, data_dir=settings.data_dir, mirror=settings.mirror)


class FashionMNIST(Official):
    name = "fmnist"
    label = "FMNIST"
    input_shape = (1, 28, 28)
    statistics = (FMNIST_MEAN, FMNIST_STD)


class CIFAR10(Official):
    name = "cifar10"
    label = "CIFAR-10"
    input_shape = (3, 32, 32)
    statistics = (CIFAR10_MEAN, CIFAR10_STD)
    augment = "crop_flip"  # NIID-Bench's and MOON's CIFAR-10 training transform (SPEC.md, Data)
