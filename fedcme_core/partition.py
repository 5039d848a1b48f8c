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
* ``lognormal_dirichlet`` (FedLab's "unbalanced dirichlet"): client sizes ~
  LogNormal(log(N/K), sigma) scaled to sum to N, each client has a Dir(alpha) class prior,
  and samples are dealt one at a time: clients come in a seeded random order (a shuffled
  sequence holding client k size_k times) **(choice)**; each draws a class from its prior
  renormalised over the classes that still have samples left and takes that class's next
  unused index (each class's indices are shuffled first) **(choice)**.

Every client's indices are returned sorted ascending as int64. A ``Partition`` records its
parameters, the sha256 of the labels and a content hash; ``save_partition`` writes it as a
single pickle-free, byte-reproducible ``.npz`` and ``load_partition`` verifies it.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from fedcme_core.checkpoints import atomic_write_bytes
from fedcme_core.seeding import numpy_rng

PartitionMethod = Literal["dirichlet", "iid", "lognormal_dirichlet"]
PARTITION_METHODS: tuple[str, ...] = ("dirichlet", "iid", "lognormal_dirichlet")

_NPZ_ARRAYS = ("indices", "offsets", "meta")
_ZIP_FIXED_DATE_TIME = (1980, 1, 1, 0, 0, 0)


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
    labels = _validated_labels(labels)
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
    labels = _validated_labels(labels)
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


def partition_labels(
    labels: np.ndarray,
    *,
    method: PartitionMethod,
    num_clients: int,
    alpha: float,
    seed: int,
    min_size: int = 10,
    sigma: float = 0.3,
) -> list[np.ndarray]:
    """Partition `labels` over `num_clients` clients with `method` (one of PARTITION_METHODS)."""
    labels = _validated_labels(labels)
    _validate_arguments(len(labels), num_clients, alpha, min_size)
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
    labels = _validated_labels(labels)
    if int(labels.max()) >= num_classes:
        raise PartitionError(f"labels contain class {int(labels.max())} but num_classes={num_classes}")
    counts = np.zeros((len(parts), num_classes), dtype=np.int64)
    for client, indices in enumerate(parts):
        counts[client] = np.bincount(labels[np.asarray(indices, dtype=np.int64)], minlength=num_classes)
    return counts


@dataclass(frozen=True)
class Partition:
    """A partition with the parameters that made it and a hash of its content.

    `clients[k]` holds client k's sample indices (read-only, sorted, int64). `params` has
    method, num_clients, alpha, seed, min_size, sigma, num_samples and labels_sha256.
    Two partitions are equal when their content hashes are.
    """

    clients: tuple[np.ndarray, ...]
    params: dict[str, Any]
    content_hash: str

    @classmethod
    def create(
        cls,
        labels: np.ndarray,
        *,
        method: PartitionMethod,
        num_clients: int,
        alpha: float,
        seed: int,
        min_size: int = 10,
        sigma: float = 0.3,
    ) -> Partition:
        """Partition `labels` (same arguments as partition_labels) and record how."""
        labels = _validated_labels(labels)
        parts = partition_labels(
            labels,
            method=method,
            num_clients=num_clients,
            alpha=alpha,
            seed=seed,
            min_size=min_size,
            sigma=sigma,
        )
        params = {
            "method": str(method),
            "num_clients": int(num_clients),
            "alpha": float(alpha),
            "seed": int(seed),
            "min_size": int(min_size),
            "sigma": float(sigma),
            "num_samples": int(len(labels)),
            "labels_sha256": labels_sha256(labels),
        }
        clients = tuple(_read_only(part) for part in parts)
        return cls(clients=clients, params=params, content_hash=_content_hash(params, clients))

    @property
    def sizes(self) -> np.ndarray:
        """Number of samples per client, int64 [K]."""
        return np.array([len(indices) for indices in self.clients], dtype=np.int64)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Partition):
            return NotImplemented
        return self.content_hash == other.content_hash

    def __hash__(self) -> int:
        return hash(self.content_hash)


def labels_sha256(labels: np.ndarray) -> str:
    """sha256 of the labels as little-endian int64 bytes (identifies the dataset a partition is for)."""
    return hashlib.sha256(np.ascontiguousarray(labels, dtype="<i8").tobytes()).hexdigest()


def save_partition(partition: Partition, path: str | Path) -> None:
    """Write `partition` to `path` as one pickle-free .npz, atomically and byte-reproducibly.

    Arrays: ``indices`` (all clients concatenated, int64), ``offsets`` (int64 [K+1]) and
    ``meta`` (UTF-8 JSON of params and content_hash, as uint8).
    """
    path = Path(path)
    indices = np.concatenate([np.asarray(client, dtype="<i8") for client in partition.clients])
    offsets = np.concatenate([[0], np.cumsum(partition.sizes)]).astype("<i8")
    meta = _canonical_json({"params": partition.params, "content_hash": partition.content_hash})
    payload = io.BytesIO()
    with zipfile.ZipFile(payload, mode="w", compression=zipfile.ZIP_STORED) as archive:
        for name, array in zip(_NPZ_ARRAYS, (indices, offsets, np.frombuffer(meta, dtype=np.uint8))):
            # np.savez's layout, with a fixed timestamp so equal partitions give equal bytes.
            entry = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_FIXED_DATE_TIME)
            entry.compress_type = zipfile.ZIP_STORED
            entry.external_attr = 0o644 << 16
            with archive.open(entry, mode="w", force_zip64=True) as handle:
                np.lib.format.write_array(handle, array, allow_pickle=False)
    atomic_write_bytes(path, payload.getvalue())


def load_partition(path: str | Path, *, labels: np.ndarray | None = None) -> Partition:
    """Read a partition written by save_partition and verify its content hash.

    With `labels`, also check that the partition was made for exactly these labels.
    """
    path = Path(path)
    if not path.is_file():
        raise PartitionError(f"partition file {path} does not exist")
    try:
        with np.load(path, allow_pickle=False) as archive:
            missing = set(_NPZ_ARRAYS) - set(archive.files)
            if missing:
                raise PartitionError(f"partition file {path} lacks the arrays {', '.join(sorted(missing))}")
            indices, offsets, meta = (archive[name] for name in _NPZ_ARRAYS)
        stored = json.loads(meta.tobytes().decode("utf-8"))
        params, stored_hash = stored["params"], stored["content_hash"]
    except PartitionError:
        raise
    except Exception as error:  # any failure to parse means the file is damaged
        reason = f"is truncated or not a partition .npz: {error}"
        raise PartitionError(f"partition file {path} {reason}") from error
    if (
        indices.dtype != np.int64
        or offsets.dtype != np.int64
        or indices.ndim != 1
        or offsets.ndim != 1
        or len(offsets) < 1
        or offsets[0] != 0
        or offsets[-1] != len(indices)
        or np.any(np.diff(offsets) < 0)
    ):
        raise PartitionError(f"partition file {path} has inconsistent indices/offsets arrays")
    clients = tuple(_read_only(indices[start:end].copy()) for start, end in zip(offsets[:-1], offsets[1:]))
    computed_hash = _content_hash(params, clients)
    if computed_hash != stored_hash:
        raise PartitionError(
            f"partition file {path}: content hash {computed_hash} does not match the stored {stored_hash}"
        )
    if labels is not None:
        given = labels_sha256(_validated_labels(labels))
        if given != params.get("labels_sha256"):
            raise PartitionError(
                f"partition file {path} does not match the dataset: labels sha256 {given} "
                f"!= the partition's {params.get('labels_sha256')}"
            )
    return Partition(clients=clients, params=params, content_hash=stored_hash)


def _validated_labels(labels: np.ndarray) -> np.ndarray:
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


def _content_hash(params: dict[str, Any], clients: tuple[np.ndarray, ...]) -> str:
    """sha256 over canonical JSON of params, the client sizes and every client's indices."""
    digest = hashlib.sha256()
    digest.update(_canonical_json(params))
    digest.update(np.array([len(c) for c in clients], dtype="<i8").tobytes())
    for indices in clients:
        digest.update(np.ascontiguousarray(indices, dtype="<i8").tobytes())
    return digest.hexdigest()


def _canonical_json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _sorted_int64(indices: np.ndarray) -> np.ndarray:
    return np.sort(np.asarray(indices, dtype=np.int64))


def _read_only(indices: np.ndarray) -> np.ndarray:
    indices = np.array(indices, dtype=np.int64)
    indices.setflags(write=False)
    return indices
