"""Algorithms as hooks: FedAvg, FedProx, MOON, FedRS and FedCME (see ``base.Algorithm``)."""

from __future__ import annotations

from .base import Algorithm, ClientContext, Matching
from .fedavg import FedAvg
from .fedcme import FedCME
from .fedprox import FedProx
from .fedrs import FedRS
from .moon import Moon

ALGORITHMS: dict[str, type[Algorithm]] = {
    "fedavg": FedAvg,
    "fedprox": FedProx,
    "moon": Moon,
    "fedrs": FedRS,
    "fedcme": FedCME,
}


def build_algorithm(config) -> Algorithm:
    """The Algorithm for an `algorithm:` config section (selected by its `name`)."""
    return ALGORITHMS[config.name](config)


__all__ = ["ALGORITHMS", "Algorithm", "ClientContext", "Matching", "build_algorithm"]
