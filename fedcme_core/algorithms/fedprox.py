"""FedProx (Li et al., MLSys 2020): L = CE(w(x), y) + (mu / 2) * ||w - w^t||^2.

The proximal term runs over the trainable parameters; mu = 0 is FedAvg exactly.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedcme_core.algorithms.base import ClientContext
from fedcme_core.algorithms.fedavg import FedAvg
from fedcme_core.algorithms.settings import BaseAlgorithmConfig
from fedcme_core.client.hooks import ClientHooks
from fedcme_core.common.lazy import lazy_module

torch = lazy_module("torch")
models = lazy_module("fedcme_core.client.models")


class FedProxConfig(BaseAlgorithmConfig):
    name: Literal["fedprox"] = "fedprox"
    display_name = "FedProx"
    label_parameter = "mu"
    mu: float = Field(0.01, ge=0)


class ProximalHooks(ClientHooks):
    def __init__(self, model: models.SplitModel, global_state, mu: float) -> None:
        self.mu = mu
        self.parameters = [parameter for _, parameter in model.named_parameters()]
        self.anchors = [global_state[name].detach().to(parameter.device, copy=True) for name, parameter in model.named_parameters()]

    def extra_loss(self, inputs, labels, features, logits) -> torch.Tensor:
        squared_distance = sum(
            torch.sum((parameter - anchor) ** 2) for parameter, anchor in zip(self.parameters, self.anchors)
        )
        return 0.5 * self.mu * squared_distance


class FedProx(FedAvg):
    config_class = FedProxConfig

    def client_hooks(self, model: models.SplitModel, context: ClientContext) -> ClientHooks:
        if self.config.mu == 0:
            return ClientHooks()
        return ProximalHooks(model, context.global_state, self.config.mu)
