"""A client partition as a record and a file: the parameters that made it, the sha256 of the
labels it is for, a content hash, and a single pickle-free, byte-reproducible ``.npz``.

The partitions themselves (FedCME's Dirichlet label skew with quantity skew, Nie et al.,
arXiv:2307.08574) are drawn by :mod:`fedcme_core.data.partition`; ``load_partition`` verifies a file
before a run trusts it.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from fedcme_core.common.atomic import atomic_write_bytes
from fedcme_core.data.partition import PartitionError, PartitionMethod, PartitionSpec, partition_labels, validated_labels

_NPZ_ARRAYS = ("indices", "offsets", "meta")
_ZIP_FIXED_DATE_TIME = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class Partition:
    """A partition with the parameters that made it and a hash of its content.

    `clients[k]` holds client k's sample indices (read-only, sorted, int64). `params` has
    method, num_clients, alpha, seed, min_size, sigma, num_samples and labels_sha256 (with
    labels_per_client instead of alpha for that method).
    Two partitions are equal when their content hashes are.
    """

    clients: tuple[np.ndarray, ...]
    params: dict[str, Any]
    content_hash: str

    @classmethod
    def create(cls, labels: np.ndarray, spec: PartitionSpec) -> Partition:
        """Partition `labels` as `spec` says and record how."""
        labels = validated_labels(labels)
        parts = partition_labels(labels, spec)
        params = {**spec.record(), "num_samples": int(len(labels)), "labels_sha256": labels_sha256(labels)}
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
        given = labels_sha256(validated_labels(labels))
        if given != params.get("labels_sha256"):
            raise PartitionError(
                f"partition file {path} does not match the dataset: labels sha256 {given} "
                f"!= the partition's {params.get('labels_sha256')}"
            )
    return Partition(clients=clients, params=params, content_hash=stored_hash)


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


def _read_only(indices: np.ndarray) -> np.ndarray:
    indices = np.array(indices, dtype=np.int64)
    indices.setflags(write=False)
    return indices


class PartitionSettings(Protocol):
    """A config's partition section (``fedcme_core.config.schema.PartitionConfig``)."""

    method: PartitionMethod
    alpha: float
    min_size: int
    sigma: float
    labels_per_client: int | None


def make_partition(labels: np.ndarray, partition: PartitionSettings, num_clients: int, seed: int) -> Partition:
    """SPEC "Data": the clients' sample indices for labels [N]."""
    spec = PartitionSpec(method=partition.method, num_clients=num_clients, alpha=partition.alpha, seed=seed,
                         min_size=partition.min_size, sigma=partition.sigma, labels_per_client=partition.labels_per_client)
    return Partition.create(labels, spec)
