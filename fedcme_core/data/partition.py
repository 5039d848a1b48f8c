"""Client partitions of a labelled dataset: label skew and quantity skew.

FedCME (Nie, Xiao, Yang, Wu, arXiv:2307.08574) is evaluated on non-IID splits of
Fashion-MNIST and CIFAR-10 over K clients. A partition is a pure function of
(labels, method, K, alpha, seed, min_size, sigma); every random choice comes from one
numpy Generator, ``numpy_rng(seed, "partition")``. Methods:

* ``dirichlet`` (default; NIID-Bench / MOON "label-dir"): for each class c in order, its
  indices are shuffled, p ~ Dir_K(alpha) is drawn, p_k is set to 0 for every client that
  already holds >= N/K samples, p is renormalised, and the class is split at
  ``(cumsum(p) * n_c).astype(int)[:-1]``. The whole draw is repeated until every client
  holds >= min_size samples. A draw in which every still-open client got p_k == 0
  (floating-point underflow at tiny alpha) counts as a failed attempt **(choice)**.
* ``iid``: a seeded shuffle of all indices cut into K near-equal parts.
* ``labels_per_client`` (NIID-Bench's ``noniid-#label{k}``, "#C=k"): client i holds label
  i mod C and k-1 other distinct labels drawn uniformly; each label's indices are shuffled and
  split evenly (``np.array_split``) among the clients holding it, in client order. With k = C
  every client holds every label. When K < C the label sets are drawn again until every label
  is held (NIID-Bench's "reselect"); with K >= C the first labels already cover them all.
* ``lognormal_dirichlet`` (FedLab's "unbalanced dirichlet"): client sizes ~
  LogNormal(log(N/K), sigma) scaled to sum to N, each client has a Dir(alpha) class prior,
  and samples are dealt one at a time: clients come in a seeded random order (a shuffled
  sequence holding client k size_k times) **(choice)**; each draws a class from its prior
  renormalised over the classes that still have samples left and takes that class's next
  unused index (each class's indices are shuffled first) **(choice)**.

Every client's indices are returned sorted ascending as int64. :mod:`fedcme_core.data.partition_file`
keeps a partition with the parameters that made it, as a byte-reproducible ``.npz``.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from fedcme_core.common.seeding import numpy_rng

PartitionMethod = Literal["dirichlet", "iid", "lognormal_dirichlet", "labels_per_client"]
PARTITION_METHODS: tuple[str, ...] = ("dirichlet", "iid", "lognormal_dirichlet", "labels_per_client")


class PartitionError(ValueError):
    """A partition cannot be made, or a partition file cannot be trusted; the message says why."""


def dirichlet_label_partition(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    seed: int,
    min_size: int = 10,
    max_attempts: int = 1000,
) -> list[np.ndarray]:
    """NIID-Bench label-dir partition of `labels` over `num_clients` clients (see module doc)."""
    labels = validated_labels(labels)
    _validate_arguments(len(labels), num_clients, alpha, min_size)
    if max_attempts < 1:
        raise PartitionError(f"max_attempts={max_attempts} must be >= 1")
    num_samples = len(labels)
    class_indices = _indices_by_class(labels)
    size_cap = num_samples / num_clients
    rng = numpy_rng(seed, "partition")
    concentration = np.full(num_clients, float(alpha))
    for _ in range(max_attempts):
        client_chunks: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        client_sizes = np.zeros(num_clients, dtype=np.int64)
        draw_failed = False
        for indices_of_class in class_indices:
            shuffled = indices_of_class.copy()
            rng.shuffle(shuffled)
            proportions = rng.dirichlet(concentration)
            proportions = np.where(client_sizes < size_cap, proportions, 0.0)
            total = proportions.sum()
            if not total > 0:
                draw_failed = True
                break
            proportions = proportions / total
            cut_points = (np.cumsum(proportions) * len(shuffled)).astype(int)[:-1]
            for client, chunk in enumerate(np.split(shuffled, cut_points)):
                client_chunks[client].append(chunk)
                client_sizes[client] += len(chunk)
        if not draw_failed and client_sizes.min() >= min_size:
            return [_sorted_int64(np.concatenate(chunks)) for chunks in client_chunks]
    raise PartitionError(
        f"dirichlet partition: min_size={min_size} cannot be met for N={num_samples}, "
        f"K={num_clients}, alpha={alpha} after {max_attempts} attempts"
    )


def iid_partition(num_samples: int, num_clients: int, seed: int) -> list[np.ndarray]:
    """A seeded shuffle of range(num_samples) cut into `num_clients` near-equal parts."""
    if not _is_int(num_samples) or num_samples < 1:
        raise PartitionError(f"num_samples={num_samples!r} must be an int >= 1")
    _validate_arguments(int(num_samples), num_clients, 1.0, 0)
    permutation = numpy_rng(seed, "partition").permutation(int(num_samples))
    return [_sorted_int64(part) for part in np.array_split(permutation, num_clients)]


def lognormal_dirichlet_partition(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    sigma: float,
    seed: int,
    min_size: int = 10,
) -> list[np.ndarray]:
    """FedLab's unbalanced Dirichlet partition: log-normal sizes, Dir(alpha) class priors."""
    labels = validated_labels(labels)
    _validate_arguments(len(labels), num_clients, alpha, min_size)
    if not _is_number(sigma) or not (math.isfinite(sigma) and sigma >= 0):
        raise PartitionError(f"sigma={sigma!r} must be a finite number >= 0")
    num_samples = len(labels)
    num_classes = int(labels.max()) + 1
    rng = numpy_rng(seed, "partition")
    client_sizes = _lognormal_sizes(rng, num_samples, num_clients, float(sigma), min_size)
    class_priors = rng.dirichlet(np.full(num_classes, float(alpha)), size=num_clients)
    class_indices = _indices_by_class(labels)
    for indices_of_class in class_indices:
        rng.shuffle(indices_of_class)
    client_order = rng.permutation(np.repeat(np.arange(num_clients), client_sizes))
    drawn_classes = _deal_classes(rng, client_order, class_priors, np.array([len(c) for c in class_indices]))
    # The j-th draw of class c takes the j-th index of c's shuffled list.
    by_class = np.argsort(drawn_classes, kind="stable")
    assigned = np.empty(num_samples, dtype=np.int64)
    assigned[by_class] = np.concatenate(class_indices)
    owner_order = np.argsort(client_order, kind="stable")
    boundaries = np.cumsum(client_sizes)[:-1]
    return [_sorted_int64(part) for part in np.split(assigned[owner_order], boundaries)]


def client_label_sets(num_clients: int, num_classes: int, labels_per_client: int, rng: np.random.Generator,
                      max_attempts: int = 1000) -> list[np.ndarray]:
    """#C=k: client i's labels, i mod C first, then k-1 distinct others uniformly, drawn again
    until every label is held (see module doc)."""
    if not _is_int(labels_per_client) or not 1 <= labels_per_client <= num_classes:
        raise PartitionError(f"labels_per_client={labels_per_client!r} must be an int in 1..{num_classes} (the classes)")
    if num_clients * labels_per_client < num_classes:
        raise PartitionError(f"{num_clients} clients x {labels_per_client} labels cannot cover the {num_classes} classes")
    for _ in range(max_attempts):
        sets = []
        for client in range(num_clients):
            first = client % num_classes
            others = np.delete(np.arange(num_classes), first)
            sets.append(np.sort(np.concatenate([[first], rng.choice(others, labels_per_client - 1, replace=False)])))
        if len(np.unique(np.concatenate(sets))) == num_classes:
            return [label_set.astype(np.int64) for label_set in sets]
    raise PartitionError(f"labels_per_client: no draw of {num_clients} clients x {labels_per_client} labels covered "
                         f"all {num_classes} classes in {max_attempts} attempts")


def labels_per_client_partition(labels: np.ndarray, num_clients: int, labels_per_client: int, seed: int,
                                min_size: int = 10) -> list[np.ndarray]:
    """NIID-Bench's #C=k partition of `labels` over `num_clients` clients (see module doc)."""
    labels = validated_labels(labels)
    _validate_arguments(len(labels), num_clients, 1.0, min_size)
    rng = numpy_rng(seed, "partition")
    class_indices = _indices_by_class(labels)
    label_sets = client_label_sets(num_clients, len(class_indices), labels_per_client, rng)
    chunks: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for label, indices_of_class in enumerate(class_indices):
        holders = [client for client, label_set in enumerate(label_sets) if label in label_set]
        shuffled = indices_of_class.copy()
        rng.shuffle(shuffled)
        for client, part in zip(holders, np.array_split(shuffled, len(holders))):
            chunks[client].append(part)
    parts = [_sorted_int64(np.concatenate(client_chunks)) for client_chunks in chunks]
    smallest = min(len(part) for part in parts)
    if smallest < min_size:
        raise PartitionError(f"labels_per_client: a client holds {smallest} samples, fewer than min_size={min_size}")
    return parts


def partition_labels(
    labels: np.ndarray,
    *,
    method: PartitionMethod,
    num_clients: int,
    alpha: float,
    seed: int,
    min_size: int = 10,
    sigma: float = 0.3,
    labels_per_client: int | None = None,
) -> list[np.ndarray]:
    """Partition `labels` over `num_clients` clients with `method` (one of PARTITION_METHODS);
    `labels_per_client` is k of method labels_per_client."""
    labels = validated_labels(labels)
    _validate_arguments(len(labels), num_clients, alpha, min_size)
    if method == "labels_per_client":
        if labels_per_client is None:
            raise PartitionError("method labels_per_client needs labels_per_client (k)")
        return labels_per_client_partition(labels, num_clients, labels_per_client, seed, min_size)
    if method == "dirichlet":
        return dirichlet_label_partition(labels, num_clients, alpha, seed, min_size)
    if method == "iid":
        return iid_partition(len(labels), num_clients, seed)
    if method == "lognormal_dirichlet":
        return lognormal_dirichlet_partition(labels, num_clients, alpha, sigma, seed, min_size)
    raise PartitionError(f"method={method!r} must be one of {', '.join(PARTITION_METHODS)}")


def class_counts(
    labels: np.ndarray, parts: list[np.ndarray] | tuple[np.ndarray, ...], num_classes: int
) -> np.ndarray:
    """Per-client class counts, int64 [K, num_classes]."""
    labels = validated_labels(labels)
    if int(labels.max()) >= num_classes:
        raise PartitionError(f"labels contain class {int(labels.max())} but num_classes={num_classes}")
    counts = np.zeros((len(parts), num_classes), dtype=np.int64)
    for client, indices in enumerate(parts):
        counts[client] = np.bincount(labels[np.asarray(indices, dtype=np.int64)], minlength=num_classes)
    return counts


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


def _validate_arguments(num_samples: int, num_clients: int, alpha: float, min_size: int) -> None:
    if not _is_int(num_clients) or num_clients < 1:
        raise PartitionError(f"num_clients={num_clients!r} must be an int >= 1")
    if not _is_number(alpha) or not (math.isfinite(alpha) and alpha > 0):
        raise PartitionError(f"alpha={alpha!r} must be a finite number > 0")
    if not _is_int(min_size) or min_size < 0:
        raise PartitionError(f"min_size={min_size!r} must be an int >= 0")
    if num_clients * min_size > num_samples:
        raise PartitionError(
            f"num_clients * min_size = {num_clients} * {min_size} exceeds the {num_samples} samples"
        )
    if num_clients > num_samples:
        raise PartitionError(f"num_clients={num_clients} exceeds the {num_samples} samples")


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _indices_by_class(labels: np.ndarray) -> list[np.ndarray]:
    """For each class 0..max(labels), its sample indices in ascending order."""
    order = np.argsort(labels, kind="stable")
    boundaries = np.cumsum(np.bincount(labels))[:-1]
    return [indices.astype(np.int64) for indices in np.split(order, boundaries)]


def _lognormal_sizes(
    rng: np.random.Generator, num_samples: int, num_clients: int, sigma: float, min_size: int
) -> np.ndarray:
    """Client sizes: min_size each plus a LogNormal-proportional share of the rest, summing to N.

    The share is rounded by largest remainder (ties to the lower client id) **(choice)**.
    """
    raw = rng.lognormal(mean=math.log(num_samples / num_clients), sigma=sigma, size=num_clients)
    spare = num_samples - num_clients * min_size
    shares = raw / raw.sum() * spare
    sizes = np.floor(shares).astype(np.int64)
    leftover = spare - int(sizes.sum())
    by_remainder = np.argsort(-(shares - sizes), kind="stable")
    sizes[by_remainder[:leftover]] += 1
    return sizes + min_size


def _deal_classes(
    rng: np.random.Generator, client_order: np.ndarray, class_priors: np.ndarray, class_sizes: np.ndarray
) -> np.ndarray:
    """The class of every draw in `client_order`, from each client's prior over non-empty classes.

    Vectorised in rounds: draws are made for all remaining positions under the current set
    of non-empty classes; they are kept up to the first draw from a class that has run out,
    which then leaves the set. At most one round per class.
    """
    total = len(client_order)
    num_classes = len(class_sizes)
    drawn = np.empty(total, dtype=np.int64)
    remaining = class_sizes.astype(np.int64).copy()
    position = 0
    while position < total:
        weights = class_priors * (remaining > 0)
        empty_rows = weights.sum(axis=1) <= 0
        # A client whose prior lies wholly on exhausted classes follows the remaining counts.
        weights[empty_rows] = remaining.astype(np.float64)
        cumulative = np.cumsum(weights, axis=1)
        last_positive = num_classes - 1 - np.argmax(weights[:, ::-1] > 0, axis=1)
        clients = client_order[position:]
        thresholds = rng.random(len(clients)) * cumulative[clients, -1]
        classes = (cumulative[clients] <= thresholds[:, None]).sum(axis=1)
        classes = np.minimum(classes, last_positive[clients])
        counts = np.bincount(classes, minlength=num_classes)
        overdrawn = counts > remaining
        if overdrawn.any():
            # Position of the first draw beyond a class's remaining samples, over all classes.
            draws_by_class = np.argsort(classes, kind="stable")
            first_draw_of_class = np.cumsum(counts) - counts
            accepted = int(draws_by_class[first_draw_of_class[overdrawn] + remaining[overdrawn]].min())
        else:
            accepted = len(classes)
        drawn[position : position + accepted] = classes[:accepted]
        remaining -= np.bincount(classes[:accepted], minlength=num_classes)
        position += accepted
    return drawn


def _sorted_int64(indices: np.ndarray) -> np.ndarray:
    return np.sort(np.asarray(indices, dtype=np.int64))
