"""FedAvg (McMahan et al., 2017): local loss = CE(w(x), y); aggregation by data size.

Everything FedAvg needs is the default behaviour of :class:`~.base.Algorithm`.
"""

from __future__ import annotations

from ..algorithm_configs import FedAvgConfig
from .base import Algorithm


class FedAvg(Algorithm):
    config_class = FedAvgConfig
