"""What an algorithm is: a small set of hooks over one local loop and one round loop.

Client side: :class:`~fedcme_core.training.ClientHooks` (``extra_loss``,
``transform_logits``), built per client and round from a :class:`ClientContext`.
Server side: ``match`` (who exchanges with whom), ``exchange_part`` (what is exchanged),
and flags telling the round which uploads and per-client state the algorithm needs.
The defaults are FedAvg's (McMahan et al., 2017): cross-entropy only, no matching.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ..features import GlobalFeatures
from ..models import SplitModel
from ..training import ClientHooks


@dataclass(frozen=True)
class ClientContext:
    """What the server broadcasts to a selected client for one round, plus its own state."""

    client_id: int
    round_index: int
    class_counts: np.ndarray  # [C] samples per class held by the client (n_k[c])
    global_state: Mapping[str, torch.Tensor]  # w^t
    global_features: GlobalFeatures | None = None  # zeta^t (FedCME)
    previous_state: Mapping[str, torch.Tensor] | None = None  # the client's last local model (MOON)


@dataclass(frozen=True)
class Matching:
    """A round's matching: `pairs` as formed (for the record) and receiver -> donor."""

    pairs: list[tuple[int, int]] = field(default_factory=list)
    donors: dict[int, int] = field(default_factory=dict)


class Algorithm:
    """FedAvg, and the base every other algorithm overrides a few hooks of."""

    name = "fedavg"
    exchange_part: str = "none"  # none | classifier | extractor | model
    uses_evaluation_vectors = False  # clients upload eps_k (FedCME matching)
    uses_global_features = False  # clients upload zeta_k, the server keeps zeta (FedCME alignment)
    keeps_client_state = False  # the client's last local model is kept between rounds (MOON)

    def __init__(self, config) -> None:
        self.config = config

    @property
    def exchanges(self) -> bool:
        return self.exchange_part != "none"

    def client_hooks(self, model: SplitModel, context: ClientContext) -> ClientHooks:
        return ClientHooks()

    def match(self, selected: Sequence[int], evaluation_vectors: Mapping[int, np.ndarray], *, seed: int, round_index: int) -> Matching:
        return Matching()


def frozen_copy(model: SplitModel, state: Mapping[str, torch.Tensor]) -> SplitModel:
    """An eval-mode, gradient-free model of the same architecture holding `state`."""
    reference = copy.deepcopy(model)
    reference.load_state_dict(state)
    reference.eval()
    for parameter in reference.parameters():
        parameter.requires_grad_(False)
    return reference
