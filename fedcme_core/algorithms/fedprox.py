"""FedProx (Li et al., MLSys 2020): L = CE(w(x), y) + (mu / 2) * ||w - w^t||^2.

The proximal term runs over the trainable parameters; mu = 0 is FedAvg exactly.
"""

from __future__ import annotations

import torch

from ..algorithm_configs import FedProxConfig
from ..models import SplitModel
from ..training import ClientHooks
from .base import Algorithm, ClientContext


class ProximalHooks(ClientHooks):
    def __init__(self, model: SplitModel, global_state, mu: float) -> None:
        self.mu = mu
        self.parameters = [parameter for _, parameter in model.named_parameters()]
        self.anchors = [global_state[name].detach().to(parameter.device, copy=True) for name, parameter in model.named_parameters()]

    def extra_loss(self, inputs, labels, features, logits) -> torch.Tensor:
        squared_distance = sum(
            torch.sum((parameter - anchor) ** 2) for parameter, anchor in zip(self.parameters, self.anchors)
        )
        return 0.5 * self.mu * squared_distance


class FedProx(Algorithm):
    config_class = FedProxConfig

    def client_hooks(self, model: SplitModel, context: ClientContext) -> ClientHooks:
        if self.config.mu == 0:
            return ClientHooks()
        return ProximalHooks(model, context.global_state, self.config.mu)
