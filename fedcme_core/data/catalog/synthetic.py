"""``synthetic``: per-class fixed random templates plus Gaussian noise, of any shape, for tests and smoke
runs without real data. Its arrays are float32 and a pure function of the spec (seed included); its
channel statistics are its own training set's. The prepare stage does not write it: a run makes it."""

from __future__ import annotations

import numpy as np

from fedcme_core.common.lazy import lazy_module
from fedcme_core.common.seeding import numpy_rng
from fedcme_core.data.catalog.base import InputShape, Source, SourceSettings, SyntheticSpec
from fedcme_core.data.sources import DataError

torch = lazy_module("torch")
F = lazy_module("torch.nn.functional")


class Synthetic(Source):
    name = "synthetic"
    label = "Synthetic"
    preparable = False

    def arrays(self, settings: SourceSettings) -> dict[str, np.ndarray]:
        spec = settings.synthetic
        validate(spec)
        templates = templates_of(spec)
        x_train, y_train = draw_split(spec, templates, spec.num_train, "synthetic-train")
        x_test, y_test = draw_split(spec, templates, spec.num_test, "synthetic-test")
        return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}

    def shape(self, settings: SourceSettings) -> InputShape | None:
        return tuple(int(size) for size in settings.synthetic.shape)

    def classes(self, settings: SourceSettings) -> int | None:
        return settings.synthetic.num_classes


def validate(spec: SyntheticSpec) -> None:
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


def templates_of(spec: SyntheticSpec) -> np.ndarray:
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


def draw_split(spec: SyntheticSpec, templates: np.ndarray, count: int, tag: str) -> tuple[np.ndarray, np.ndarray]:
    """`count` samples: labels uniform over the classes, images template[label] + noise * N(0, 1)."""
    rng = numpy_rng(spec.seed, tag)
    labels = rng.integers(0, spec.num_classes, size=count, dtype=np.int64)
    noise = rng.standard_normal((count, *templates.shape[1:]), dtype=np.float32)
    images = templates[labels] + np.float32(spec.noise) * noise
    return np.ascontiguousarray(images, dtype=np.float32), labels
