"""FedAvg (McMahan et al., 2017): local loss = CE(w(x), y); aggregation by data size.

Everything FedAvg needs is the default behaviour of :class:`~.base.Algorithm`.
"""

from __future__ import annotations

from typing import Literal

from ..frozen import Frozen
from .base import Algorithm


class FedAvgConfig(Frozen):
    name: Literal["fedavg"] = "fedavg"


class FedAvg(Algorithm):
    config_class = FedAvgConfig
