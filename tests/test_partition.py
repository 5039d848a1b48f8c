"""Tests for fedcme_core.data.partition and .lognormal: label-dir, iid, log-normal Dirichlet, #C=k."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedcme_core.data.partition import (
    PartitionError,
    PartitionSpec,
    class_counts,
    dirichlet_label_partition,
    iid_partition,
    partition_labels,
)
from fedcme_core.data.lognormal import lognormal_dirichlet_partition

METHODS = ("dirichlet", "iid", "lognormal_dirichlet")


def random_labels(num_samples: int, num_classes: int = 10, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, num_classes, size=num_samples)


def assert_disjoint_cover(parts: list[np.ndarray], num_samples: int) -> None:
    for indices in parts:
        assert indices.dtype == np.int64
        assert np.all(np.diff(indices) > 0), "each client's indices are sorted and unique"
    everything = np.concatenate(parts)
    assert len(everything) == num_samples
    assert np.array_equal(np.sort(everything), np.arange(num_samples))


# --- hand-checkable cases ---------------------------------------------------------------


def test_class_counts_hand_made() -> None:
    labels = np.array([0, 1, 1, 2, 2, 2])
    parts = [np.array([0, 1]), np.array([2, 3, 4, 5])]

    counts = class_counts(labels, parts, num_classes=4)

    assert counts.dtype == np.int64
    assert counts.tolist() == [[1, 1, 0, 0], [0, 1, 3, 0]]


def test_class_counts_rejects_labels_beyond_num_classes() -> None:
    with pytest.raises(PartitionError, match="num_classes=2"):
        class_counts(np.array([0, 1, 2]), [np.array([0, 1, 2])], num_classes=2)


def test_single_client_gets_everything() -> None:
    labels = np.array([2, 0, 1, 0, 2, 1, 1, 0])

    for method in METHODS:
        parts = partition_labels(labels, PartitionSpec(method=method, num_clients=1, alpha=0.5, seed=3, min_size=1))

        assert len(parts) == 1
        assert parts[0].tolist() == list(range(8))


def test_iid_tiny_sizes_and_cover() -> None:
    parts = iid_partition(10, 3, seed=0)

    assert sorted(len(p) for p in parts) == [3, 3, 4]
    assert_disjoint_cover(parts, 10)


def test_lognormal_with_zero_sigma_gives_equal_sizes() -> None:
    labels = random_labels(100, num_classes=4)

    parts = lognormal_dirichlet_partition(labels, num_clients=4, alpha=1.0, sigma=0.0, seed=0, min_size=10)

    assert [len(p) for p in parts] == [25, 25, 25, 25]
    assert_disjoint_cover(parts, 100)


# --- properties on synthetic labels -------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_disjoint_cover_and_min_size(method: str) -> None:
    labels = random_labels(5000)

    parts = partition_labels(labels, PartitionSpec(method=method, num_clients=20, alpha=0.5, seed=1, min_size=30))

    assert len(parts) == 20
    assert_disjoint_cover(parts, len(labels))
    assert min(len(p) for p in parts) >= 30


@pytest.mark.parametrize("method", METHODS)
def test_same_seed_same_partition_other_seed_differs(method: str) -> None:
    labels = random_labels(3000)
    arguments = dict(method=method, num_clients=10, alpha=0.5, min_size=10)

    first = partition_labels(labels, PartitionSpec(seed=7, **arguments))
    again = partition_labels(labels, PartitionSpec(seed=7, **arguments))
    other = partition_labels(labels, PartitionSpec(seed=8, **arguments))

    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))


@pytest.mark.parametrize("method", ["dirichlet", "lognormal_dirichlet"])
def test_independent_of_input_row_order(method: str) -> None:
    labels = random_labels(4000)
    permutation = np.random.default_rng(99).permutation(len(labels))
    permuted_labels = labels[permutation]
    arguments = dict(method=method, num_clients=15, alpha=0.3, seed=5, min_size=10)

    parts = partition_labels(labels, PartitionSpec(**arguments))
    permuted_parts = partition_labels(permuted_labels, PartitionSpec(**arguments))

    assert np.array_equal(class_counts(labels, parts, 10), class_counts(permuted_labels, permuted_parts, 10))
    for indices, permuted_indices in zip(parts, permuted_parts):
        assert Counter(labels[indices].tolist()) == Counter(permuted_labels[permuted_indices].tolist())


@pytest.mark.parametrize("method", ["dirichlet", "lognormal_dirichlet"])
def test_lower_alpha_gives_fewer_classes_per_client(method: str) -> None:
    labels = random_labels(5000)

    def mean_classes_per_client(alpha: float) -> float:
        parts = partition_labels(labels, PartitionSpec(method=method, num_clients=20, alpha=alpha, seed=2, min_size=10))
        return float((class_counts(labels, parts, 10) > 0).sum(axis=1).mean())

    skewed, balanced = mean_classes_per_client(0.1), mean_classes_per_client(10.0)

    assert skewed <= balanced - 3
    assert balanced >= 9.5


def test_quantity_skew() -> None:
    labels = random_labels(6000)

    def size_std(method: str, sigma: float = 0.3) -> float:
        parts = partition_labels(labels, PartitionSpec(method=method, num_clients=30, alpha=1.0, seed=4, sigma=sigma))
        return float(np.std([len(p) for p in parts]))

    assert size_std("iid") < 0.5
    assert size_std("lognormal_dirichlet", sigma=1.0) > 50
    assert size_std("lognormal_dirichlet", sigma=1.0) > size_std("lognormal_dirichlet", sigma=0.1)
    assert size_std("dirichlet") > 10


def test_iid_sizes_differ_by_at_most_one() -> None:
    parts = iid_partition(1003, 10, seed=0)

    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert_disjoint_cover(parts, 1003)


def test_real_size_partitions() -> None:
    labels = random_labels(60000)

    for method in METHODS:
        parts = partition_labels(labels, PartitionSpec(method=method, num_clients=100, alpha=0.1, seed=0))

        assert_disjoint_cover(parts, 60000)
        assert min(len(p) for p in parts) >= 10


def test_lognormal_prior_on_an_exhausted_class_still_covers() -> None:
    # 95% of the samples are class 0: clients whose prior favours class 1 exhaust it early.
    labels = np.where(np.random.default_rng(0).random(2000) < 0.95, 0, 1)

    parts = lognormal_dirichlet_partition(labels, num_clients=20, alpha=0.05, sigma=1.0, seed=3, min_size=5)

    assert_disjoint_cover(parts, 2000)
    assert min(len(p) for p in parts) >= 5


def test_max_attempts_error() -> None:
    labels = np.zeros(100, dtype=np.int64)

    with pytest.raises(PartitionError, match=r"min_size=10 cannot be met for N=100, K=10, alpha=0.01"):
        dirichlet_label_partition(labels, num_clients=10, alpha=0.01, seed=0, min_size=10, max_attempts=5)


@pytest.mark.parametrize(
    ("labels", "arguments", "named"),
    [
        (np.arange(10) % 2, dict(num_clients=0), "num_clients"),
        (np.arange(10) % 2, dict(alpha=0.0), "alpha"),
        (np.arange(10) % 2, dict(alpha=float("nan")), "alpha"),
        (np.arange(10) % 2, dict(num_clients=3, min_size=4), "min_size"),
        (np.arange(10) % 2, dict(method="shards"), "method"),
        (np.arange(10) % 2, dict(method="lognormal_dirichlet", sigma=-1.0), "sigma"),
        (np.zeros((2, 5), dtype=int), {}, "labels"),
        (np.array([0, 1, -1, 1]), {}, "labels"),
        (np.array([0.0, 1.0, 1.0]), {}, "labels"),
        (np.array([], dtype=int), {}, "labels"),
    ],
)
def test_invalid_arguments_are_named(labels: np.ndarray, arguments: dict, named: str) -> None:
    call = dict(method="dirichlet", num_clients=2, alpha=0.5, seed=0, min_size=1) | arguments

    with pytest.raises(PartitionError, match=named):
        partition_labels(labels, PartitionSpec(**call))


# --- hypothesis properties ----------------------------------------------------------------


@st.composite
def label_arrays_and_clients(draw: st.DrawFn) -> tuple[np.ndarray, int]:
    num_clients = draw(st.integers(1, 8))
    num_classes = draw(st.integers(1, 6))
    num_samples = draw(st.integers(num_clients, 200))
    labels = draw(st.lists(st.integers(0, num_classes - 1), min_size=num_samples, max_size=num_samples))
    return np.array(labels, dtype=np.int64), num_clients


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=label_arrays_and_clients(), alpha=st.floats(0.05, 20.0), seed=st.integers(0, 2**31 - 1))
def test_dirichlet_property_disjoint_cover_with_min_size(
    case: tuple[np.ndarray, int], alpha: float, seed: int
) -> None:
    labels, num_clients = case

    try:
        parts = dirichlet_label_partition(labels, num_clients, alpha, seed, min_size=1, max_attempts=100)
    except PartitionError as error:
        assert "cannot be met" in str(error)
        return

    assert len(parts) == num_clients
    assert_disjoint_cover(parts, len(labels))
    assert min(len(p) for p in parts) >= 1


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=label_arrays_and_clients(), alpha=st.floats(0.05, 20.0), seed=st.integers(0, 2**31 - 1))
def test_dirichlet_property_without_min_size_always_succeeds(
    case: tuple[np.ndarray, int], alpha: float, seed: int
) -> None:
    labels, num_clients = case

    parts = dirichlet_label_partition(labels, num_clients, alpha, seed, min_size=0)

    assert_disjoint_cover(parts, len(labels))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=label_arrays_and_clients(),
    alpha=st.floats(0.01, 20.0),
    sigma=st.floats(0.0, 2.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_lognormal_property_exact_cover(
    case: tuple[np.ndarray, int], alpha: float, sigma: float, seed: int
) -> None:
    labels, num_clients = case
    min_size = len(labels) // num_clients // 2

    parts = lognormal_dirichlet_partition(labels, num_clients, alpha, sigma, seed, min_size=min_size)

    assert_disjoint_cover(parts, len(labels))
    assert min(len(p) for p in parts) >= min_size
