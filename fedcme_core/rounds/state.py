"""What the steps of a round hand each other, typed: the server state and each step's result.

Frozen dataclasses, which cross Prefect tasks and Dask workers pickled; they become plain data
(tensors, lists, dicts) only where the run store writes them (:mod:`fedcme_core.rounds.store`), as
fedjax's ``ServerState`` does. The match step's result is the algorithm's
:class:`~fedcme_core.algorithms.Matching`; the commit step's is the round record as stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedcme_core.algorithms import AlgorithmState, RecordSection
from fedcme_core.common.lazy import lazy_module

torch = lazy_module("torch")  # named by the annotations only


@dataclass(frozen=True)
class ServerState:
    """The server's state at the start of round `round` (after `round` rounds).

    `model` is w^t, `algorithm` the algorithm's own state, `client_state_rounds` client -> the round
    of the state kept for it, and `history` the committed rounds' records as stored (plain data:
    :meth:`fedcme_core.results.records.RoundRecord.to_dict`)."""

    round: int
    model: Mapping[str, torch.Tensor]
    algorithm: AlgorithmState
    client_state_rounds: Mapping[int, int]
    history: tuple[Mapping[str, Any], ...]

    def to_dict(self) -> dict[str, Any]:
        """The stored form (``server/round-XXXX.pt``, loadable with ``weights_only=True``)."""
        return {"round": self.round, "model": self.model, "algorithm": self.algorithm.to_dict(),
                "client_state_rounds": dict(self.client_state_rounds), "history": list(self.history)}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], state_class: type[AlgorithmState]) -> ServerState:
        """The state stored as `values`, the algorithm's part read as `state_class`. A state stored
        before the algorithms kept their own held the algorithm's keys at its top level."""
        own = ("round", "model", "client_state_rounds", "history")
        algorithm = values["algorithm"] if "algorithm" in values else \
            {key: value for key, value in values.items() if key not in own}
        return cls(round=int(values["round"]), model=values["model"], algorithm=state_class.from_dict(algorithm),
                   client_state_rounds=dict(values.get("client_state_rounds", {})),
                   history=tuple(values["history"]))


@dataclass(frozen=True)
class Selection:
    """The select step (SPEC step 1): the M clients of round t, in the sampler's order."""

    clients: tuple[int, ...]


@dataclass(frozen=True)
class Exchange:
    """The exchange step (SPEC step 5): receiver -> the checkpoint its next phase starts from (its
    counterpart's classifier, or what the algorithm exchanges, on its own swap checkpoint)."""

    starts: Mapping[int, str]

    def start(self, client_id: int, own_checkpoint: str) -> str:
        """Where `client_id`'s next phase starts: what the exchange wrote for it, else `own_checkpoint`."""
        return self.starts.get(client_id, own_checkpoint)


@dataclass(frozen=True)
class PhaseResult:
    """One client's local phase (the train-phase step): its time training (`seconds`), its time with the
    step-7 report of the last phase (`work_seconds`), the samples it trained on (D_k x epochs) and its
    last epoch's mean loss."""

    client: int
    phase: int
    seconds: float
    work_seconds: float
    samples: int
    loss: float


@dataclass(frozen=True)
class Aggregate:
    """The aggregate step: the accepted clients' last-epoch loss weighted by D_k, how many were
    aggregated, client -> why each other upload was rejected, and the algorithm's record section."""

    train_loss: float
    clients: int
    rejected: Mapping[int, str]
    record: RecordSection


@dataclass(frozen=True)
class Evaluation:
    """The evaluate step: w^{t+1} on the test set, and on each client's share of it
    (:func:`fedcme_core.client.evaluation.local_accuracy`: weighted by share size, each client once, the
    10th-percentile client; None when no client has a share)."""

    test_accuracy: float
    test_loss: float
    per_class_accuracy: list[float]
    local_accuracy: float | None = None
    local_accuracy_client_mean: float | None = None
    local_accuracy_p10: float | None = None
