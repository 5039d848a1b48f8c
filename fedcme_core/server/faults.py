"""What a round does when clients fail: dropouts, failed tasks and poisoned updates.

A real federation loses clients mid-round and receives unusable updates; the round goes on
with the clients that returned a usable update, as long as at least ``federation.min_clients``
did (Flower's ``accept_failures`` + ``min_fit_clients``, FLGo's availability simulation):

- *dropped*: a simulated unavailable client (``federation.dropout``, seeded per seed, round
  and client, so it never depends on execution order). It never trains; its FedCME
  counterpart trains on without exchange.
- *failed*: a client whose local-training task raised after its retries (``runner.retries``).
- *rejected*: an update the server refuses before aggregation: non-finite parameters,
  loss or features, or a last-epoch loss above ``federation.max_update_loss`` (diverged).

Aggregation (FedAvg, Eq. 3 of Nie et al., arXiv:2307.08574) then runs over the usable
updates only: w^{t+1} = sum_{k in usable} (D_k / sum_{j in usable} D_j) w_k.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fedcme_core.common.seeding import numpy_rng


class RoundError(RuntimeError):
    """Too few clients of a round returned a usable update; the message says who failed and why."""


@dataclass(frozen=True)
class StepFailure:
    """A client step that raised after all its retries (plain data: crosses any executor)."""

    reason: str

    @classmethod
    def from_exception(cls, error: BaseException) -> StepFailure:
        message = str(error).splitlines()[0] if str(error) else ""
        return cls(f"{type(error).__name__}: {message}" if message else type(error).__name__)


def dropped_clients(selected: Sequence[int], rate: float, *, seed: int, round_index: int) -> list[int]:
    """The selected clients that are unavailable this round: each with probability `rate`."""
    if rate <= 0:
        return []
    return [
        int(client)
        for client in selected
        if numpy_rng(seed, "dropout", round_index, int(client)).random() < rate
    ]


def state_problem(state: Mapping[str, torch.Tensor]) -> str | None:
    """Why a model state cannot be used (the first non-finite tensor), or None."""
    for key, tensor in state.items():
        if torch.is_floating_point(tensor) and not bool(torch.isfinite(tensor).all()):
            return f"non-finite values in {key}"
    return None


def update_problem(upload: Mapping[str, Any], max_loss: float | None = None) -> str | None:
    """Why the server rejects a client's upload (model, last loss, what its algorithm reported), or None."""
    loss = float(upload["epoch_losses"][-1])
    if not math.isfinite(loss):
        return f"non-finite training loss {loss}"
    if max_loss is not None and loss > max_loss:
        return f"training loss {loss:.4g} above federation.max_update_loss {max_loss:g} (diverged)"
    problem = state_problem(upload["model"])
    if problem is not None:
        return problem
    for key, value in upload.get("report", {}).items():  # tensors, or parameter name -> tensor
        tensors = value.values() if isinstance(value, Mapping) else [value]
        if any(torch.is_tensor(t) and torch.is_floating_point(t) and not bool(torch.isfinite(t).all()) for t in tensors):
            return f"non-finite {key.replace('_', ' ')}"
    return None


def surviving_donors(donors: Mapping[int, int], trained: Iterable[int]) -> dict[int, int]:
    """receiver -> donor restricted to pairs whose clients both finished phase 1."""
    finished = set(trained)
    return {receiver: donor for receiver, donor in donors.items() if receiver in finished and donor in finished}


def require_enough_clients(round_index: int, usable: int, minimum: int, lost: Mapping[int, str]) -> None:
    """Raise :class:`RoundError` when fewer than `minimum` clients of the round are usable."""
    if usable >= minimum:
        return
    reasons = "; ".join(f"client {client}: {reason}" for client, reason in sorted(lost.items())[:3])
    more = f" (and {len(lost) - 3} more)" if len(lost) > 3 else ""
    raise RoundError(
        f"round {round_index}: only {usable} clients returned a usable update, federation.min_clients is "
        f"{minimum}; {reasons}{more}"
    )
