"""What an algorithm is: a set of hooks over one local loop and one round loop.

Flower's ``Strategy`` and fedjax's algorithms are the model: :class:`Algorithm` declares the hooks
(it is abstract), and :class:`~fedcme_core.algorithms.fedavg.FedAvg` implements every one of them
(McMahan et al., 2017: cross-entropy only, one local phase, no matching, the server averages the
models by data size and keeps nothing else). Every other algorithm is FedAvg with a few hooks
overridden. The hooks read in pairs, by side:

- ``client_update`` / ``server_update``: what a client uploads besides its model (SPEC step 7),
  and the algorithm's server state after aggregating those uploads (step 8);
- ``client_state`` / ``server_init``: what is kept for a client until its next round (MOON's
  previous model, SCAFFOLD's c_i), and the server's own state before round 0;
- ``client_hooks`` / ``server_record``: the client's terms in the local loss
  (:class:`~fedcme_core.client.hooks.ClientHooks`), and the server's section of the round record;
- the round's shape: ``phases`` (the local epochs' split: one phase, or several with an ``exchange``
  at each boundary) and ``match`` (who exchanges with whom).

What an algorithm keeps is typed: its server state is an :class:`AlgorithmState` and its record
section a :class:`RecordSection`, each a frozen dataclass that the algorithm owns (``state_class``,
``record_class``), turned into plain data (tensors, lists, dicts) only where the run store writes it.
The round code (``fedcme_core.rounds``) calls the hooks and interprets no algorithm's flag or key.

An algorithm module defines its config class (a :class:`BaseAlgorithmConfig`, the model of its
``algorithm:`` section, which also says how the algorithm is shown and checked) and its Algorithm
subclass, which names it once (``config_class``); the algorithm's name is that config's ``name``
literal, and ``algorithms/__init__.py`` holds the registry. The modules import without torch (the
config's algorithm union is derived from the registry, and a config is validated before torch
loads): torch and the torch-bound modules are bound with :func:`~fedcme_core.common.lazy.lazy_module`.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from fedcme_core.algorithms.settings import BaseAlgorithmConfig
from fedcme_core.client.hooks import ClientHooks
from fedcme_core.common.lazy import lazy_module

np = lazy_module("numpy")
torch = lazy_module("torch")
models = lazy_module("fedcme_core.client.models")


class Phase(NamedTuple):
    """One local phase of a round: the client's local epochs `first` (done when it starts) to `last`."""

    first: int
    last: int


class _Plain:
    """Fields <-> plain data (tensors and plain containers), field by field; a subclass whose fields
    hold other objects overrides both."""

    def to_dict(self) -> dict[str, Any]:
        return {item.name: getattr(self, item.name) for item in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]):
        names = {item.name for item in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in values.items() if key in names})


@dataclass(frozen=True)
class AlgorithmState(_Plain):
    """An algorithm's own server state (beside w^t): FedAvg keeps nothing. ``to_dict`` is the
    stored form (loadable with ``weights_only=True``), ``from_dict`` reads it back."""


@dataclass(frozen=True)
class RecordSection(_Plain):
    """An algorithm's section of a round record (``RoundRecord.algorithm``): FedAvg's is empty.
    ``to_dict`` is the stored form (plain JSON data), ``from_dict`` reads it back."""


@dataclass(frozen=True)
class ClientContext:
    """What the server sends a selected client for one round, plus what was kept for it."""

    client_id: int
    round_index: int
    class_counts: np.ndarray  # [C] samples per class held by the client (n_k[c])
    global_state: Mapping[str, torch.Tensor]  # w^t
    seed: int  # the experiment seed (for the client's own random choices, e.g. D_eval_k)
    learning_rate: float  # the local SGD step size (training.lr)
    server: AlgorithmState = field(default_factory=AlgorithmState)  # the algorithm's server state (zeta^t, c, ...)
    client_state: Mapping[str, Any] | None = None  # kept for this client since its last round, if any


@dataclass(frozen=True)
class Matching:
    """A round's matching (the match step's result): `pairs` as formed (for the record) and
    receiver -> donor."""

    pairs: list[tuple[int, int]] = field(default_factory=list)
    donors: dict[int, int] = field(default_factory=dict)

    def plain(self) -> Matching:
        """The same matching in Python ints (an algorithm may form it of numpy integers)."""
        return Matching(pairs=[(int(a), int(b)) for a, b in self.pairs],
                        donors={int(receiver): int(donor) for receiver, donor in self.donors.items()})


@dataclass(frozen=True)
class Upload:
    """One client's accepted upload, as the server aggregates it."""

    client: int
    num_samples: int
    model: Mapping[str, torch.Tensor]  # w_k^{t+1}
    report: Mapping[str, Any]  # what `client_update` added


class Algorithm(abc.ABC):
    """The hooks of an algorithm; :class:`~fedcme_core.algorithms.fedavg.FedAvg` implements them all."""

    name: ClassVar[str]  # its config's `name` literal
    config_class: ClassVar[type[BaseAlgorithmConfig]]  # the model of its `algorithm:` section (set by each module)
    state_class: ClassVar[type[AlgorithmState]]  # its server state
    record_class: ClassVar[type[RecordSection]]  # its section of the round record

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("config_class") and cls.config_class.model_fields.get("name")
        if name is not None:  # the name is the config's `name` literal, declared once
            cls.name = name.default

    def __init__(self, config: BaseAlgorithmConfig) -> None:
        self.config = config

    # ---------------------------------------------------------------- the round's shape
    @abc.abstractmethod
    def phases(self, local_epochs: int) -> list[Phase]:
        """The local phases, in order, from epoch 0 to E (:func:`round_phases` checks them); the
        round exchanges at each boundary."""

    @abc.abstractmethod
    def match(self, selected: Sequence[int], server: AlgorithmState, *, seed: int, round_index: int) -> Matching:
        """Who exchanges with whom this round (Algorithm 1, line 8: MakeMatching)."""

    @abc.abstractmethod
    def exchange(self, sources: Mapping[int, Path], donors: Mapping[int, int],
                 destinations: Mapping[int, Path]) -> list[int]:
        """SPEC step 5 at a phase boundary (a barrier): each receiver's checkpoint (`destinations`)
        gets what it receives from its donor's (`sources`); returns the receivers."""

    # --------------------------------------------------------------------- client side
    @abc.abstractmethod
    def client_hooks(self, model: models.SplitModel, context: ClientContext) -> ClientHooks:
        """The client's hooks into its local loss for one round (SPEC steps 4 and 6)."""

    @abc.abstractmethod
    def client_update(self, model: models.SplitModel, inputs: torch.Tensor, labels: torch.Tensor,
                      context: ClientContext, hooks: ClientHooks) -> dict[str, Any]:
        """What the client uploads besides its model and sample count (SPEC step 7), after
        training; `inputs` [D_k, C_in, H, W] and `labels` [D_k] are its whole local data."""

    @abc.abstractmethod
    def client_state(self, model_state: Mapping[str, torch.Tensor], report: Mapping[str, Any],
                     context: ClientContext) -> dict[str, Any] | None:
        """What is kept for this client until it is selected again (None: nothing), from its
        trained model and its `client_update` report."""

    # --------------------------------------------------------------------- server side
    @abc.abstractmethod
    def server_init(self, global_state: Mapping[str, torch.Tensor]) -> AlgorithmState:
        """The algorithm's server state before round 0 (beside w^0)."""

    @abc.abstractmethod
    def server_update(self, server: AlgorithmState, uploads: Sequence[Upload], num_clients: int) -> AlgorithmState:
        """SPEC step 8 for the algorithm's own state (the model average is the round's)."""

    @abc.abstractmethod
    def server_record(self, matching: Matching, uploads: Sequence[Upload]) -> RecordSection:
        """The round record's section this algorithm owns, from the round's matching and its
        accepted uploads."""


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
