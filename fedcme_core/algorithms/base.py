"""What an algorithm is: a small set of hooks over one local loop and one round loop.

Flower's strategies and fedjax's algorithms are the model: one base whose defaults are
FedAvg's (McMahan et al., 2017: cross-entropy only, no matching, the server averages the
models by data size and keeps nothing else), and each algorithm overrides a few hooks.

Client side: :class:`~fedcme_core.training.ClientHooks` (``extra_loss``, ``transform_logits``,
``after_step``), built per client and round from a :class:`ClientContext` (what the client
receives), then ``client_report`` (what it uploads besides its model) and ``client_state``
(what is kept for it until its next round: MOON's previous model, SCAFFOLD's c_i).
Server side: ``initial_server_state`` and ``aggregate_state`` (the algorithm's own server
state: FedCME's global features and evaluation vectors, SCAFFOLD's c), ``match`` (who
exchanges with whom), ``phases`` and ``exchange`` (what is exchanged after floor(E/2) epochs),
and ``round_record`` (what the round's record carries from the uploads).

The round code (``fedcme_core.rounds``) calls these hooks and interprets no algorithm flag.
An algorithm module names its config class once (``config_class``, from the torch-free
``fedcme_core.algorithm_configs``, where the config union and the name list live); the name is
that config's ``name`` literal, and ``algorithms/__init__.py`` holds the registry.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from ..exchange import exchange_checkpoints
from ..models import SplitModel
from ..training import ClientHooks

ServerState = Mapping[str, Any]  # an algorithm's own server state: tensors and plain containers


@dataclass(frozen=True)
class ClientContext:
    """What the server sends a selected client for one round, plus what was kept for it."""

    client_id: int
    round_index: int
    class_counts: np.ndarray  # [C] samples per class held by the client (n_k[c])
    global_state: Mapping[str, torch.Tensor]  # w^t
    seed: int  # the experiment seed (for the client's own random choices, e.g. D_eval_k)
    learning_rate: float  # the local SGD step size (training.lr)
    server: ServerState = field(default_factory=dict)  # the algorithm's server state (zeta^t, c, ...)
    client_state: Mapping[str, Any] | None = None  # kept for this client since its last round, if any


@dataclass(frozen=True)
class Matching:
    """A round's matching: `pairs` as formed (for the record) and receiver -> donor."""

    pairs: list[tuple[int, int]] = field(default_factory=list)
    donors: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Upload:
    """One client's accepted upload, as the server aggregates it."""

    client: int
    num_samples: int
    model: Mapping[str, torch.Tensor]  # w_k^{t+1}
    report: Mapping[str, Any]  # what `client_report` added


class Algorithm:
    """FedAvg, and the base every other algorithm overrides a few hooks of."""

    name: ClassVar[str] = "fedavg"
    config_class: ClassVar[type]  # the pydantic model of its `algorithm:` section (set by each module)
    exchange_part: str = "none"  # none | classifier | extractor | model
    exchange_optimizer: str = "reset"  # the received part's momentum: reset | swap

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "config_class" in cls.__dict__:  # the name is the config's `name` literal, declared once
            cls.name = cls.config_class.model_fields["name"].default

    def __init__(self, config) -> None:
        self.config = config

    # ---------------------------------------------------------------- the round's shape
    def phases(self, local_epochs: int) -> list[tuple[int, int]]:
        """(first, last) epoch of each local phase; an exchanging algorithm splits at floor(E/2)."""
        if self.exchange_part == "none":
            return [(0, local_epochs)]
        return [(0, local_epochs // 2), (local_epochs // 2, local_epochs)]

    def match(self, selected: Sequence[int], server: ServerState, *, seed: int, round_index: int) -> Matching:
        """Who exchanges with whom this round (Algorithm 1, line 8); nobody by default."""
        return Matching()

    def exchange(self, sources: Mapping[int, Path], donors: Mapping[int, int],
                 destinations: Mapping[int, Path]) -> list[int]:
        """SPEC step 5 at the barrier: each receiver's swap checkpoint gets its donor's part."""
        if not donors:
            return []
        return exchange_checkpoints(sources, donors, self.exchange_part, destinations, self.exchange_optimizer)

    # --------------------------------------------------------------------- client side
    def client_hooks(self, model: SplitModel, context: ClientContext) -> ClientHooks:
        return ClientHooks()

    def client_report(self, model: SplitModel, inputs: torch.Tensor, labels: torch.Tensor,
                      context: ClientContext, hooks: ClientHooks) -> dict[str, Any]:
        """What the client uploads besides its model and sample count (SPEC step 7), after
        training; `inputs` [D_k, C_in, H, W] and `labels` [D_k] are its whole local data."""
        return {}

    def client_state(self, model_state: Mapping[str, torch.Tensor], report: Mapping[str, Any],
                     context: ClientContext) -> dict[str, Any] | None:
        """What is kept for this client until it is selected again (None: nothing)."""
        return None

    # --------------------------------------------------------------------- server side
    def initial_server_state(self, global_state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        """The algorithm's server state before round 0 (beside w^0)."""
        return {}

    def aggregate_state(self, server: ServerState, uploads: Sequence[Upload], num_clients: int) -> dict[str, Any]:
        """SPEC step 8 for the algorithm's own state (the model average is the round's)."""
        return dict(server)

    def round_record(self, uploads: Sequence[Upload]) -> dict[str, Any]:
        """What the round's record keeps from the uploads: the evaluation vectors behind the matching."""
        return {"evaluation_vectors": {}}


def frozen_copy(model: SplitModel, state: Mapping[str, torch.Tensor]) -> SplitModel:
    """An eval-mode, gradient-free model of the same architecture holding `state`."""
    reference = copy.deepcopy(model)
    reference.load_state_dict(state)
    reference.eval()
    for parameter in reference.parameters():
        parameter.requires_grad_(False)
    return reference
