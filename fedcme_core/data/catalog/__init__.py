"""Data sources, and the one registry of them (no torch).

Adding a source is one new module here and one line in ``SOURCES`` below. The module defines a
:class:`~.base.Source` subclass: its ``name`` (the ``data.dataset`` that picks it), its ``label``, what
is fixed about it (input shape, number of classes, channel statistics; None where they are derived
from its training set) and :meth:`~.base.Source.arrays`, which reads its raw arrays. Everything else
is derived from the registry, here: the names (:data:`SOURCE_NAMES`, the ones the prepare stage
writes: :func:`preparable_names`), :func:`read_source` (the arrays checked, and what training needs
to know of them) and the config's checks (:mod:`fedcme_core.config.data_sources`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedcme_core.data.catalog.base import InputShape, Source, SourceSettings, Statistics, SyntheticSpec
from fedcme_core.data.catalog.checks import DatasetFacts, channel_statistics, checked_arrays, derived_classes
from fedcme_core.data.catalog.imagefolder import ImageFolder
from fedcme_core.data.catalog.npz import Npz
from fedcme_core.data.catalog.official import CIFAR10, FashionMNIST
from fedcme_core.data.catalog.synthetic import Synthetic
from fedcme_core.data.sources import DataError


def registry(classes: Iterable[type[Source]]) -> dict[str, Source]:
    """name -> Source, in the order given; no two the same name."""
    sources: dict[str, Source] = {}
    for cls in classes:
        if cls.name in sources:
            raise ValueError(f"source name {cls.name!r} is taken by {type(sources[cls.name]).__name__}")
        sources[cls.name] = cls()
    return sources


# The registry: one line per source.
SOURCES: dict[str, Source] = registry([
    FashionMNIST,
    CIFAR10,
    Synthetic,
    Npz,
    ImageFolder,
])
SOURCE_NAMES: tuple[str, ...] = tuple(SOURCES)  # the built-in sources (a test may register more in SOURCES)


def source(name: str) -> Source:
    """The registered source `name`; else one DataError line naming the choices."""
    if name not in SOURCES:
        raise DataError(f"unknown dataset {name!r}: expected one of {', '.join(SOURCES)}")
    return SOURCES[name]


def preparable_names() -> tuple[str, ...]:
    """The sources the DVC prepare stage writes (a grid's datasets): all but those a seed generates."""
    return tuple(name for name, registered in SOURCES.items() if registered.preparable)


@dataclass(frozen=True)
class SourceData:
    """A source's checked arrays (images uint8 or float32 [N, C, H, W], labels int64 [N]), the facts of
    the dataset, whether they were derived from its training set (else declared by the source), and
    what the arrays were read from (None for the mirror's verified files)."""

    arrays: dict[str, np.ndarray]
    facts: DatasetFacts
    derived: bool
    origin: dict[str, Any] | None


def read_source(name: str, settings: SourceSettings, with_origin: bool = False) -> SourceData:
    """The arrays of source `name` under `settings`, checked, with the dataset's facts: declared where
    the source fixes them, else derived from its training set (the classes 0..max(y_train), each with a
    training sample; the input shape; the channel statistics). Any problem is one DataError line.
    `with_origin`: also hash what the arrays were read from (the prepare stage records it)."""
    registered = source(name)
    where = str(settings.path) if registered.needs_path else name
    arrays = registered.arrays(settings)
    origin = registered.origin(settings) if with_origin else None
    if registered.preparable:  # files a person made: checked; generated data is made in form
        arrays = checked_arrays(arrays, where)
    classes = registered.classes(settings)
    if classes is None:
        classes = derived_classes(arrays["y_train"], arrays["y_test"], where)
    statistics = registered.statistics or channel_statistics(arrays["x_train"], name)
    facts = DatasetFacts(classes, tuple(int(size) for size in arrays["x_train"].shape[1:]), *statistics)
    derived = registered.classes(settings) is None or registered.statistics is None
    return SourceData(arrays, facts, derived, origin)


def declared_facts(name: str, input_shape: InputShape) -> DatasetFacts:
    """The facts of a source that declares its classes and statistics (the official datasets, whose
    prepared folders record none), with the (C, H, W) of its arrays; others must have theirs recorded."""
    registered = source(name)
    if registered.num_classes is None or registered.statistics is None:
        raise DataError(f"dataset {name}: its prepared folder records no derived facts (classes, statistics); "
                        "run the prepare stage again")
    return DatasetFacts(registered.num_classes, tuple(int(size) for size in input_shape), *registered.statistics)


__all__ = ["DatasetFacts", "InputShape", "SOURCES", "SOURCE_NAMES", "Source", "SourceData", "SourceSettings",
           "Statistics", "SyntheticSpec", "declared_facts", "preparable_names", "read_source", "registry", "source"]
