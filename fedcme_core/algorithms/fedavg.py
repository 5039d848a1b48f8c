"""FedAvg (McMahan et al., 2017): local loss = CE(w(x), y); aggregation by data size.

Everything FedAvg needs is the default behaviour of :class:`~.base.Algorithm`.
"""

from __future__ import annotations

from typing import Literal

from fedcme_core.algorithms.base import Algorithm
from fedcme_core.common.frozen import Frozen


class FedAvgConfig(Frozen):
    name: Literal["fedavg"] = "fedavg"


class FedAvg(Algorithm):
    config_class = FedAvgConfig
