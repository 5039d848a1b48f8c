"""What an algorithm is: a small set of hooks over one local loop and one round loop.

Flower's strategies and fedjax's algorithms are the model: one base whose defaults are
FedAvg's (McMahan et al., 2017: cross-entropy only, no matching, the server averages the
models by data size and keeps nothing else), and each algorithm overrides a few hooks.

Client side: :class:`~fedcme_core.client.hooks.ClientHooks` (``extra_loss``, ``transform_logits``,
``after_step``), built per client and round from a :class:`ClientContext` (what the client
receives), then ``client_report`` (what it uploads besides its model) and ``client_state``
(what is kept for it until its next round: MOON's previous model, SCAFFOLD's c_i).
Server side: ``initial_server_state`` and ``aggregate_state`` (the algorithm's own server
state: FedCME's global features and evaluation vectors, SCAFFOLD's c), ``match`` (who
exchanges with whom), ``phases`` (the local epochs' split: one phase, or any number, with an
``exchange`` at each boundary; FedCME's two meet at floor(E/2)), and ``round_record`` (the
round record's section the algorithm owns: FedCME's pairs and evaluation vectors).

The round code (``fedcme_core.rounds``) calls these hooks and interprets no algorithm flag.
An algorithm module defines its config class (a :class:`~fedcme_core.common.frozen.Frozen` model of
its ``algorithm:`` section) and its Algorithm subclass, which names it once (``config_class``);
the algorithm's name is that config's ``name`` literal, and ``algorithms/__init__.py`` holds the
registry. The modules import without torch (the config's algorithm union is derived from the
registry, and a config is validated before torch loads): torch and the torch-bound modules below
are bound with :func:`~fedcme_core.common.lazy.lazy_module` and imported when a hook first runs.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from fedcme_core.client.hooks import ClientHooks
from fedcme_core.common.frozen import Frozen
from fedcme_core.common.lazy import lazy_module

np = lazy_module("numpy")
torch = lazy_module("torch")
models = lazy_module("fedcme_core.client.models")
server_exchange = lazy_module("fedcme_core.server.exchange")

ServerState = Mapping[str, Any]  # an algorithm's own server state: tensors and plain containers


class Phase(NamedTuple):
    """One local phase of a round: the client's local epochs `first` (done when it starts) to `last`."""

    first: int
    last: int


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
    config_class: ClassVar[type[Frozen]]  # the pydantic model of its `algorithm:` section (set by each module)
    exchange_part: str = "none"  # none | classifier | extractor | model
    exchange_optimizer: str = "reset"  # the received part's momentum: reset | swap

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "config_class" in cls.__dict__:  # the name is the config's `name` literal, declared once
            cls.name = cls.config_class.model_fields["name"].default

    def __init__(self, config) -> None:
        self.config = config

    # ---------------------------------------------------------------- the round's shape
    def phases(self, local_epochs: int) -> list[Phase]:
        """The local phases, in order, from epoch 0 to E (:func:`round_phases` checks them); the
        round exchanges at each boundary. An exchanging algorithm splits at floor(E/2)."""
        if self.exchange_part == "none":
            return [Phase(0, local_epochs)]
        return [Phase(0, local_epochs // 2), Phase(local_epochs // 2, local_epochs)]

    def match(self, selected: Sequence[int], server: ServerState, *, seed: int, round_index: int) -> Matching:
        """Who exchanges with whom this round (Algorithm 1, line 8); nobody by default."""
        return Matching()

    def exchange(self, sources: Mapping[int, Path], donors: Mapping[int, int],
                 destinations: Mapping[int, Path]) -> list[int]:
        """SPEC step 5 at a phase boundary (a barrier): each receiver's swap checkpoint gets its
        donor's part; returns the receivers."""
        if not donors:
            return []
        return server_exchange.exchange_checkpoints(sources, donors, self.exchange_part, destinations,
                                                    self.exchange_optimizer)

    # --------------------------------------------------------------------- client side
    def client_hooks(self, model: models.SplitModel, context: ClientContext) -> ClientHooks:
        return ClientHooks()

    def client_report(self, model: models.SplitModel, inputs: torch.Tensor, labels: torch.Tensor,
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

    def round_record(self, matching: Matching, uploads: Sequence[Upload]) -> dict[str, Any]:
        """The round record's section this algorithm owns (``RoundRecord.algorithm``: plain JSON
        data), from the round's matching and its accepted uploads; nothing by default."""
        return {}


def round_phases(algorithm: Algorithm, local_epochs: int) -> list[Phase]:
    """The algorithm's phases, checked: at least one, each of at least one epoch, each starting
    where the one before ended, from epoch 0 to `local_epochs`."""
    phases = [Phase(*phase) for phase in algorithm.phases(local_epochs)]
    ends = [0, *(phase.last for phase in phases)]
    if not phases or any(phase.first != end or phase.last <= phase.first for phase, end in zip(phases, ends)) \
            or ends[-1] != local_epochs:
        raise ValueError(f"{algorithm.name}: local phases {[tuple(phase) for phase in phases]} do not run one after "
                         f"another from epoch 0 to {local_epochs} (E), each at least one epoch long")
    return phases


def frozen_copy(model: models.SplitModel, state: Mapping[str, torch.Tensor]) -> models.SplitModel:
    """An eval-mode, gradient-free model of the same architecture holding `state`."""
    reference = copy.deepcopy(model)
    reference.load_state_dict(state)
    reference.eval()
    for parameter in reference.parameters():
        parameter.requires_grad_(False)
    return reference
