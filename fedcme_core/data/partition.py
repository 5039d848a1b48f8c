"""Client partitions of a labelled dataset: label skew and quantity skew.

FedCME (Nie, Xiao, Yang, Wu, arXiv:2307.08574) is evaluated on non-IID splits of
Fashion-MNIST and CIFAR-10 over K clients. A partition is a pure function of the labels and a
:class:`PartitionSpec` (method, K, alpha, seed, min_size, sigma, k); every random choice comes
from one numpy Generator, ``numpy_rng(seed, "partition")``. Methods:

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
* ``lognormal_dirichlet`` (FedLab's "unbalanced dirichlet", :mod:`fedcme_core.data.lognormal`):
  client sizes ~ LogNormal(log(N/K), sigma) scaled to sum to N, each client has a Dir(alpha) class prior,
  and samples are dealt one at a time: clients come in a seeded random order (a shuffled
  sequence holding client k size_k times) **(choice)**; each draws a class from its prior
  renormalised over the classes that still have samples left and takes that class's next
  unused index (each class's indices are shuffled first) **(choice)**.
* ``client_dirichlet`` (Hsu, Qi, Brown 2019, arXiv:1909.06335, :mod:`fedcme_core.data.client_dirichlet`):
  equal client sizes (N // K, one more for the first N mod K clients), client k's label mix
  q_k ~ Dir(alpha * p), p the labels' class distribution; clients are filled in order, each
  sampling classes from q_k without replacement, q_k renormalised over the classes left once
  one runs out. `min_size` cannot bind (N // K >= min_size whenever the arguments pass).

Every client's indices are returned sorted ascending as int64. :mod:`fedcme_core.data.partition_file`
keeps a partition with the parameters that made it, as a byte-reproducible ``.npz``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from fedcme_core.common.seeding import numpy_rng
from fedcme_core.data.client_dirichlet import client_dirichlet_partition
from fedcme_core.data.labels import (
    PartitionError,
    check_arguments,
    indices_by_class,
    is_int,
    sorted_int64,
    validated_labels,
)
from fedcme_core.data.lognormal import lognormal_dirichlet_partition

PartitionMethod = Literal["dirichlet", "iid", "lognormal_dirichlet", "labels_per_client", "client_dirichlet"]
PARTITION_METHODS: tuple[str, ...] = (
    "dirichlet", "iid", "lognormal_dirichlet", "labels_per_client", "client_dirichlet")


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
    check_arguments(len(labels), num_clients, alpha, min_size)
    if max_attempts < 1:
        raise PartitionError(f"max_attempts={max_attempts} must be >= 1")
    num_samples = len(labels)
    class_indices = indices_by_class(labels)
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
            return [sorted_int64(np.concatenate(chunks)) for chunks in client_chunks]
    raise PartitionError(
        f"dirichlet partition: min_size={min_size} cannot be met for N={num_samples}, "
        f"K={num_clients}, alpha={alpha} after {max_attempts} attempts"
    )


def iid_partition(num_samples: int, num_clients: int, seed: int) -> list[np.ndarray]:
    """A seeded shuffle of range(num_samples) cut into `num_clients` near-equal parts."""
    if not is_int(num_samples) or num_samples < 1:
        raise PartitionError(f"num_samples={num_samples!r} must be an int >= 1")
    check_arguments(int(num_samples), num_clients, 1.0, 0)
    permutation = numpy_rng(seed, "partition").permutation(int(num_samples))
    return [sorted_int64(part) for part in np.array_split(permutation, num_clients)]


def client_label_sets(num_clients: int, num_classes: int, labels_per_client: int, rng: np.random.Generator,
                      max_attempts: int = 1000) -> list[np.ndarray]:
    """#C=k: client i's labels, i mod C first, then k-1 distinct others uniformly, drawn again
    until every label is held (see module doc)."""
    if not is_int(labels_per_client) or not 1 <= labels_per_client <= num_classes:
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
    check_arguments(len(labels), num_clients, 1.0, min_size)
    rng = numpy_rng(seed, "partition")
    class_indices = indices_by_class(labels)
    label_sets = client_label_sets(num_clients, len(class_indices), labels_per_client, rng)
    chunks: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for label, indices_of_class in enumerate(class_indices):
        holders = [client for client, label_set in enumerate(label_sets) if label in label_set]
        shuffled = indices_of_class.copy()
        rng.shuffle(shuffled)
        for client, part in zip(holders, np.array_split(shuffled, len(holders))):
            chunks[client].append(part)
    parts = [sorted_int64(np.concatenate(client_chunks)) for client_chunks in chunks]
    smallest = min(len(part) for part in parts)
    if smallest < min_size:
        raise PartitionError(f"labels_per_client: a client holds {smallest} samples, fewer than min_size={min_size}")
    return parts


@dataclass(frozen=True)
class PartitionSpec:
    """How a partition is drawn (see the module doc): `alpha` is read by dirichlet, lognormal_dirichlet
    and client_dirichlet, `sigma` by lognormal_dirichlet, `labels_per_client` (k) by labels_per_client."""

    method: PartitionMethod
    num_clients: int
    alpha: float
    seed: int
    min_size: int = 10
    sigma: float = 0.3
    labels_per_client: int | None = None

    def record(self) -> dict[str, Any]:
        """The parameters as plain JSON values, without the one this method does not read of
        `alpha` and `labels_per_client` (a partition file keeps them: :mod:`fedcme_core.data.partition_file`)."""
        record = {"method": str(self.method), "num_clients": int(self.num_clients), "seed": int(self.seed),
                  "min_size": int(self.min_size), "sigma": float(self.sigma)}
        if self.method == "labels_per_client":
            return record | {"labels_per_client": int(self.labels_per_client)}
        return record | {"alpha": float(self.alpha)}


def partition_labels(labels: np.ndarray, spec: PartitionSpec) -> list[np.ndarray]:
    """Partition `labels` over `spec.num_clients` clients with `spec.method` (one of PARTITION_METHODS)."""
    labels = validated_labels(labels)
    check_arguments(len(labels), spec.num_clients, spec.alpha, spec.min_size)
    if spec.method == "labels_per_client":
        if spec.labels_per_client is None:
            raise PartitionError("method labels_per_client needs labels_per_client (k)")
        return labels_per_client_partition(labels, spec.num_clients, spec.labels_per_client, spec.seed, spec.min_size)
    if spec.method == "dirichlet":
        return dirichlet_label_partition(labels, spec.num_clients, spec.alpha, spec.seed, spec.min_size)
    if spec.method == "iid":
        return iid_partition(len(labels), spec.num_clients, spec.seed)
    if spec.method == "lognormal_dirichlet":
        return lognormal_dirichlet_partition(labels, spec.num_clients, spec.alpha, spec.sigma, spec.seed, spec.min_size)
    if spec.method == "client_dirichlet":
        return client_dirichlet_partition(labels, spec.num_clients, spec.alpha, spec.seed, spec.min_size)
    raise PartitionError(f"method={spec.method!r} must be one of {', '.join(PARTITION_METHODS)}")


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
