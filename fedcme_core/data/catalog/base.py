"""What a data source is (no torch): the record of the registry (:mod:`fedcme_core.data.catalog`).

A source turns its settings into raw arrays: images ``x_train``/``x_test`` as uint8 (pixels in 0..255)
or float32 [N, C, H, W], labels ``y_train``/``y_test`` as int64 [N]. What it does not declare (the
number of classes, the input shape, the channel statistics) is derived from its training set
(:func:`fedcme_core.data.catalog.checks.derive`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from fedcme_core.data.sources import DataError

InputShape = tuple[int, int, int]  # (channels, height, width) of one sample
Statistics = tuple[tuple[float, ...], tuple[float, ...]]  # per-channel (mean, std) of pixels in [0, 1]


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


@dataclass(frozen=True)
class SourceSettings:
    """What a source may read: `data_dir` (the project's own folder for decompressed files, downloads
    and stamps), `mirror` (the read-only official files, or None), `path` (``data.path``: a researcher's
    own data) and `synthetic` (the synthetic dataset's spec)."""

    data_dir: Path = Path("data/raw")
    mirror: Path | None = None
    path: Path | None = None
    synthetic: SyntheticSpec = SyntheticSpec()


class Source:
    """A dataset source. A subclass sets `name` (its ``data.dataset``) and `label` (its name in report
    titles) and implements :meth:`arrays`; it declares `input_shape`, `num_classes` and `statistics`
    where they are fixed (None: derived from the training set), `augment` (its default
    ``data.augment``), `needs_path` (it reads ``data.path``) and `preparable` (the DVC prepare stage
    writes its arrays; False for data a seed generates)."""

    name: ClassVar[str]
    label: ClassVar[str]
    input_shape: ClassVar[InputShape | None] = None
    num_classes: ClassVar[int | None] = None
    statistics: ClassVar[Statistics | None] = None
    augment: ClassVar[str] = "none"
    needs_path: ClassVar[bool] = False
    preparable: ClassVar[bool] = True

    def arrays(self, settings: SourceSettings) -> dict[str, np.ndarray]:
        """x_train, y_train, x_test, y_test as described in this module's docstring; a source that
        cannot read them raises one DataError line naming the file and why."""
        raise NotImplementedError

    def shape(self, settings: SourceSettings) -> InputShape | None:
        """The (C, H, W) of its samples as far as known without reading the data (config validation):
        the declared `input_shape`; a source that derives it may read a file's header (None: unknown)."""
        return self.input_shape

    def classes(self, settings: SourceSettings) -> int | None:
        """Its number of classes where it is fixed (the declared `num_classes`); None: max(y_train) + 1."""
        return self.num_classes

    def peek_classes(self, settings: SourceSettings) -> int | None:
        """Its number of classes as far as known without reading the data (config validation): the fixed
        one; a source that derives it may count folders or read its labels (None: unknown)."""
        return self.classes(settings)

    def origin(self, settings: SourceSettings) -> dict[str, Any] | None:
        """What the arrays were read from, recorded beside the prepared arrays (a path and its sha256);
        None for a source whose files are verified against known digests (the mirror's)."""
        return None

    def data_path(self, settings: SourceSettings) -> Path:
        """``data.path``, which this source needs; one DataError line when it is unset."""
        if settings.path is None:
            raise DataError(f"data.path: missing; data.dataset {self.name} reads its data from data.path")
        return Path(settings.path)
