"""Algorithms as hooks (see ``base.Algorithm``), and the one registry of them.

Each module declares its algorithm class and that class's config (``config_class``, whose
``name`` literal is the algorithm's name); the config union and the name list derive from
:data:`ALGORITHM_CLASSES` alone, so adding an algorithm is one module and one line here.
"""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import Field

from .base import Algorithm, ClientContext, Matching, Upload
from .fedavg import FedAvg
from .fedcme import FedCME
from .fedprox import FedProx
from .fedrs import FedRS
from .moon import Moon
from .scaffold import Scaffold

ALGORITHM_CLASSES: tuple[type[Algorithm], ...] = (FedAvg, FedProx, Moon, FedRS, FedCME, Scaffold)
ALGORITHMS: dict[str, type[Algorithm]] = {cls.name: cls for cls in ALGORITHM_CLASSES}
ALGORITHM_NAMES = tuple(ALGORITHMS)
AlgorithmConfig = Annotated[Union[tuple(cls.config_class for cls in ALGORITHM_CLASSES)], Field(discriminator="name")]


def build_algorithm(config) -> Algorithm:
    """The Algorithm for an `algorithm:` config section (selected by its `name`)."""
    return ALGORITHMS[config.name](config)


__all__ = ["ALGORITHMS", "ALGORITHM_NAMES", "Algorithm", "AlgorithmConfig", "ClientContext", "Matching", "Upload",
           "build_algorithm"]
