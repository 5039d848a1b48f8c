"""Where the official Fashion-MNIST and CIFAR-10 files come from, verified, as raw uint8 arrays.

FedCME (Nie, Xiao, Yang, Wu, arXiv:2307.08574) is evaluated on Fashion-MNIST and CIFAR-10
with their official train/test splits. Sources, in order of preference:

* a read-only local mirror (config key ``data.mirror`` or env ``FEDCME_DATA_MIRROR``)
  holding ``fashion-mnist/*.gz`` (the four official IDX files, checked against the md5
  sums of ``torchvision.datasets.FashionMNIST.resources``) and ``cifar-10/cifar10.npz``
  (checked against its sha256). Fashion-MNIST is decompressed into torchvision's layout
  under ``data_dir``; nothing is ever written beside the mirror. A verified file is
  recorded in a small stamp file in ``data_dir`` (path, size, mtime_ns, digest) so that
  it is not hashed again while its size and mtime are unchanged;
* torchvision's own download into ``data_dir`` when no mirror is configured.

:mod:`fedcme_core.data.datasets` turns the arrays into normalised tensors.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fedcme_core.common.atomic import atomic_write_bytes, atomic_writer
from fedcme_core.common.lazy import lazy_module

# Imported where first used (a download, or the mirror's Fashion-MNIST files): it costs about 2 s
# of start-up (torch._dynamo), which a run from prepared arrays or the CIFAR-10 mirror never pays.
torchvision = lazy_module("torchvision")

RAW_DATASETS = ("fmnist", "cifar10")
RAW_ARRAYS = ("x_train", "y_train", "x_test", "y_test")

MIRROR_ENV_VAR = "FEDCME_DATA_MIRROR"
MIRROR_CONFIG_KEY = "data.mirror"

FMNIST_MIRROR_FOLDER = "fashion-mnist"
CIFAR10_MIRROR_FILE = Path("cifar-10") / "cifar10.npz"
CIFAR10_SHA256 = "8683afb7f9f44b57934bfaa6d00b27bedd9711b49b686bb037107d5091a13529"

_HASH_CHUNK_BYTES = 1 << 22


class DataError(ValueError):
    """A dataset cannot be found, verified or read; the message names the file and why."""


def resolve_mirror(configured: str | Path | None) -> Path | None:
    """The data mirror folder: `configured`, else env FEDCME_DATA_MIRROR, else None.

    A configured or env folder that does not exist raises DataError naming it and its
    origin.
    """
    if configured is not None and str(configured) != "":
        return _existing_mirror(Path(configured), f"config key {MIRROR_CONFIG_KEY}")
    from_env = os.environ.get(MIRROR_ENV_VAR, "")
    if from_env:
        return _existing_mirror(Path(from_env), f"env {MIRROR_ENV_VAR}")
    return None


def load_raw(name: str, *, data_dir: Path, mirror: Path | None = None) -> dict[str, np.ndarray]:
    """The verified official split of "fmnist" or "cifar10" as uint8 [N, C, H, W] images and int64 labels."""
    if name not in RAW_DATASETS:
        raise DataError(f"dataset {name!r} has no raw files: expected one of {', '.join(RAW_DATASETS)}")
    data_dir = Path(data_dir)
    if mirror is not None:
        mirror = _existing_mirror(Path(mirror), "argument mirror")
        if data_dir.resolve().is_relative_to(mirror.resolve()):
            raise DataError(
                f"data_dir {data_dir} lies inside the read-only data mirror {mirror}: "
                "choose a data_dir outside it"
            )
    data_dir.mkdir(parents=True, exist_ok=True)
    return _raw_fmnist(data_dir, mirror) if name == "fmnist" else _raw_cifar10(data_dir, mirror)


def _existing_mirror(folder: Path, origin: str) -> Path:
    folder = folder.expanduser()
    if not folder.is_dir():
        raise DataError(f"data mirror folder {folder} (from {origin}) does not exist or is not a folder")
    return folder


def _raw_fmnist(data_dir: Path, mirror: Path | None) -> dict[str, np.ndarray]:
    if mirror is not None:
        _prepare_fmnist_from_mirror(data_dir, mirror / FMNIST_MIRROR_FOLDER)
        download = False
    else:
        download = True
    arrays = {}
    for train, split in ((True, "train"), (False, "test")):
        source = _torchvision_split(torchvision.datasets.FashionMNIST, data_dir, train, download, "fmnist")
        arrays[f"x_{split}"] = source.data.unsqueeze(1).numpy()
        arrays[f"y_{split}"] = np.asarray(source.targets, dtype=np.int64)
    return arrays


def _prepare_fmnist_from_mirror(data_dir: Path, mirror_folder: Path) -> None:
    """Verify the four official .gz files and decompress them into torchvision's raw folder."""
    raw_folder = data_dir / "FashionMNIST" / "raw"
    raw_folder.mkdir(parents=True, exist_ok=True)
    stamp = data_dir / "fashion-mnist.verified.json"
    for resource, expected_md5 in torchvision.datasets.FashionMNIST.resources:
        archive_name = os.path.basename(resource)
        archive = mirror_folder / archive_name
        _verify_digest(archive, "md5", expected_md5, stamp)
        _decompress_gzip(archive, raw_folder / archive_name.removesuffix(".gz"))


def _decompress_gzip(archive: Path, target: Path) -> None:
    """Decompress `archive` to `target` atomically; skip when `target` has the right size."""
    expected_size = _gzip_uncompressed_size(archive)
    if target.is_file() and target.stat().st_size == expected_size:
        return
    try:
        with gzip.open(archive, "rb") as source, atomic_writer(target) as sink:
            shutil.copyfileobj(source, sink, _HASH_CHUNK_BYTES)
    except (OSError, EOFError, gzip.BadGzipFile) as error:
        raise DataError(f"cannot decompress {archive} into {target}: {error}") from error


def _gzip_uncompressed_size(archive: Path) -> int:
    """The uncompressed size (mod 2**32) from the gzip trailer (ISIZE, RFC 1952)."""
    with open(archive, "rb") as handle:
        handle.seek(-4, os.SEEK_END)
        return int.from_bytes(handle.read(4), "little")


def _raw_cifar10(data_dir: Path, mirror: Path | None) -> dict[str, np.ndarray]:
    if mirror is not None:
        archive = mirror / CIFAR10_MIRROR_FILE
        _verify_digest(archive, "sha256", CIFAR10_SHA256, data_dir / "cifar-10.verified.json")
        arrays = _read_cifar10_npz(archive)
    else:
        arrays = {}
        for train, split in ((True, "train"), (False, "test")):
            source = _torchvision_split(torchvision.datasets.CIFAR10, data_dir, train, True, "cifar10")
            arrays[f"x_{split}"] = np.asarray(source.data)
            arrays[f"y_{split}"] = np.asarray(source.targets, dtype=np.int64)
    for split in ("train", "test"):
        images_hwc = arrays[f"x_{split}"]
        if images_hwc.dtype != np.uint8 or images_hwc.ndim != 4 or images_hwc.shape[-1] != 3:
            raise DataError(
                f"cifar10 x_{split} must be uint8 [N, 32, 32, 3], got {images_hwc.dtype} {images_hwc.shape}"
            )
        arrays[f"x_{split}"] = np.ascontiguousarray(images_hwc.transpose(0, 3, 1, 2))
    return arrays


def _read_cifar10_npz(archive: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(archive, allow_pickle=False) as npz:
            missing = set(RAW_ARRAYS) - set(npz.files)
            if missing:
                raise DataError(f"{archive} lacks the arrays {', '.join(sorted(missing))}")
            return {key: npz[key] for key in RAW_ARRAYS}
    except (OSError, ValueError, EOFError) as error:
        if isinstance(error, DataError):
            raise
        raise DataError(f"cannot read {archive} as an .npz archive: {error}") from error


def _torchvision_split(
    dataset_class: Callable[..., torchvision.datasets.VisionDataset],
    data_dir: Path,
    train: bool,
    download: bool,
    name: str,
) -> torchvision.datasets.VisionDataset:
    """One split of a torchvision dataset class (read from data_dir, or downloaded there)."""
    try:
        return dataset_class(root=data_dir, train=train, download=download)
    except Exception as error:
        if not download:
            raise DataError(f"torchvision cannot read {name} from {data_dir}: {error}") from error
        raise DataError(
            f"{name}: no data mirror configured (config key {MIRROR_CONFIG_KEY} / env {MIRROR_ENV_VAR}) "
            f"and the download into {data_dir} failed: {error}"
        ) from error


def _verify_digest(path: Path, algorithm: str, expected: str, stamp: Path) -> None:
    """Check `path`'s digest against `expected`, trusting `stamp` while size and mtime hold."""
    if not path.is_file():
        raise DataError(f"data mirror file {path} is missing")
    status = path.stat()
    record = {
        "path": str(path.resolve()),
        "size": status.st_size,
        "mtime_ns": status.st_mtime_ns,
        algorithm: expected,
    }
    records = _read_stamp(stamp)
    if records.get(path.name) == record:
        return
    actual = _file_digest(path, algorithm)
    if actual != expected:
        raise DataError(f"{path}: {algorithm} {actual} does not match the expected {expected}")
    records[path.name] = record
    atomic_write_bytes(stamp, json.dumps(records, indent=2, sort_keys=True).encode("utf-8"))


def _read_stamp(stamp: Path) -> dict[str, dict[str, object]]:
    try:
        records = json.loads(stamp.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return records if isinstance(records, dict) else {}


def _file_digest(path: Path, algorithm: str) -> str:
    digest = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_HASH_CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()
