"""Tests for fedcme_core.data.sources: the real datasets from the offline mirror, verification, mirror resolution."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import torch

from fedcme_core.data import sources as data_sources
from fedcme_core.data.datasets import DATASETS, DataError, Dataset, load_dataset
from fedcme_core.data.sources import resolve_mirror

from .helpers import assert_normalised_split

SHARED_MIRROR = Path(__file__).parents[2] / "shared" / "data"
FMNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)

needs_fmnist_mirror = pytest.mark.skipif(
    not (SHARED_MIRROR / "fashion-mnist").is_dir(), reason=f"no Fashion-MNIST mirror at {SHARED_MIRROR}"
)
needs_cifar_mirror = pytest.mark.skipif(
    not (SHARED_MIRROR / "cifar-10" / "cifar10.npz").is_file(),
    reason=f"no CIFAR-10 mirror at {SHARED_MIRROR}",
)


@pytest.fixture(scope="session")
def fmnist(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return load_dataset("fmnist", data_dir=tmp_path_factory.mktemp("fmnist-data"), mirror=SHARED_MIRROR)


@pytest.fixture(scope="session")
def cifar10(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return load_dataset("cifar10", data_dir=tmp_path_factory.mktemp("cifar-data"), mirror=SHARED_MIRROR)


@pytest.fixture
def fmnist_mirror_copy(tmp_path: Path) -> Path:
    """A writable copy of the Fashion-MNIST mirror (the shared one is read-only)."""
    mirror = tmp_path / "mirror"
    (mirror / "fashion-mnist").mkdir(parents=True)
    for name in FMNIST_FILES:
        shutil.copyfile(SHARED_MIRROR / "fashion-mnist" / name, mirror / "fashion-mnist" / name)
    return mirror


def flip_byte(path: Path, offset: int) -> None:
    content = bytearray(path.read_bytes())
    content[offset] ^= 0xFF
    path.write_bytes(bytes(content))


# --- real datasets from the mirror -------------------------------------------------------
# (marked slow: they read, verify and decompress the real archives)


@pytest.mark.slow
@needs_fmnist_mirror
def test_fmnist_from_mirror(fmnist: Dataset) -> None:
    assert fmnist.name == "fmnist"
    assert_normalised_split(fmnist.x_train, fmnist.y_train, 60000, (1, 28, 28))
    assert_normalised_split(fmnist.x_test, fmnist.y_test, 10000, (1, 28, 28))
    assert fmnist.input_shape == (1, 28, 28)
    assert fmnist.num_classes == 10
    assert torch.bincount(fmnist.y_train).tolist() == [6000] * 10
    assert fmnist.y_train[:10].tolist() == [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]
    assert abs(fmnist.x_train.mean().item()) < 0.01
    assert abs(fmnist.x_train.std().item() - 1.0) < 0.01


@pytest.mark.slow
@needs_cifar_mirror
def test_cifar10_from_mirror(cifar10: Dataset) -> None:
    assert cifar10.name == "cifar10"
    assert_normalised_split(cifar10.x_train, cifar10.y_train, 50000, (3, 32, 32))
    assert_normalised_split(cifar10.x_test, cifar10.y_test, 10000, (3, 32, 32))
    assert cifar10.input_shape == (3, 32, 32)
    assert cifar10.num_classes == 10
    assert cifar10.y_train[:10].tolist() == [6, 9, 9, 4, 1, 1, 2, 7, 8, 3]
    assert cifar10.y_test[:10].tolist() == [3, 8, 8, 0, 6, 6, 1, 6, 3, 1]
    channel_mean = cifar10.x_train.mean(dim=(0, 2, 3))
    channel_std = cifar10.x_train.std(dim=(0, 2, 3))
    assert torch.allclose(channel_mean, torch.zeros(3), atol=0.01)
    assert torch.allclose(channel_std, torch.ones(3), atol=0.01)


@pytest.mark.slow
@needs_fmnist_mirror
def test_fmnist_second_load_uses_the_stamp_and_writes_nothing_beside_the_mirror(
    fmnist_mirror_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = tmp_path / "data"
    mirror_before = sorted(p.name for p in (fmnist_mirror_copy / "fashion-mnist").iterdir())
    first = load_dataset("fmnist", data_dir=data_dir, mirror=fmnist_mirror_copy)

    def no_hashing(path: Path, algorithm: str) -> str:
        raise AssertionError(f"{path} was hashed again")

    monkeypatch.setattr(data_sources, "_file_digest", no_hashing)
    second = load_dataset("fmnist", data_dir=data_dir, mirror=fmnist_mirror_copy)

    assert torch.equal(first.y_test, second.y_test)
    assert sorted(p.name for p in fmnist_mirror_copy.iterdir()) == ["fashion-mnist"]
    assert sorted(p.name for p in (fmnist_mirror_copy / "fashion-mnist").iterdir()) == mirror_before
    raw = sorted(p.name for p in (data_dir / "FashionMNIST" / "raw").iterdir())
    assert raw == sorted(name.removesuffix(".gz") for name in FMNIST_FILES)
    assert (data_dir / "fashion-mnist.verified.json").is_file()


@pytest.mark.slow
@needs_fmnist_mirror
def test_corrupted_gz_names_the_file_and_both_md5s(fmnist_mirror_copy: Path, tmp_path: Path) -> None:
    corrupted = fmnist_mirror_copy / "fashion-mnist" / "t10k-labels-idx1-ubyte.gz"
    flip_byte(corrupted, 100)
    actual_md5 = hashlib.md5(corrupted.read_bytes()).hexdigest()

    with pytest.raises(DataError) as caught:
        load_dataset("fmnist", data_dir=tmp_path / "data", mirror=fmnist_mirror_copy)

    message = str(caught.value)
    assert "t10k-labels-idx1-ubyte.gz" in message
    assert actual_md5 in message
    assert "bb300cfdad3c16e7a12a480ee83cd310" in message


@pytest.mark.slow
@needs_fmnist_mirror
def test_file_changed_after_verification_is_checked_again(fmnist_mirror_copy: Path, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    load_dataset("fmnist", data_dir=data_dir, mirror=fmnist_mirror_copy)
    flip_byte(fmnist_mirror_copy / "fashion-mnist" / "train-labels-idx1-ubyte.gz", 200)

    with pytest.raises(DataError, match="train-labels-idx1-ubyte.gz: md5"):
        load_dataset("fmnist", data_dir=data_dir, mirror=fmnist_mirror_copy)


@pytest.mark.slow
@needs_fmnist_mirror
def test_missing_mirror_file_is_named(fmnist_mirror_copy: Path, tmp_path: Path) -> None:
    (fmnist_mirror_copy / "fashion-mnist" / "t10k-images-idx3-ubyte.gz").unlink()

    with pytest.raises(DataError, match="t10k-images-idx3-ubyte.gz is missing"):
        load_dataset("fmnist", data_dir=tmp_path / "data", mirror=fmnist_mirror_copy)


def test_missing_cifar_archive_is_named(tmp_path: Path) -> None:
    empty_mirror = tmp_path / "mirror"
    empty_mirror.mkdir()

    with pytest.raises(DataError, match="cifar10.npz is missing"):
        load_dataset("cifar10", data_dir=tmp_path / "data", mirror=empty_mirror)


def test_data_dir_inside_the_mirror_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="inside the read-only data mirror"):
        load_dataset("fmnist", data_dir=tmp_path / "cache", mirror=tmp_path)


def test_download_failure_without_mirror_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline_download(self: object) -> None:
        raise OSError("network unreachable")

    import torchvision

    monkeypatch.setattr(torchvision.datasets.FashionMNIST, "download", offline_download)

    with pytest.raises(DataError, match="no data mirror configured.*FEDCME_DATA_MIRROR.*download.*failed"):
        load_dataset("fmnist", data_dir=tmp_path / "data", mirror=None)


def test_unknown_dataset_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="unknown dataset 'mnist'"):
        load_dataset("mnist", data_dir=tmp_path)
    assert DATASETS == ("fmnist", "cifar10", "synthetic", "npz", "imagefolder")


# --- mirror resolution -------------------------------------------------------------------


def test_resolve_mirror_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    configured, from_env = tmp_path / "configured", tmp_path / "env"
    configured.mkdir()
    from_env.mkdir()
    monkeypatch.delenv("FEDCME_DATA_MIRROR", raising=False)

    assert resolve_mirror(None) is None
    monkeypatch.setenv("FEDCME_DATA_MIRROR", str(from_env))
    assert resolve_mirror(None) == from_env
    assert resolve_mirror(str(configured)) == configured


def test_missing_configured_mirror_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "no-such-mirror"
    monkeypatch.delenv("FEDCME_DATA_MIRROR", raising=False)

    with pytest.raises(DataError, match=r"no-such-mirror \(from config key data.mirror\) does not exist"):
        resolve_mirror(missing)
    with pytest.raises(DataError, match="no-such-mirror"):
        load_dataset("fmnist", data_dir=tmp_path / "data", mirror=missing)


def test_missing_env_mirror_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDCME_DATA_MIRROR", str(tmp_path / "gone"))

    with pytest.raises(DataError, match=r"gone \(from env FEDCME_DATA_MIRROR\) does not exist"):
        resolve_mirror(None)
