"""MOON (Li, He and Song, CVPR 2021): model-contrastive learning.

    L = CE(w(x), y) + mu * CE([cos(z, z_glob), cos(z, z_prev)] / tau, 0)

z is the projection-head output of the local model ([B, p], what ``features`` returns),
z_glob that of the frozen global model w^t, z_prev that of the client's previous local
model (the global model when the client has none yet). The previous model is the state
MOON keeps for each client between its rounds (``client_state``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from fedcme_core.algorithms.base import ClientContext, frozen_copy
from fedcme_core.algorithms.fedavg import FedAvg
from fedcme_core.algorithms.settings import BaseAlgorithmConfig
from fedcme_core.client.hooks import ClientHooks
from fedcme_core.common.lazy import lazy_module

torch = lazy_module("torch")
F = lazy_module("torch.nn.functional")
models = lazy_module("fedcme_core.client.models")


class MoonConfig(BaseAlgorithmConfig):
    name: Literal["moon"] = "moon"
    display_name = "MOON"
    label_parameter = "mu"
    projection_dim = 256  # the projection head's output size z (model.projection_dim overrides it)
    mu: float = Field(1.0, ge=0)
    tau: float = Field(0.5, gt=0)


class ContrastiveHooks(ClientHooks):
    def __init__(self, global_model: models.SplitModel, previous_model: models.SplitModel, mu: float,
                 tau: float) -> None:
        self.global_model = global_model
        self.previous_model = previous_model
        self.mu = mu
        self.tau = tau

    def extra_loss(self, inputs, labels, features, logits) -> torch.Tensor:
        with torch.no_grad():
            global_projection = self.global_model.features(inputs)  # [B, p]
            previous_projection = self.previous_model.features(inputs)  # [B, p]
        positive = F.cosine_similarity(features, global_projection, dim=-1)  # [B]
        negative = F.cosine_similarity(features, previous_projection, dim=-1)  # [B]
        contrast_logits = torch.stack([positive, negative], dim=1) / self.tau  # [B, 2]
        targets = torch.zeros(features.shape[0], dtype=torch.long, device=features.device)
        return self.mu * F.cross_entropy(contrast_logits, targets)


class Moon(FedAvg):
    config_class = MoonConfig

    def client_hooks(self, model: models.SplitModel, context: ClientContext) -> ClientHooks:
        if self.config.mu == 0:
            return ClientHooks()
        global_model = frozen_copy(model, context.global_state)
        previous_state = context.client_state["model"] if context.client_state is not None else context.global_state
        previous_model = frozen_copy(model, previous_state)
        return ContrastiveHooks(global_model, previous_model, self.config.mu, self.config.tau)

    def client_state(self, model_state: Mapping[str, torch.Tensor], report: Mapping[str, Any],
                     context: ClientContext) -> dict[str, Any]:
        """z_prev's model for the client's next round: its local model of this round."""
        return {"model": dict(model_state)}
