"""FedRS (Li and Zhan, KDD 2021): restricted softmax against missing classes.

    L = CE(s * logits, y),   s_c = 1 if c in C_k else alpha          (scaling: presence)
                             s_c = alpha + (1 - alpha) * n_c / max_j n_j  (scaling: proportional)

alpha = 1 is FedAvg exactly.
"""

from __future__ import annotations

import numpy as np
import torch

from ..algorithm_configs import FedRSConfig
from ..models import SplitModel
from ..training import ClientHooks
from .base import Algorithm, ClientContext


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
    def __init__(self, scale: torch.Tensor) -> None:
        self.scale = scale  # [C]

    def transform_logits(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return logits * self.scale.to(logits.device)  # [B, C]


class FedRS(Algorithm):
    config_class = FedRSConfig

    def client_hooks(self, model: SplitModel, context: ClientContext) -> ClientHooks:
        return RestrictedSoftmaxHooks(class_scaling(context.class_counts, self.config.alpha, self.config.scaling))
