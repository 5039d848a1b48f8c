"""Datasets as normalised in-memory tensors for FedCME and its baselines.

FedCME (Nie, Xiao, Yang, Wu, "FedCME: Client Matching and Classifier Exchanging to Handle
Data Heterogeneity in Federated Learning", arXiv:2307.08574) is evaluated on Fashion-MNIST
and CIFAR-10 with their official train/test splits. This module loads either one into
float32 tensors [N, C, H, W], normalised per channel with the well-known training-set
mean/std, with int64 labels [N]; models index these tensors directly (no per-sample PIL
transform in the training loop).

Sources, in order of preference:

* a read-only local mirror (config key ``data.mirror`` or env ``FEDCME_DATA_MIRROR``)
  holding ``fashion-mnist/*.gz`` (the four official IDX files, checked against the md5
  sums of ``torchvision.datasets.FashionMNIST.resources``) and ``cifar-10/cifar10.npz``
  (checked against its sha256). Fashion-MNIST is decompressed into torchvision's layout
  under ``data_dir``; nothing is ever written beside the mirror. A verified file is
  recorded in a small stamp file in ``data_dir`` (path, size, mtime_ns, digest) so that
  it is not hashed again while its size and mtime are unchanged;
* torchvision's own download into ``data_dir`` when no mirror is configured.

A ``synthetic`` dataset (per-class fixed random templates plus Gaussian noise, any shape)
serves tests and smoke runs without real data.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    import torchvision

from fedcme_core.checkpoints import atomic_write_bytes, atomic_writer
from fedcme_core.seeding import numpy_rng

DATASETS = ("fmnist", "cifar10", "synthetic")

MIRROR_ENV_VAR = "FEDCME_DATA_MIRROR"
MIRROR_CONFIG_KEY = "data.mirror"

FMNIST_MIRROR_FOLDER = "fashion-mnist"
CIFAR10_MIRROR_FILE = Path("cifar-10") / "cifar10.npz"
CIFAR10_SHA256 = "8683afb7f9f44b57934bfaa6d00b27bedd9711b49b686bb037107d5091a13529"

# Training-set channel statistics of pixels/255 (the values used throughout the literature).
FMNIST_MEAN, FMNIST_STD = (0.2860,), (0.3530,)
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)

_HASH_CHUNK_BYTES = 1 << 22


class DataError(ValueError):
    """A dataset cannot be found, verified or read; the message names the file and why."""


@dataclass(frozen=True, eq=False)
class Dataset:
    """One dataset's official train/test split as normalised in-memory tensors.

    ``x_*`` are contiguous float32 [N, C, H, W], already normalised with ``mean``/``std``;
    ``y_*`` are contiguous int64 [N] with values in [0, num_classes).
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __post_init__(self) -> None:
        for split, images, labels in (
            ("train", self.x_train, self.y_train),
            ("test", self.x_test, self.y_test),
        ):
            if images.dtype != torch.float32 or images.dim() != 4:
                raise DataError(
                    f"dataset {self.name}: x_{split} must be float32 [N, C, H, W], "
                    f"got {images.dtype} {tuple(images.shape)}"
                )
            if labels.dtype != torch.int64 or labels.dim() != 1 or len(labels) != len(images):
                raise DataError(
                    f"dataset {self.name}: y_{split} must be int64 [{len(images)}], "
                    f"got {labels.dtype} {tuple(labels.shape)}"
                )
        if self.x_train.shape[1:] != self.x_test.shape[1:]:
            raise DataError(
                f"dataset {self.name}: train images {tuple(self.x_train.shape[1:])} and "
                f"test images {tuple(self.x_test.shape[1:])} differ in shape"
            )
        channels = self.x_train.shape[1]
        if len(self.mean) != channels or len(self.std) != channels:
            raise DataError(
                f"dataset {self.name}: mean/std need {channels} channel values, "
                f"got {len(self.mean)}/{len(self.std)}"
            )

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one sample."""
        channels, height, width = self.x_train.shape[1:]
        return int(channels), int(height), int(width)


@dataclass(frozen=True)
class SyntheticSpec:
    """A synthetic dataset: ``template[label] + noise * N(0, 1)`` per sample.

    Each class has one fixed smooth random template of ``shape`` (C, H, W); labels are
    uniform random; train and test are independent draws from the same distribution.
    """

    num_train: int = 2000
    num_test: int = 500
    shape: tuple[int, int, int] = (1, 28, 28)
    num_classes: int = 10
    noise: float = 1.0
    seed: int = 0


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


def load_dataset(
    name: str,
    *,
    data_dir: Path,
    mirror: Path | None = None,
    synthetic: SyntheticSpec | None = None,
    normalise: bool = True,
) -> Dataset:
    """Load dataset `name` (one of DATASETS) as normalised in-memory tensors.

    `data_dir` receives decompressed files, downloads and verification stamps; `mirror`
    (see resolve_mirror) is only read. `synthetic` configures the "synthetic" dataset
    (defaults: SyntheticSpec()). `normalise=False` keeps the images in [0, 1] (mean 0, std 1).
    """
    if name == "synthetic":
        return make_synthetic(synthetic or SyntheticSpec(), normalise=normalise)
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}: expected one of {', '.join(DATASETS)}")
    return from_raw(name, load_raw(name, data_dir=data_dir, mirror=mirror), normalise=normalise)


RAW_ARRAYS = ("x_train", "y_train", "x_test", "y_test")
STATISTICS = {"fmnist": (FMNIST_MEAN, FMNIST_STD), "cifar10": (CIFAR10_MEAN, CIFAR10_STD)}


def unit_statistics(channels: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) that leave the images as they are: 0 and 1 per channel (``normalise=False``)."""
    return (0.0,) * channels, (1.0,) * channels


def load_raw(name: str, *, data_dir: Path, mirror: Path | None = None) -> dict[str, np.ndarray]:
    """The verified official split of "fmnist" or "cifar10" as uint8 [N, C, H, W] images and int64 labels."""
    if name not in STATISTICS:
        raise DataError(f"dataset {name!r} has no raw files: expected one of {', '.join(STATISTICS)}")
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


def from_raw(name: str, arrays: dict[str, np.ndarray], normalise: bool = True) -> Dataset:
    """Raw uint8 arrays as float32 images: normalised with the dataset's channel statistics, or with
    `normalise=False` scaled to [0, 1] only (mean 0, std 1: NIID-Bench's CIFAR-10 inputs)."""
    mean, std = STATISTICS[name] if normalise else unit_statistics(len(STATISTICS[name][0]))
    return Dataset(
        name=name,
        x_train=_normalise(torch.from_numpy(np.asarray(arrays["x_train"])), mean, std),
        y_train=_labels(arrays["y_train"]),
        x_test=_normalise(torch.from_numpy(np.asarray(arrays["x_test"])), mean, std),
        y_test=_labels(arrays["y_test"]),
        num_classes=10,
        mean=mean,
        std=std,
    )


def save_prepared(name: str, arrays: dict[str, np.ndarray], directory: Path) -> dict[str, object]:
    """Write a prepared dataset: one .npy per array (byte-reproducible) and meta.json with their sha256.

    Files are written atomically; meta.json last, so a folder with a meta.json is complete.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    for key in RAW_ARRAYS:
        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(arrays[key]), allow_pickle=False)
        payload = buffer.getvalue()
        atomic_write_bytes(directory / f"{key}.npy", payload)
        files[key] = {"sha256": hashlib.sha256(payload).hexdigest(), "shape": list(arrays[key].shape)}
    meta = {"dataset": name, "format": "fedcme-prepared-v1", "arrays": files}
    atomic_write_bytes(directory / "meta.json", (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    return meta


def load_prepared(directory: Path, expected_name: str | None = None, normalise: bool = True) -> Dataset:
    """Load a folder written by :func:`save_prepared`, verifying every array's sha256
    (`normalise`: as :func:`from_raw`)."""
    directory = Path(directory)
    meta_path = directory / "meta.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        name = meta["dataset"]
        records = meta["arrays"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise DataError(f"{meta_path}: not a prepared dataset ({type(error).__name__}: {error})") from None
    if expected_name is not None and name != expected_name:
        raise DataError(f"{directory}: holds prepared {name!r}, but the config's data.dataset is {expected_name!r}")
    arrays = {}
    for key in RAW_ARRAYS:
        path = directory / f"{key}.npy"
        try:
            payload = path.read_bytes()
        except OSError as error:
            raise DataError(f"{path}: cannot read prepared array ({error.strerror or error})") from None
        digest = hashlib.sha256(payload).hexdigest()
        if digest != records[key]["sha256"]:
            raise DataError(f"{path}: sha256 {digest} does not match meta.json ({records[key]['sha256']}); re-run prepare")
        arrays[key] = np.load(io.BytesIO(payload), allow_pickle=False)
    return from_raw(name, arrays, normalise=normalise)


def make_synthetic(spec: SyntheticSpec, normalise: bool = True) -> Dataset:
    """The synthetic dataset of `spec`: a pure function of the spec (seed included); normalised with
    its own training-set statistics unless `normalise=False`."""
    _validate_synthetic(spec)
    templates = _synthetic_templates(spec)
    x_train, y_train = _synthetic_split(spec, templates, spec.num_train, "synthetic-train")
    x_test, y_test = _synthetic_split(spec, templates, spec.num_test, "synthetic-test")
    mean = x_train.mean(axis=(0, 2, 3), dtype=np.float64)
    std = x_train.std(axis=(0, 2, 3), dtype=np.float64)
    if np.any(std == 0):
        raise DataError("synthetic dataset: a channel has zero variance; use noise > 0 or more samples")
    mean_tuple, std_tuple = ((tuple(float(value) for value in mean), tuple(float(value) for value in std))
                             if normalise else unit_statistics(len(mean)))
    return Dataset(
        name="synthetic",
        x_train=_normalise(torch.from_numpy(x_train), mean_tuple, std_tuple, scale=1.0),
        y_train=torch.from_numpy(y_train),
        x_test=_normalise(torch.from_numpy(x_test), mean_tuple, std_tuple, scale=1.0),
        y_test=torch.from_numpy(y_test),
        num_classes=spec.num_classes,
        mean=mean_tuple,
        std=std_tuple,
    )


def subset(dataset: Dataset, *, train: int | None, test: int | None, seed: int) -> Dataset:
    """A seeded random subset of the train and/or test split (None keeps a split whole).

    Chosen indices are sorted ascending, so samples keep their original order.
    """
    x_train, y_train = _subset_split(dataset, "train", dataset.x_train, dataset.y_train, train, seed)
    x_test, y_test = _subset_split(dataset, "test", dataset.x_test, dataset.y_test, test, seed)
    return dataclasses.replace(dataset, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


def _subset_split(
    dataset: Dataset,
    split: str,
    images: torch.Tensor,
    labels: torch.Tensor,
    size: int | None,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    if size is None:
        return images, labels
    available = len(labels)
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not 0 <= size <= available:
        raise DataError(
            f"dataset {dataset.name}: {split} subset size {size!r} must be an int in [0, {available}]"
        )
    chosen = np.sort(numpy_rng(seed, f"subset-{split}").choice(available, size=int(size), replace=False))
    index = torch.from_numpy(chosen.astype(np.int64))
    return images[index].contiguous(), labels[index].contiguous()


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
    import torchvision  # here, not at module level: it costs about 2 s of start-up (torch._dynamo)

    arrays = {}
    for train, split in ((True, "train"), (False, "test")):
        source = _torchvision_split(torchvision.datasets.FashionMNIST, data_dir, train, download, "fmnist")
        arrays[f"x_{split}"] = source.data.unsqueeze(1).numpy()
        arrays[f"y_{split}"] = np.asarray(source.targets, dtype=np.int64)
    return arrays


def _prepare_fmnist_from_mirror(data_dir: Path, mirror_folder: Path) -> None:
    """Verify the four official .gz files and decompress them into torchvision's raw folder."""
    import torchvision

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
        import torchvision

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
            missing = {"x_train", "y_train", "x_test", "y_test"} - set(npz.files)
            if missing:
                raise DataError(f"{archive} lacks the arrays {', '.join(sorted(missing))}")
            return {key: npz[key] for key in ("x_train", "y_train", "x_test", "y_test")}
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


def _labels(values: torch.Tensor | np.ndarray | list[int]) -> torch.Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.int64)).contiguous()


def _normalise(
    images: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...], *, scale: float = 255.0
) -> torch.Tensor:
    """(images / scale - mean) / std per channel, as a new contiguous float32 [N, C, H, W]."""
    channels = images.shape[1]
    mean_tensor = torch.tensor(mean, dtype=torch.float32).view(1, channels, 1, 1)
    std_tensor = torch.tensor(std, dtype=torch.float32).view(1, channels, 1, 1)
    normalised = images.to(torch.float32, copy=True).contiguous()
    normalised.div_(scale).sub_(mean_tensor).div_(std_tensor)
    return normalised


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


def _validate_synthetic(spec: SyntheticSpec) -> None:
    if len(spec.shape) != 3 or any(int(size) < 1 for size in spec.shape):
        raise DataError(f"synthetic shape {spec.shape} must be three positive sizes (C, H, W)")
    if spec.num_train < 2 or spec.num_test < 0:
        raise DataError(
            f"synthetic num_train={spec.num_train} must be >= 2 and num_test={spec.num_test} >= 0"
        )
    if spec.num_classes < 1:
        raise DataError(f"synthetic num_classes={spec.num_classes} must be >= 1")
    if spec.noise < 0:
        raise DataError(f"synthetic noise={spec.noise} must be >= 0")


def _synthetic_templates(spec: SyntheticSpec) -> np.ndarray:
    """One smooth random pattern per class, float32 [num_classes, C, H, W].

    Standard-normal values on a grid 4x coarser than the image, bilinearly upsampled: the
    classes differ in local spatial structure, which a small CNN picks up quickly, while
    per-pixel noise of the same scale keeps single pixels uninformative.
    """
    channels, height, width = (int(size) for size in spec.shape)
    coarse_shape = (spec.num_classes, channels, max(1, -(-height // 4)), max(1, -(-width // 4)))
    coarse = numpy_rng(spec.seed, "synthetic-templates").standard_normal(coarse_shape, dtype=np.float32)
    smooth = F.interpolate(
        torch.from_numpy(coarse), size=(height, width), mode="bilinear", align_corners=False
    )
    return smooth.numpy()


def _synthetic_split(
    spec: SyntheticSpec, templates: np.ndarray, count: int, tag: str
) -> tuple[np.ndarray, np.ndarray]:
    rng = numpy_rng(spec.seed, tag)
    labels = rng.integers(0, spec.num_classes, size=count, dtype=np.int64)
    noise = rng.standard_normal((count, *templates.shape[1:]), dtype=np.float32)
    images = templates[labels] + np.float32(spec.noise) * noise
    return np.ascontiguousarray(images, dtype=np.float32), labels
