"""Tests for fedcme_core.data.partition_file: a partition's record, content hash and verified .npz."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from fedcme_core.data.partition import PartitionError, PartitionSpec
from fedcme_core.data.partition_file import Partition, labels_sha256, load_partition, save_partition


@pytest.fixture
def labels() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 10, size=1000)


@pytest.fixture
def partition(labels: np.ndarray) -> Partition:
    return Partition.create(labels, PartitionSpec(method="dirichlet", num_clients=8, alpha=0.5, seed=11))


def test_partition_records_params_and_sizes(labels: np.ndarray, partition: Partition) -> None:
    assert partition.params == {
        "method": "dirichlet",
        "num_clients": 8,
        "alpha": 0.5,
        "seed": 11,
        "min_size": 10,
        "sigma": 0.3,
        "num_samples": 1000,
        "labels_sha256": labels_sha256(labels),
    }
    assert partition.sizes.tolist() == [len(c) for c in partition.clients]
    assert partition.sizes.sum() == 1000
    assert len(partition.content_hash) == 64
    assert not partition.clients[0].flags.writeable


def test_content_hash_depends_on_params_and_indices(labels: np.ndarray, partition: Partition) -> None:
    same = Partition.create(labels, PartitionSpec(method="dirichlet", num_clients=8, alpha=0.5, seed=11))
    other_seed = Partition.create(labels, PartitionSpec(method="dirichlet", num_clients=8, alpha=0.5, seed=12))

    assert same.content_hash == partition.content_hash and same == partition
    assert other_seed.content_hash != partition.content_hash


def test_save_load_round_trip(tmp_path: Path, labels: np.ndarray, partition: Partition) -> None:
    path = tmp_path / "partition.npz"

    save_partition(partition, path)
    loaded = load_partition(path, labels=labels)

    assert loaded.content_hash == partition.content_hash
    assert loaded.params == partition.params
    assert all(np.array_equal(a, b) for a, b in zip(loaded.clients, partition.clients))
    assert [p.name for p in tmp_path.iterdir()] == ["partition.npz"]
    with np.load(path, allow_pickle=False) as archive:
        assert sorted(archive.files) == ["indices", "meta", "offsets"]
        assert archive["offsets"].tolist() == [0, *np.cumsum(partition.sizes).tolist()]


def test_two_saves_are_byte_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, labels: np.ndarray, partition: Partition
) -> None:
    save_partition(partition, tmp_path / "first.npz")
    later = 2_000_000_000.0
    monkeypatch.setattr("time.time", lambda: later)

    recreated = Partition.create(labels, PartitionSpec(method="dirichlet", num_clients=8, alpha=0.5, seed=11))
    save_partition(recreated, tmp_path / "second.npz")

    assert (tmp_path / "first.npz").read_bytes() == (tmp_path / "second.npz").read_bytes()


def test_truncated_file_is_rejected(tmp_path: Path, partition: Partition) -> None:
    path = tmp_path / "partition.npz"
    save_partition(partition, path)
    path.write_bytes(path.read_bytes()[:-100])

    with pytest.raises(PartitionError, match="partition.npz"):
        load_partition(path)


def test_flipped_byte_is_rejected(tmp_path: Path, partition: Partition) -> None:
    path = tmp_path / "partition.npz"
    save_partition(partition, path)
    content = bytearray(path.read_bytes())
    content[len(content) // 2] ^= 0xFF
    path.write_bytes(bytes(content))

    with pytest.raises(PartitionError, match="partition.npz"):
        load_partition(path)


def test_tampered_indices_fail_the_content_hash(tmp_path: Path, partition: Partition) -> None:
    path = tmp_path / "partition.npz"
    save_partition(partition, path)
    with np.load(path, allow_pickle=False) as archive:
        indices, offsets, meta = archive["indices"].copy(), archive["offsets"], archive["meta"]
    indices[[0, -1]] = indices[[-1, 0]]
    np.savez(path, indices=indices, offsets=offsets, meta=meta)

    with pytest.raises(PartitionError, match="partition.npz.*content hash"):
        load_partition(path)


def test_not_an_npz_and_missing_file_are_rejected(tmp_path: Path) -> None:
    text = tmp_path / "notes.npz"
    text.write_text("not a partition")

    with pytest.raises(PartitionError, match="notes.npz"):
        load_partition(text)
    with pytest.raises(PartitionError, match="missing.npz does not exist"):
        load_partition(tmp_path / "missing.npz")


def test_wrong_labels_are_rejected(tmp_path: Path, labels: np.ndarray, partition: Partition) -> None:
    path = tmp_path / "partition.npz"
    save_partition(partition, path)
    other_labels = labels.copy()
    other_labels[0] = (other_labels[0] + 1) % 10

    with pytest.raises(PartitionError, match="does not match the dataset"):
        load_partition(path, labels=other_labels)


def test_failed_save_leaves_the_old_file_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, labels: np.ndarray, partition: Partition
) -> None:
    path = tmp_path / "partition.npz"
    save_partition(partition, path)
    original = path.read_bytes()
    other = Partition.create(labels, PartitionSpec(method="iid", num_clients=8, alpha=0.5, seed=0))

    def failing_replace(source: str, target: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        save_partition(other, path)
    monkeypatch.undo()

    assert path.read_bytes() == original
    assert [p.name for p in tmp_path.iterdir()] == ["partition.npz"]
