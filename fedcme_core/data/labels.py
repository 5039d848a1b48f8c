"""The checks and index helpers every partition method shares (:mod:`fedcme_core.data.partition`)."""

from __future__ import annotations

import math

import numpy as np


class PartitionError(ValueError):
    """A partition cannot be made, or a partition file cannot be trusted; the message says why."""


def validated_labels(labels: np.ndarray) -> np.ndarray:
    """`labels` as int64 [N]; raises PartitionError unless a non-empty 1-d array of non-negative integers."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0:
        raise PartitionError(f"labels must be a non-empty 1-d array, got shape {labels.shape}")
    if labels.dtype == np.bool_ or not np.issubdtype(labels.dtype, np.integer):
        raise PartitionError(f"labels must be integers, got dtype {labels.dtype}")
    if labels.min() < 0:
        raise PartitionError(f"labels must be non-negative, got {labels.min()}")
    return labels.astype(np.int64, copy=False)


def check_arguments(num_samples: int, num_clients: int, alpha: float, min_size: int) -> None:
    """Raises PartitionError naming the first of num_clients, alpha, min_size that cannot partition num_samples."""
    if not is_int(num_clients) or num_clients < 1:
        raise PartitionError(f"num_clients={num_clients!r} must be an int >= 1")
    if not is_number(alpha) or not (math.isfinite(alpha) and alpha > 0):
        raise PartitionError(f"alpha={alpha!r} must be a finite number > 0")
    if not is_int(min_size) or min_size < 0:
        raise PartitionError(f"min_size={min_size!r} must be an int >= 0")
    if num_clients * min_size > num_samples:
        raise PartitionError(
            f"num_clients * min_size = {num_clients} * {min_size} exceeds the {num_samples} samples"
        )
    if num_clients > num_samples:
        raise PartitionError(f"num_clients={num_clients} exceeds the {num_samples} samples")


def is_int(value: object) -> bool:
    """An int or numpy integer, not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """An int, float or numpy number, not a bool."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def indices_by_class(labels: np.ndarray) -> list[np.ndarray]:
    """For each class 0..max(labels), its sample indices in ascending order."""
    order = np.argsort(labels, kind="stable")
    boundaries = np.cumsum(np.bincount(labels))[:-1]
    return [indices.astype(np.int64) for indices in np.split(order, boundaries)]


def sorted_int64(indices: np.ndarray) -> np.ndarray:
    """`indices` as a sorted int64 array."""
    return np.sort(np.asarray(indices, dtype=np.int64))
