"""Datasets as normalised in-memory tensors for FedCME and its baselines.

FedCME (Nie, Xiao, Yang, Wu, "FedCME: Client Matching and Classifier Exchanging to Handle
Data Heterogeneity in Federated Learning", arXiv:2307.08574) is evaluated on Fashion-MNIST
and CIFAR-10 with their official train/test splits. This module loads any registered source
(:mod:`fedcme_core.data.catalog`: those two, ``synthetic``, a researcher's ``npz`` or
``imagefolder``) into float32 tensors [N, C, H, W], normalised per channel with the training-set
mean/std (the well-known values for the official datasets, derived from the training set for the
others), with int64 labels [N]; models index these tensors directly (no per-sample PIL transform
in the training loop).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedcme_core.common.lazy import lazy_module
from fedcme_core.data.catalog import (
    SOURCES, DatasetFacts, SourceSettings, SyntheticSpec, declared_facts, read_source,
)
from fedcme_core.data.catalog.official import CIFAR10_MEAN, CIFAR10_STD, FMNIST_MEAN, FMNIST_STD  # noqa: F401
from fedcme_core.data.prepared import prepared_meta, read_prepared, subset_rows, subset_seed
from fedcme_core.data.sources import DataError
from fedcme_core.data.validation import validation_split

# Torch only when a dataset is built: the partition stage reads labels (fedcme_core.data.prepared).
torch = lazy_module("torch")

DATASETS = tuple(SOURCES)  # the registered sources: the official datasets, synthetic, npz, imagefolder


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


def load_dataset(
    name: str,
    *,
    data_dir: Path,
    mirror: Path | None = None,
    synthetic: SyntheticSpec | None = None,
    normalise: bool = True,
    path: Path | str | None = None,
) -> Dataset:
    """Load the registered source `name` (:data:`fedcme_core.data.catalog.SOURCES`) as normalised
    in-memory tensors.

    `data_dir` receives decompressed files, downloads and verification stamps; `mirror`
    (see :func:`fedcme_core.data.sources.resolve_mirror`) is only read; `path` is ``data.path``, the
    data of a source that reads a researcher's own files. `synthetic` configures the "synthetic"
    dataset (defaults: SyntheticSpec()). `normalise=False` keeps the images in [0, 1] (mean 0, std 1).
    """
    settings = SourceSettings(Path(data_dir), mirror, Path(path) if path is not None else None,
                              synthetic or SyntheticSpec())
    data = read_source(name, settings)
    return from_raw(name, data.arrays, normalise=normalise, facts=data.facts)


def unit_statistics(channels: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) that leave the images as they are: 0 and 1 per channel (``normalise=False``)."""
    return (0.0,) * channels, (1.0,) * channels


def from_raw(name: str, arrays: dict[str, np.ndarray], normalise: bool = True,
             facts: DatasetFacts | None = None) -> Dataset:
    """Raw arrays (images uint8 or float32 [N, C, H, W], labels int64) as float32 images: normalised
    with the dataset's channel statistics, or with `normalise=False` scaled only (uint8 to [0, 1], mean
    0, std 1: NIID-Bench's CIFAR-10 inputs). `facts` (classes and statistics) default to what the
    source `name` declares."""
    facts = facts or declared_facts(name, np.asarray(arrays["x_train"]).shape[1:])
    mean, std = (facts.mean, facts.std) if normalise else unit_statistics(len(facts.mean))
    scale = 255.0 if np.asarray(arrays["x_train"]).dtype == np.uint8 else 1.0
    return Dataset(
        name=name,
        x_train=_normalise(torch.from_numpy(np.asarray(arrays["x_train"])), mean, std, scale=scale),
        y_train=_labels(arrays["y_train"]),
        x_test=_normalise(torch.from_numpy(np.asarray(arrays["x_test"])), mean, std, scale=scale),
        y_test=_labels(arrays["y_test"]),
        num_classes=facts.num_classes,
        mean=mean,
        std=std,
    )


def load_prepared(directory: Path, expected_name: str | None = None, normalise: bool = True) -> Dataset:
    """Load a folder written by :func:`fedcme_core.data.prepared.save_prepared`, verifying every array's
    sha256, with the facts it records (else those its source declares); `normalise`: as :func:`from_raw`."""
    meta = prepared_meta(directory)
    name, arrays = read_prepared(directory, expected_name)
    facts = DatasetFacts.from_json(meta["derived"]) if "derived" in meta else None
    return from_raw(name, arrays, normalise=normalise, facts=facts)


def make_synthetic(spec: SyntheticSpec, normalise: bool = True) -> Dataset:
    """The synthetic dataset of `spec`: a pure function of the spec (seed included); normalised with
    its own training-set statistics unless `normalise=False`."""
    data = read_source("synthetic", SourceSettings(synthetic=spec))
    return from_raw("synthetic", data.arrays, normalise=normalise, facts=data.facts)


def subset(dataset: Dataset, *, train: int | None, test: int | None, seed: int) -> Dataset:
    """A seeded random subset of the train and/or test split (None keeps a split whole).

    Chosen indices are sorted ascending, so samples keep their original order.
    """
    x_train, y_train = _subset_split(dataset, "train", dataset.x_train, dataset.y_train, train, seed)
    x_test, y_test = _subset_split(dataset, "test", dataset.x_test, dataset.y_test, test, seed)
    return dataclasses.replace(dataset, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


def experiment_subset(dataset: Dataset, train: int | None, test: int | None, seed: int,
                      validation_fraction: float = 0.0, evaluate_on: str = "test") -> Dataset:
    """The seeded train/test subsets of an experiment (``data.train_subset``, ``data.test_subset``),
    then its validation hold-out (``data.validation_fraction``, ``data.evaluate_on``:
    :func:`hold_out_validation`)."""
    if train is not None or test is not None:
        dataset = subset(dataset, train=train, test=test, seed=subset_seed(seed))
    return hold_out_validation(dataset, validation_fraction, seed, evaluate_on)


def hold_out_validation(dataset: Dataset, fraction: float, seed: int, evaluate_on: str = "test") -> Dataset:
    """`dataset` without its validation rows (:func:`fedcme_core.data.validation.validation_split` of
    y_train with `fraction` and `seed`) in the training split, so no partition holds them; with
    `evaluate_on` "validation" (a tuning run) the validation rows take the test split's place, and
    the test arrays are dropped: whatever evaluates the run reads the validation set, never the test
    set. `fraction` 0 returns `dataset` itself."""
    if evaluate_on not in ("test", "validation"):
        raise DataError(f"data.evaluate_on: {evaluate_on!r} must be test or validation")
    if fraction == 0:
        if evaluate_on == "validation":
            raise DataError("data.evaluate_on: validation needs a data.validation_fraction above 0")
        return dataset
    train_rows, validation_rows = (torch.from_numpy(rows) for rows in
                                   validation_split(dataset.y_train.numpy(), fraction, seed))
    held_x, held_y = dataset.x_train[validation_rows].contiguous(), dataset.y_train[validation_rows].contiguous()
    x_test, y_test = (held_x, held_y) if evaluate_on == "validation" else (dataset.x_test, dataset.y_test)
    return dataclasses.replace(dataset, x_train=dataset.x_train[train_rows].contiguous(),
                               y_train=dataset.y_train[train_rows].contiguous(), x_test=x_test, y_test=y_test)


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
