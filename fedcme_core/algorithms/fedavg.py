"""FedAvg (McMahan et al., 2017): local loss = CE(w(x), y); aggregation by data size.

The default implementation of every hook of :class:`~.base.Algorithm`: one local phase, no
matching and no exchange, no client hooks, nothing uploaded besides the model, nothing kept for a
client or by the server, an empty record section. The other algorithms subclass it and override
the hooks they need.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from fedcme_core.algorithms.base import Algorithm, AlgorithmState, ClientContext, Matching, Phase, RecordSection, Upload
from fedcme_core.algorithms.settings import BaseAlgorithmConfig
from fedcme_core.client.hooks import ClientHooks
from fedcme_core.common.lazy import lazy_module

torch = lazy_module("torch")  # named by the annotations only
models = lazy_module("fedcme_core.client.models")


class FedAvgConfig(BaseAlgorithmConfig):
    name: Literal["fedavg"] = "fedavg"
    display_name = "FedAvg"


class FedAvg(Algorithm):
    config_class = FedAvgConfig
    state_class = AlgorithmState
    record_class = RecordSection

    # ---------------------------------------------------------------- the round's shape
    def phases(self, local_epochs: int) -> list[Phase]:
        """One phase of all E local epochs."""
        return [Phase(0, local_epochs)]

    def match(self, selected: Sequence[int], server: AlgorithmState, *, seed: int, round_index: int) -> Matching:
        """Nobody."""
        return Matching()

    def exchange(self, sources: Mapping[int, Path], donors: Mapping[int, int],
                 destinations: Mapping[int, Path]) -> list[int]:
        """Nothing changes hands."""
        return []

    # --------------------------------------------------------------------- client side
    def client_hooks(self, model: models.SplitModel, context: ClientContext) -> ClientHooks:
        """Cross-entropy alone."""
        return ClientHooks()

    def client_update(self, model: models.SplitModel, inputs: torch.Tensor, labels: torch.Tensor,
                      context: ClientContext, hooks: ClientHooks) -> dict[str, Any]:
        """Nothing besides the model."""
        return {}

    def client_state(self, model_state: Mapping[str, torch.Tensor], report: Mapping[str, Any],
                     context: ClientContext) -> dict[str, Any] | None:
        """Nothing kept."""
        return None

    # --------------------------------------------------------------------- server side
    def server_init(self, global_state: Mapping[str, torch.Tensor]) -> AlgorithmState:
        return self.state_class()

    def server_update(self, server: AlgorithmState, uploads: Sequence[Upload], num_clients: int) -> AlgorithmState:
        """The state as it was (FedAvg's holds nothing)."""
        return server

    def server_record(self, matching: Matching, uploads: Sequence[Upload]) -> RecordSection:
        return self.record_class()
