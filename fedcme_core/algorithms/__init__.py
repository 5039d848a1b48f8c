"""Algorithms as hooks (see ``base.Algorithm``), and the one registry of them.

Adding an algorithm is one new module here and one line in ``ALGORITHMS`` below. The module
defines the algorithm's config class (a :class:`~.settings.BaseAlgorithmConfig`, the pydantic model
of its ``algorithm:`` section, whose ``name`` literal is the algorithm's name and which says how the
algorithm is shown and checked) and its Algorithm subclass (usually of
:class:`~.fedavg.FedAvg`, which implements every hook), which names that class (``config_class``)
and overrides the hooks it needs. Everything else is derived from the registry, here: the names
(``ALGORITHM_NAMES``), the config classes (``ALGORITHM_CONFIGS``: the report's and the tracking's
tables read them) and their discriminated union (``AlgorithmConfig``), which the experiment config
(``fedcme_core.config.schema``) and the params files use, and :func:`build_algorithm`, which the
round code uses. No module outside this package names an algorithm (``tests/test_algorithm_names.py``).

Importing this package imports no torch (:mod:`fedcme_core.common.lazy`): a config is validated
before torch loads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Union

from pydantic import Field

from fedcme_core.algorithms.base import (
    Algorithm, AlgorithmState, ClientContext, Matching, Phase, RecordSection, Upload, round_phases,
)
from fedcme_core.algorithms.fedavg import FedAvg
from fedcme_core.algorithms.fedcme import FedCME
from fedcme_core.algorithms.fedprox import FedProx
from fedcme_core.algorithms.fedrs import FedRS
from fedcme_core.algorithms.moon import Moon
from fedcme_core.algorithms.scaffold import Scaffold
from fedcme_core.algorithms.settings import BaseAlgorithmConfig, PaperClaims


def registry(classes: Iterable[type[Algorithm]]) -> dict[str, type[Algorithm]]:
    """name -> Algorithm class, in the order given; each class must implement every hook and name a
    config class of its own (a BaseAlgorithmConfig), and no two the same name."""
    algorithms: dict[str, type[Algorithm]] = {}
    for cls in classes:
        if "config_class" not in cls.__dict__:
            raise TypeError(f"{cls.__name__} names no config_class (the model of its `algorithm:` section)")
        if not issubclass(cls.config_class, BaseAlgorithmConfig):
            raise TypeError(f"{cls.__name__}: its config_class {cls.config_class.__name__} is no BaseAlgorithmConfig")
        if cls.__abstractmethods__:
            raise TypeError(f"{cls.__name__} leaves hooks unimplemented: {', '.join(sorted(cls.__abstractmethods__))} "
                            "(subclass FedAvg for its defaults)")
        if cls.name in algorithms:
            raise ValueError(f"algorithm name {cls.name!r} is taken by {algorithms[cls.name].__name__}")
        algorithms[cls.name] = cls
    return algorithms


def config_union(algorithms: Mapping[str, type[Algorithm]]) -> Any:
    """The `algorithm:` section's type: one of the registered config classes, chosen by `name`."""
    return Annotated[Union[tuple(cls.config_class for cls in algorithms.values())], Field(discriminator="name")]


# The registry: one line per algorithm.
ALGORITHMS: dict[str, type[Algorithm]] = registry([
    FedAvg,
    FedProx,
    Moon,
    FedRS,
    FedCME,
    Scaffold,
])
ALGORITHM_NAMES: tuple[str, ...] = tuple(ALGORITHMS)
ALGORITHM_CONFIGS: tuple[type[BaseAlgorithmConfig], ...] = tuple(cls.config_class for cls in ALGORITHMS.values())
AlgorithmConfig = config_union(ALGORITHMS)
DEFAULT_ALGORITHM: BaseAlgorithmConfig = FedCME.config_class()  # the experiment config's default: the paper's method


def build_algorithm(config: BaseAlgorithmConfig) -> Algorithm:
    """The Algorithm for an `algorithm:` config section (selected by its `name`)."""
    return ALGORITHMS[config.name](config)


def readings(configs: Iterable[type[BaseAlgorithmConfig]] = ALGORITHM_CONFIGS) -> tuple[str, ...]:
    """The options that are readings the papers leave open, of every algorithm in `configs`, in order
    (the report's summary has a column for each)."""
    return tuple(dict.fromkeys(key for cls in configs for key in cls.readings))


__all__ = ["ALGORITHMS", "ALGORITHM_CONFIGS", "ALGORITHM_NAMES", "Algorithm", "AlgorithmConfig", "AlgorithmState",
           "BaseAlgorithmConfig", "ClientContext", "DEFAULT_ALGORITHM", "Matching", "PaperClaims", "Phase",
           "RecordSection", "Upload", "build_algorithm", "config_union", "readings", "registry", "round_phases"]
