"""Tests for fedcme_core.data.datasets: input scaling, synthetic data, subsets, the prepared labels."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedcme_core.data import datasets as data_module
from fedcme_core.data.datasets import (
    DataError,
    Dataset,
    SyntheticSpec,
    experiment_subset,
    load_dataset,
    load_prepared,
    subset,
)
from fedcme_core.data.prepared import experiment_train_labels, save_prepared

from .conftest import REPO_ROOT
from .helpers import assert_normalised_split


# --- input scaling -----------------------------------------------------------------------


def test_unnormalised_images_are_the_raw_bytes_over_255_and_normalised_ones_use_the_channel_statistics() -> None:
    raw = torch.tensor([[[[0, 51]], [[102, 255]], [[255, 0]]]], dtype=torch.uint8).numpy()  # [1, 3, 1, 2]
    arrays = {"x_train": raw, "y_train": torch.tensor([3]).numpy(), "x_test": raw, "y_test": torch.tensor([5]).numpy()}

    plain = data_module.from_raw("cifar10", arrays, normalise=False)
    normalised = data_module.from_raw("cifar10", arrays)

    expected = torch.tensor([[[[0.0, 0.2]], [[0.4, 1.0]], [[1.0, 0.0]]]])
    assert torch.equal(plain.x_train, torch.from_numpy(raw).float() / 255) and torch.allclose(plain.x_train, expected)
    assert plain.mean == (0.0, 0.0, 0.0) and plain.std == (1.0, 1.0, 1.0)
    mean = torch.tensor(data_module.CIFAR10_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(data_module.CIFAR10_STD).view(1, 3, 1, 1)
    assert torch.allclose(normalised.x_test, (expected - mean) / std, atol=1e-6)
    assert normalised.mean == data_module.CIFAR10_MEAN


def test_unnormalised_synthetic_data_keeps_its_values(tmp_path: Path) -> None:
    spec = SyntheticSpec(num_train=200, num_test=50, shape=(1, 28, 28), num_classes=10, seed=1)

    plain = load_dataset("synthetic", data_dir=tmp_path, synthetic=spec, normalise=False)
    normalised = load_dataset("synthetic", data_dir=tmp_path, synthetic=spec)

    mean, std = plain.x_train.mean(), plain.x_train.std()
    assert not torch.allclose(mean, torch.zeros(())) or not torch.allclose(std, torch.ones(()))
    assert torch.allclose((plain.x_train - mean) / std, normalised.x_train, atol=1e-3)


# --- synthetic data ----------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32)])
def test_synthetic_shapes_and_normalisation(shape: tuple[int, int, int], tmp_path: Path) -> None:
    spec = SyntheticSpec(num_train=600, num_test=200, shape=shape, num_classes=10, seed=1)

    dataset = load_dataset("synthetic", data_dir=tmp_path, synthetic=spec)

    assert dataset.name == "synthetic"
    assert_normalised_split(dataset.x_train, dataset.y_train, 600, shape)
    assert_normalised_split(dataset.x_test, dataset.y_test, 200, shape)
    assert dataset.input_shape == shape
    assert len(dataset.mean) == len(dataset.std) == shape[0]
    assert torch.allclose(dataset.x_train.mean(dim=(0, 2, 3)), torch.zeros(shape[0]), atol=1e-4)
    assert torch.allclose(dataset.x_train.std(dim=(0, 2, 3)), torch.ones(shape[0]), atol=1e-3)
    assert set(dataset.y_train.tolist()) == set(range(10))
    assert list(tmp_path.iterdir()) == []


def test_synthetic_is_deterministic_and_seeded(tmp_path: Path) -> None:
    spec = SyntheticSpec(num_train=300, num_test=100, seed=5)

    first = load_dataset("synthetic", data_dir=tmp_path, synthetic=spec)
    again = load_dataset("synthetic", data_dir=tmp_path, synthetic=spec)
    other_spec = SyntheticSpec(num_train=300, num_test=100, seed=6)
    other = load_dataset("synthetic", data_dir=tmp_path, synthetic=other_spec)

    assert torch.equal(first.x_train, again.x_train) and torch.equal(first.y_test, again.y_test)
    assert not torch.equal(first.x_train, other.x_train)
    assert not torch.equal(first.x_train[:100], first.x_test)


def test_synthetic_classes_are_separable_by_their_templates(tmp_path: Path) -> None:
    dataset = load_dataset("synthetic", data_dir=tmp_path, synthetic=SyntheticSpec())
    class_means = torch.stack([dataset.x_train[dataset.y_train == c].mean(dim=0) for c in range(10)])

    distances = torch.cdist(dataset.x_test.flatten(1), class_means.flatten(1))
    nearest_template_accuracy = (distances.argmin(dim=1) == dataset.y_test).float().mean().item()

    assert nearest_template_accuracy > 0.9


def test_invalid_synthetic_spec_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="synthetic shape"):
        load_dataset("synthetic", data_dir=tmp_path, synthetic=SyntheticSpec(shape=(28, 28)))


# --- subsets ----------------------------------------------------------------------------


def indexed_dataset(num_train: int, num_test: int) -> Dataset:
    """A dataset whose sample i is the constant image i, so a subset shows which rows it kept."""

    def images(count: int) -> torch.Tensor:
        row_numbers = torch.arange(count, dtype=torch.float32).view(count, 1, 1, 1)
        return row_numbers.expand(count, 1, 2, 2).contiguous()

    return Dataset(
        name="indexed",
        x_train=images(num_train),
        y_train=torch.arange(num_train) % 3,
        x_test=images(num_test),
        y_test=torch.arange(num_test) % 3,
        num_classes=3,
        mean=(0.0,),
        std=(1.0,),
    )


def test_subset_sizes_order_and_determinism() -> None:
    dataset = indexed_dataset(100, 40)

    small = subset(dataset, train=10, test=None, seed=3)
    again = subset(dataset, train=10, test=None, seed=3)
    other = subset(dataset, train=10, test=None, seed=4)

    kept_rows = small.x_train[:, 0, 0, 0].long()
    assert small.x_train.shape == (10, 1, 2, 2) and small.x_train.is_contiguous()
    assert torch.all(kept_rows[1:] > kept_rows[:-1])
    assert torch.equal(small.y_train, kept_rows % 3)
    assert small.x_test is dataset.x_test
    assert torch.equal(small.x_train, again.x_train)
    assert not torch.equal(small.x_train, other.x_train)


def test_subset_of_both_splits_and_whole_split() -> None:
    dataset = indexed_dataset(50, 20)

    both = subset(dataset, train=5, test=7, seed=0)
    whole = subset(dataset, train=50, test=None, seed=0)

    assert (len(both.y_train), len(both.y_test)) == (5, 7)
    assert torch.equal(whole.x_train, dataset.x_train)


def test_subset_larger_than_split_is_refused() -> None:
    with pytest.raises(DataError, match=r"test subset size 21 must be an int in \[0, 20\]"):
        subset(indexed_dataset(50, 20), train=None, test=21, seed=0)


@pytest.mark.parametrize("train", [None, 37])
def test_experiment_train_labels_are_the_labels_the_run_trains_on(tmp_path, train) -> None:
    rng = np.random.default_rng(0)
    arrays = {"x_train": rng.integers(0, 256, (90, 1, 28, 28), dtype=np.uint8),
              "y_train": rng.integers(0, 10, 90, dtype=np.uint8),
              "x_test": rng.integers(0, 256, (20, 1, 28, 28), dtype=np.uint8), "y_test": rng.integers(0, 10, 20, dtype=np.uint8)}
    save_prepared("fmnist", arrays, tmp_path)

    labels = experiment_train_labels(tmp_path, "fmnist", train, seed=5)

    run = experiment_subset(load_prepared(tmp_path, "fmnist"), train, None, 5)
    assert labels.dtype == np.int64 and len(labels) == (train or 90)
    assert np.array_equal(labels, run.y_train.numpy())
    if train is not None:  # a subset's labels, not the first rows'
        assert not np.array_equal(labels, arrays["y_train"][:train])
    with pytest.raises(DataError, match="holds prepared 'fmnist', but the config's data.dataset is 'cifar10'"):
        experiment_train_labels(tmp_path, "cifar10", train, seed=5)


def test_dataset_checks_its_tensors() -> None:
    with pytest.raises(DataError, match="y_train must be int64"):
        Dataset(
            name="broken",
            x_train=torch.zeros(4, 1, 2, 2),
            y_train=torch.zeros(3, dtype=torch.int64),
            x_test=torch.zeros(2, 1, 2, 2),
            y_test=torch.zeros(2, dtype=torch.int64),
            num_classes=2,
            mean=(0.0,),
            std=(1.0,),
        )


@pytest.mark.slow  # a fresh interpreter importing the flows (Prefect, MLflow)
def test_importing_the_data_module_leaves_torchvision_unloaded() -> None:
    # torchvision pulls in torch._dynamo (about 2 s of every command's start-up); only a
    # Fashion-MNIST read or a download needs it.
    code = "import sys, fedcme_core.data.datasets, flows.orchestration.train; print('torchvision' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    assert result.stdout.strip() == "False"
