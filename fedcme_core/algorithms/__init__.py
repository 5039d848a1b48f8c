"""Algorithms as hooks (see ``base.Algorithm``), and the one registry of them.

Each module declares its algorithm class, whose ``config_class`` (the model of its ``algorithm:``
section, in the torch-free :mod:`fedcme_core.algorithm_configs`) gives its name, the config's
``name`` literal; adding an algorithm is one config class there, one module and one line here.
"""

from __future__ import annotations

from ..algorithm_configs import ALGORITHM_NAMES, AlgorithmConfig
from .base import Algorithm, ClientContext, Matching, Upload
from .fedavg import FedAvg
from .fedcme import FedCME
from .fedprox import FedProx
from .fedrs import FedRS
from .moon import Moon
from .scaffold import Scaffold

ALGORITHM_CLASSES: tuple[type[Algorithm], ...] = (FedAvg, FedProx, Moon, FedRS, FedCME, Scaffold)
ALGORITHMS: dict[str, type[Algorithm]] = {cls.name: cls for cls in ALGORITHM_CLASSES}


def build_algorithm(config) -> Algorithm:
    """The Algorithm for an `algorithm:` config section (selected by its `name`)."""
    return ALGORITHMS[config.name](config)


__all__ = ["ALGORITHMS", "ALGORITHM_NAMES", "Algorithm", "AlgorithmConfig", "ClientContext", "Matching", "Upload",
           "build_algorithm"]
