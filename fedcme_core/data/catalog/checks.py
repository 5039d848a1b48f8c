"""A source's raw arrays checked and put in one form, and what is derived from its training set.

Every check raises one DataError line that names where the arrays came from (`origin`: a file or a
folder) and what is wrong; nothing is written before all of them pass (the prepare stage saves only
checked arrays). The form: images uint8 or float32 [N, C, H, W] with C = 1 (grey) or 3 (RGB), given
as [N, H, W] (grey), [N, H, W, C] (HWC) or [N, C, H, W] (CHW); labels int64 [N].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedcme_core.data.catalog.base import InputShape, Statistics
from fedcme_core.data.sources import RAW_ARRAYS, DataError

CHANNELS = (1, 3)  # grey or RGB


@dataclass(frozen=True)
class DatasetFacts:
    """What training needs to know of a dataset: its number of classes, the (C, H, W) of a sample and
    the per-channel mean and std of its training images (pixels/255 for uint8 images)."""

    num_classes: int
    input_shape: InputShape
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def to_json(self) -> dict[str, object]:
        return {"num_classes": self.num_classes, "input_shape": list(self.input_shape), "mean": list(self.mean),
                "std": list(self.std)}

    @classmethod
    def from_json(cls, values: dict) -> DatasetFacts:
        return cls(int(values["num_classes"]), tuple(int(size) for size in values["input_shape"]),
                   tuple(float(value) for value in values["mean"]), tuple(float(value) for value in values["std"]))


def checked_arrays(arrays: dict[str, np.ndarray], origin: str) -> dict[str, np.ndarray]:
    """x_train, y_train, x_test, y_test in the module's form, or one DataError line naming `origin`."""
    missing = [key for key in RAW_ARRAYS if key not in arrays]
    if missing:
        raise DataError(f"{origin}: lacks the array{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                        f"(a dataset needs {', '.join(RAW_ARRAYS)})")
    checked: dict[str, np.ndarray] = {}
    for split in ("train", "test"):
        images = as_images(arrays[f"x_{split}"], f"{origin}: x_{split}")
        checked[f"x_{split}"] = images
        checked[f"y_{split}"] = as_labels(arrays[f"y_{split}"], len(images), f"{origin}: y_{split}")
    if checked["x_train"].shape[1:] != checked["x_test"].shape[1:]:
        raise DataError(f"{origin}: train images are {image_size(checked['x_train'])} but test images are "
                        f"{image_size(checked['x_test'])}; every image must have one size")
    if checked["x_train"].dtype != checked["x_test"].dtype:
        raise DataError(f"{origin}: x_train is {checked['x_train'].dtype} but x_test is {checked['x_test'].dtype}; "
                        "give both as uint8 or both as float")
    return checked


def image_size(images: np.ndarray) -> str:
    """"3x32x32": a sample's C x H x W."""
    return "x".join(str(size) for size in images.shape[1:])


def as_images(images: np.ndarray, where: str) -> np.ndarray:
    """Images [N, H, W], [N, H, W, C] or [N, C, H, W] (C in 1, 3), uint8 or float, as contiguous
    [N, C, H, W] uint8 or float32: the channel axis is the one of size 1 or 3 (the last when both are)."""
    images = np.asarray(images)
    if images.dtype == np.uint8:
        pass
    elif np.issubdtype(images.dtype, np.floating):
        images = images.astype(np.float32, copy=False)
        if not np.isfinite(images).all():
            raise DataError(f"{where}: holds NaN or infinite pixel values")
    else:
        raise DataError(f"{where}: images must be uint8 (0..255) or float, got {images.dtype}")
    if images.ndim == 3:
        images = images[:, None]
    elif images.ndim == 4 and images.shape[3] in CHANNELS:
        images = images.transpose(0, 3, 1, 2)
    elif images.ndim != 4 or images.shape[1] not in CHANNELS:
        raise DataError(f"{where}: images must be [N, H, W] (grey), [N, H, W, C] or [N, C, H, W] with C = 1 (grey) "
                        f"or 3 (RGB), got shape {images.shape}")
    if len(images) == 0 or min(images.shape[2:]) == 0:
        raise DataError(f"{where}: holds no image (shape {images.shape})")
    return np.ascontiguousarray(images)


def as_labels(labels: np.ndarray, count: int, where: str) -> np.ndarray:
    """Labels as int64 [count] >= 0, or one DataError line."""
    labels = np.asarray(labels)
    if labels.dtype == np.bool_ or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{where}: labels must be integers (class indices 0, 1, ...), got {labels.dtype}")
    if labels.ndim != 1 or len(labels) != count:
        raise DataError(f"{where}: needs one label per image, [{count}], got shape {labels.shape}")
    if labels.min() < 0:
        raise DataError(f"{where}: label {int(labels.min())} out of range: labels are class indices 0, 1, ...")
    return np.ascontiguousarray(labels, dtype=np.int64)


def derived_classes(y_train: np.ndarray, y_test: np.ndarray, origin: str) -> int:
    """C = max(y_train) + 1, the classes 0..C-1, each of which must have a training sample, and every
    test label among them (else one DataError line naming the classes)."""
    if int(y_train.max()) >= len(y_train):  # more classes than samples: some class is empty
        raise DataError(f"{origin}: y_train: label {int(y_train.max())} out of range: {len(y_train)} training "
                        f"samples cannot hold the classes 0..{int(y_train.max())}")
    num_classes = int(y_train.max()) + 1
    empty = np.flatnonzero(np.bincount(y_train, minlength=num_classes) == 0)
    if len(empty):
        raise DataError(f"{origin}: class{'es' if len(empty) > 1 else ''} {', '.join(map(str, empty))} "
                        f"{'have' if len(empty) > 1 else 'has'} no training sample (the classes are "
                        f"0..{num_classes - 1}: max(y_train) + 1)")
    unseen = np.unique(y_test[y_test >= num_classes])
    if len(unseen):
        raise DataError(f"{origin}: y_test has class{'es' if len(unseen) > 1 else ''} "
                        f"{', '.join(map(str, unseen[:10]))} unseen in training (the classes are 0..{num_classes - 1})")
    return num_classes


def channel_statistics(images: np.ndarray, name: str) -> Statistics:
    """Per-channel (mean, std) over [N, C, H, W] `images` in float64: of pixels/255 for uint8, of the
    values as they are for float; a channel of zero variance is one DataError line."""
    scale = 255.0 if images.dtype == np.uint8 else 1.0
    mean = images.mean(axis=(0, 2, 3), dtype=np.float64) / scale
    std = images.std(axis=(0, 2, 3), dtype=np.float64) / scale
    if np.any(std == 0):
        raise DataError(f"{name} dataset: a channel has zero variance in the training images; "
                        "they cannot be normalised")
    return tuple(float(value) for value in mean), tuple(float(value) for value in std)
