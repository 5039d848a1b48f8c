"""FedRS (Li and Zhan, KDD 2021): restricted softmax against missing classes.

    L = CE(s * logits, y),   s_c = 1 if c in C_k else alpha          (scaling: presence)
                             s_c = alpha + (1 - alpha) * n_c / max_j n_j  (scaling: proportional)

alpha = 1 is FedAvg exactly.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedcme_core.algorithms.base import ClientContext
from fedcme_core.algorithms.fedavg import FedAvg
from fedcme_core.algorithms.settings import BaseAlgorithmConfig
from fedcme_core.client.hooks import ClientHooks
from fedcme_core.common.lazy import lazy_module

np = lazy_module("numpy")
torch = lazy_module("torch")
models = lazy_module("fedcme_core.client.models")


class FedRSConfig(BaseAlgorithmConfig):
    name: Literal["fedrs"] = "fedrs"
    display_name = "FedRS"
    label_parameter = "alpha"
    alpha: float = Field(0.5, gt=0, le=1)
    # presence: s_c = 1 if the client holds c else alpha (the paper);
    # proportional: s_c = alpha + (1 - alpha) * n_c / max_j n_j (the authors' code).
    scaling: Literal["presence", "proportional"] = "presence"


def class_scaling(class_counts: np.ndarray, alpha: float, scaling: str) -> torch.Tensor:
    """s [C] for a client holding `class_counts` [C] samples per class."""
    counts = np.asarray(class_counts, dtype=np.float64)
    if scaling == "presence":
        scale = np.where(counts > 0, 1.0, alpha)
    elif scaling == "proportional":
        scale = alpha + (1.0 - alpha) * counts / max(counts.max(), 1.0)
    else:
        raise ValueError(f"algorithm.scaling: unknown scaling {scaling!r}; choose presence or proportional")
    return torch.tensor(scale, dtype=torch.float32)


class RestrictedSoftmaxHooks(ClientHooks):
    """s [C] on the model's device, moved once per client and round (a step moves nothing)."""

    def __init__(self, scale: torch.Tensor, device: torch.device | str = "cpu") -> None:
        self.scale = scale.to(device)  # [C]

    def transform_logits(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return logits * self.scale  # [B, C]


class FedRS(FedAvg):
    config_class = FedRSConfig

    def client_hooks(self, model: models.SplitModel, context: ClientContext) -> ClientHooks:
        return RestrictedSoftmaxHooks(class_scaling(context.class_counts, self.config.alpha, self.config.scaling),
                                      next(model.parameters()).device)
