"""FedCME (Nie, Xiao, Yang and Wu, arXiv:2307.08574): client matching, classifier exchange
and feature alignment on top of FedAvg.

    L = CE(w(x), y) + mu * mean_{c in batch, zeta[c] defined} (mean_{i in B_c} theta(x_i) - zeta^t[c])^2

Three pieces, each switched by its own setting, which is how the paper's ablations are
configs rather than code:
- matching (``matching``: pairwise | many_to_one) of the selected clients by the cosine
  similarity of their evaluation vectors (Algorithm 1, line 8: MakeMatching);
- exchange (``exchange``: classifier | extractor | model | none) after floor(E/2) epochs
  (Algorithm 2, line 22);
- alignment (``mu``; 0 disables it) of local features to the server's global features.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from ..features import GlobalFeatures, alignment_loss
from ..matching import counterparts, many_to_one_round, match_round
from ..models import SplitModel
from ..training import ClientHooks
from .base import Algorithm, ClientContext, Matching


class AlignmentHooks(ClientHooks):
    def __init__(self, global_features: GlobalFeatures, mu: float, reduction: str, device: torch.device) -> None:
        self.global_features = global_features.to(device)
        self.mu = mu
        self.reduction = reduction

    def extra_loss(self, inputs, labels, features, logits) -> torch.Tensor | None:
        loss = alignment_loss(features, labels, self.global_features, reduction=self.reduction)
        return None if loss is None else self.mu * loss


class FedCME(Algorithm):
    name = "fedcme"
    uses_evaluation_vectors = True

    def __init__(self, config) -> None:
        super().__init__(config)
        self.exchange_part = config.exchange
        self.uses_global_features = config.mu > 0

    def client_hooks(self, model: SplitModel, context: ClientContext) -> ClientHooks:
        # No alignment before the server holds global features (round 0).
        if self.config.mu == 0 or context.global_features is None or not context.global_features.any_defined:
            return ClientHooks()
        device = next(model.parameters()).device
        return AlignmentHooks(context.global_features, self.config.mu, self.config.align_reduction, device)

    def match(self, selected: Sequence[int], evaluation_vectors: Mapping[int, np.ndarray], *, seed: int, round_index: int) -> Matching:
        if not self.exchanges:
            return Matching()
        if self.config.matching == "many_to_one":
            donors = many_to_one_round(selected, evaluation_vectors, seed=seed, round_index=round_index)
            return Matching(pairs=sorted(donors.items()), donors=donors)
        pairs = match_round(selected, evaluation_vectors, seed=seed, round_index=round_index)
        return Matching(pairs=pairs, donors=counterparts(pairs))
