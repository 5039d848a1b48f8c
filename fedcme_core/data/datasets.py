"""Datasets as normalised in-memory tensors for FedCME and its baselines.

FedCME (Nie, Xiao, Yang, Wu, "FedCME: Client Matching and Classifier Exchanging to Handle
Data Heterogeneity in Federated Learning", arXiv:2307.08574) is evaluated on Fashion-MNIST
and CIFAR-10 with their official train/test splits. This module loads either one into
float32 tensors [N, C, H, W], normalised per channel with the well-known training-set
mean/std, with int64 labels [N]; models index these tensors directly (no per-sample PIL
transform in the training loop).

The official files come, verified, from a local mirror or torchvision's download
(:mod:`fedcme_core.data.sources`).

A ``synthetic`` dataset (per-class fixed random templates plus Gaussian noise, any shape)
serves tests and smoke runs without real data.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedcme_core.common.lazy import lazy_module
from fedcme_core.common.seeding import numpy_rng
from fedcme_core.data.prepared import read_prepared, subset_rows, subset_seed
from fedcme_core.data.sources import RAW_DATASETS, DataError, load_raw

# Torch only when a dataset is built: the partition stage reads labels (fedcme_core.data.prepared).
torch = lazy_module("torch")
F = lazy_module("torch.nn.functional")

DATASETS = (*RAW_DATASETS, "synthetic")  # the official datasets, then the synthetic one

# Training-set channel statistics of pixels/255 (the values used throughout the literature).
FMNIST_MEAN, FMNIST_STD = (0.2860,), (0.3530,)
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)

@dataclass(frozen=True, eq=False)
class Dataset:
    """One dataset's official train/test split as normalised in-memory tensors.

    ``x_*`` are contiguous float32 [N, C, H, W], already normalised with ``mean``/``std``;
    ``y_*`` are contiguous int64 [N] with values in [0, num_classes).
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __post_init__(self) -> None:
        for split, images, labels in (
            ("train", self.x_train, self.y_train),
            ("test", self.x_test, self.y_test),
        ):
            if images.dtype != torch.float32 or images.dim() != 4:
                raise DataError(
                    f"dataset {self.name}: x_{split} must be float32 [N, C, H, W], "
                    f"got {images.dtype} {tuple(images.shape)}"
                )
            if labels.dtype != torch.int64 or labels.dim() != 1 or len(labels) != len(images):
                raise DataError(
                    f"dataset {self.name}: y_{split} must be int64 [{len(images)}], "
                    f"got {labels.dtype} {tuple(labels.shape)}"
                )
        if self.x_train.shape[1:] != self.x_test.shape[1:]:
            raise DataError(
                f"dataset {self.name}: train images {tuple(self.x_train.shape[1:])} and "
                f"test images {tuple(self.x_test.shape[1:])} differ in shape"
            )
        channels = self.x_train.shape[1]
        if len(self.mean) != channels or len(self.std) != channels:
            raise DataError(
                f"dataset {self.name}: mean/std need {channels} channel values, "
                f"got {len(self.mean)}/{len(self.std)}"
            )

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one sample."""
        channels, height, width = self.x_train.shape[1:]
        return int(channels), int(height), int(width)


@dataclass(frozen=True)
class SyntheticSpec:
    """A synthetic dataset: ``template[label] + noise * N(0, 1)`` per sample.

    Each class has one fixed smooth random template of ``shape`` (C, H, W); labels are
    uniform random; train and test are independent draws from the same distribution.
    """

    num_train: int = 2000
    num_test: int = 500
    shape: tuple[int, int, int] = (1, 28, 28)
    num_classes: int = 10
    noise: float = 1.0
    seed: int = 0


def load_dataset(
    name: str,
    *,
    data_dir: Path,
    mirror: Path | None = None,
    synthetic: SyntheticSpec | None = None,
    normalise: bool = True,
) -> Dataset:
    """Load dataset `name` (one of DATASETS) as normalised in-memory tensors.

    `data_dir` receives decompressed files, downloads and verification stamps; `mirror`
    (see :func:`fedcme_core.data.sources.resolve_mirror`) is only read. `synthetic` configures the "synthetic" dataset
    (defaults: SyntheticSpec()). `normalise=False` keeps the images in [0, 1] (mean 0, std 1).
    """
    if name == "synthetic":
        return make_synthetic(synthetic or SyntheticSpec(), normalise=normalise)
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}: expected one of {', '.join(DATASETS)}")
    return from_raw(name, load_raw(name, data_dir=data_dir, mirror=mirror), normalise=normalise)


STATISTICS = {"fmnist": (FMNIST_MEAN, FMNIST_STD), "cifar10": (CIFAR10_MEAN, CIFAR10_STD)}


def unit_statistics(channels: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) that leave the images as they are: 0 and 1 per channel (``normalise=False``)."""
    return (0.0,) * channels, (1.0,) * channels


def from_raw(name: str, arrays: dict[str, np.ndarray], normalise: bool = True) -> Dataset:
    """Raw uint8 arrays as float32 images: normalised with the dataset's channel statistics, or with
    `normalise=False` scaled to [0, 1] only (mean 0, std 1: NIID-Bench's CIFAR-10 inputs)."""
    mean, std = STATISTICS[name] if normalise else unit_statistics(len(STATISTICS[name][0]))
    return Dataset(
        name=name,
        x_train=_normalise(torch.from_numpy(np.asarray(arrays["x_train"])), mean, std),
        y_train=_labels(arrays["y_train"]),
        x_test=_normalise(torch.from_numpy(np.asarray(arrays["x_test"])), mean, std),
        y_test=_labels(arrays["y_test"]),
        num_classes=10,
        mean=mean,
        std=std,
    )


def load_prepared(directory: Path, expected_name: str | None = None, normalise: bool = True) -> Dataset:
    """Load a folder written by :func:`save_prepared`, verifying every array's sha256
    (`normalise`: as :func:`from_raw`)."""
    return from_raw(*read_prepared(directory, expected_name), normalise=normalise)


def make_synthetic(spec: SyntheticSpec, normalise: bool = True) -> Dataset:
    """The synthetic dataset of `spec`: a pure function of the spec (seed included); normalised with
    its own training-set statistics unless `normalise=False`."""
    _validate_synthetic(spec)
    templates = _synthetic_templates(spec)
    x_train, y_train = _synthetic_split(spec, templates, spec.num_train, "synthetic-train")
    x_test, y_test = _synthetic_split(spec, templates, spec.num_test, "synthetic-test")
    mean = x_train.mean(axis=(0, 2, 3), dtype=np.float64)
    std = x_train.std(axis=(0, 2, 3), dtype=np.float64)
    if np.any(std == 0):
        raise DataError("synthetic dataset: a channel has zero variance; use noise > 0 or more samples")
    mean_tuple, std_tuple = ((tuple(float(value) for value in mean), tuple(float(value) for value in std))
                             if normalise else unit_statistics(len(mean)))
    return Dataset(
        name="synthetic",
        x_train=_normalise(torch.from_numpy(x_train), mean_tuple, std_tuple, scale=1.0),
        y_train=torch.from_numpy(y_train),
        x_test=_normalise(torch.from_numpy(x_test), mean_tuple, std_tuple, scale=1.0),
        y_test=torch.from_numpy(y_test),
        num_classes=spec.num_classes,
        mean=mean_tuple,
        std=std_tuple,
    )


def subset(dataset: Dataset, *, train: int | None, test: int | None, seed: int) -> Dataset:
    """A seeded random subset of the train and/or test split (None keeps a split whole).

    Chosen indices are sorted ascending, so samples keep their original order.
    """
    x_train, y_train = _subset_split(dataset, "train", dataset.x_train, dataset.y_train, train, seed)
    x_test, y_test = _subset_split(dataset, "test", dataset.x_test, dataset.y_test, test, seed)
    return dataclasses.replace(dataset, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


def experiment_subset(dataset: Dataset, train: int | None, test: int | None, seed: int) -> Dataset:
    """The seeded train/test subsets of an experiment (``data.train_subset``, ``data.test_subset``)."""
    if train is None and test is None:
        return dataset
    return subset(dataset, train=train, test=test, seed=subset_seed(seed))


def _subset_split(
    dataset: Dataset,
    split: str,
    images: torch.Tensor,
    labels: torch.Tensor,
    size: int | None,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    index = subset_rows(dataset.name, split, len(labels), size, seed)
    if index is None:
        return images, labels
    rows = torch.from_numpy(index)
    return images[rows].contiguous(), labels[rows].contiguous()


def _labels(values: torch.Tensor | np.ndarray | list[int]) -> torch.Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.int64)).contiguous()


def _normalise(
    images: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...], *, scale: float = 255.0
) -> torch.Tensor:
    """(images / scale - mean) / std per channel, as a new contiguous float32 [N, C, H, W]."""
    channels = images.shape[1]
    mean_tensor = torch.tensor(mean, dtype=torch.float32).view(1, channels, 1, 1)
    std_tensor = torch.tensor(std, dtype=torch.float32).view(1, channels, 1, 1)
    normalised = images.to(torch.float32, copy=True).contiguous()
    normalised.div_(scale).sub_(mean_tensor).div_(std_tensor)
    return normalised


def _validate_synthetic(spec: SyntheticSpec) -> None:
    if len(spec.shape) != 3 or any(int(size) < 1 for size in spec.shape):
        raise DataError(f"synthetic shape {spec.shape} must be three positive sizes (C, H, W)")
    if spec.num_train < 2 or spec.num_test < 0:
        raise DataError(
            f"synthetic num_train={spec.num_train} must be >= 2 and num_test={spec.num_test} >= 0"
        )
    if spec.num_classes < 1:
        raise DataError(f"synthetic num_classes={spec.num_classes} must be >= 1")
    if spec.noise < 0:
        raise DataError(f"synthetic noise={spec.noise} must be >= 0")


def _synthetic_templates(spec: SyntheticSpec) -> np.ndarray:
    """One smooth random pattern per class, float32 [num_classes, C, H, W].

    Standard-normal values on a grid 4x coarser than the image, bilinearly upsampled: the
    classes differ in local spatial structure, which a small CNN picks up quickly, while
    per-pixel noise of the same scale keeps single pixels uninformative.
    """
    channels, height, width = (int(size) for size in spec.shape)
    coarse_shape = (spec.num_classes, channels, max(1, -(-height // 4)), max(1, -(-width // 4)))
    coarse = numpy_rng(spec.seed, "synthetic-templates").standard_normal(coarse_shape, dtype=np.float32)
    smooth = F.interpolate(
        torch.from_numpy(coarse), size=(height, width), mode="bilinear", align_corners=False
    )
    return smooth.numpy()


def _synthetic_split(
    spec: SyntheticSpec, templates: np.ndarray, count: int, tag: str
) -> tuple[np.ndarray, np.ndarray]:
    rng = numpy_rng(spec.seed, tag)
    labels = rng.integers(0, spec.num_classes, size=count, dtype=np.int64)
    noise = rng.standard_normal((count, *templates.shape[1:]), dtype=np.float32)
    images = templates[labels] + np.float32(spec.noise) * noise
    return np.ascontiguousarray(images, dtype=np.float32), labels
