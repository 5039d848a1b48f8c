"""Classifier exchange between matched clients (FedCME, Nie et al., arXiv:2307.08574).

After floor(E/2) local epochs, counterparts k and j swap classifiers (Algorithm 2, line 22):

    w_k = (theta_k, phi_j),   w_j = (theta_j, phi_k)

The ablations swap the feature extractor theta or the whole model instead. The optimizer
state (momentum) of the received parameters is reset and the rest is kept (SPEC.md choice,
``exchange_optimizer: reset``), or received with them from the donor (``swap``).
Receivers are computed from the donors' phase-1 checkpoints, all read before any is
written, so many-to-one matching (one donor, several receivers) is well defined. A donor
whose phase-1 model holds non-finite values gives nothing (its receiver trains on with its
own model), so one diverged client cannot poison its counterpart.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch

from fedcme_core.common.checkpoints import load_checkpoint, save_checkpoint
from fedcme_core.server.faults import state_problem
from fedcme_core.client.models import is_classifier_key

ExchangePart = Literal["classifier", "extractor", "model"]


def exchanged_keys(keys: list[str], part: ExchangePart) -> list[str]:
    """The state-dict keys that an exchange of `part` transfers."""
    if part == "classifier":
        return [key for key in keys if is_classifier_key(key)]
    if part == "extractor":
        return [key for key in keys if not is_classifier_key(key)]
    if part == "model":
        return list(keys)
    raise ValueError(f"algorithm.exchange: unknown part {part!r}; choose classifier, extractor or model")


def receive_part(
    receiver: Mapping[str, torch.Tensor], donor: Mapping[str, torch.Tensor], part: ExchangePart
) -> dict[str, torch.Tensor]:
    """The receiver's model state with `part` taken from the donor (new tensors, inputs untouched)."""
    received = set(exchanged_keys(list(receiver), part))
    return {key: (donor[key] if key in received else value).clone() for key, value in receiver.items()}


def swap_parts(
    state_a: Mapping[str, torch.Tensor], state_b: Mapping[str, torch.Tensor], part: ExchangePart
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(theta_a, phi_b), (theta_b, phi_a) for part='classifier'; swapping twice restores both."""
    return receive_part(state_a, state_b, part), receive_part(state_b, state_a, part)


def reset_optimizer_state(optimizer_state: dict[str, Any], parameter_names: list[str], reset: set[str]) -> dict[str, Any]:
    """A copy of an SGD state dict without the momentum of the parameters named in `reset`."""
    reset_indices = {index for index, name in enumerate(parameter_names) if name in reset}
    return {
        **optimizer_state,
        "state": {index: value for index, value in optimizer_state["state"].items() if index not in reset_indices},
    }


def receive_optimizer_state(receiver: dict[str, Any], donor: Mapping[str, Any], parameter_names: list[str],
                            received: set[str], mode: Literal["reset", "swap"] = "reset") -> dict[str, Any]:
    """The receiver's SGD state dict after receiving the parameters named in `received`: their
    momentum dropped (`reset`) or taken from the donor's state dict (`swap`); the rest is the
    receiver's. Both state dicts index the same `parameter_names`."""
    if mode == "reset":
        return reset_optimizer_state(receiver, parameter_names, received)
    if mode != "swap":
        raise ValueError(f"algorithm.exchange_optimizer: unknown mode {mode!r}; choose reset or swap")
    kept = reset_optimizer_state(receiver, parameter_names, received)
    taken = {index: value for index, value in donor["state"].items() if parameter_names[index] in received}
    return {**kept, "state": dict(sorted({**kept["state"], **taken}.items()))}


def exchange_checkpoints(
    swap_checkpoints: Mapping[int, Path], donors: Mapping[int, int], part: ExchangePart, destinations: Mapping[int, Path],
    optimizer: Literal["reset", "swap"] = "reset",
) -> list[int]:
    """SPEC step 5 (the barrier): each receiver's phase-2 start checkpoint gets its donor's `part`.

    `swap_checkpoints` maps client -> phase-1 checkpoint, `donors` receiver -> donor,
    `destinations` receiver -> where its phase-2 start checkpoint goes, `optimizer` what becomes of
    the received parameters' momentum (:func:`receive_optimizer_state`). Sources are never
    overwritten, so the exchange can be repeated after a crash. Returns the receivers that
    received (those whose donor's model is finite).
    """
    payloads = {client: load_checkpoint(swap_checkpoints[client]) for client in {*donors, *donors.values()}}
    usable_donors = {client for client in set(donors.values()) if state_problem(payloads[client]["model"]) is None}
    received_by = []
    for receiver, donor in sorted(donors.items()):
        if donor not in usable_donors:
            continue
        received_by.append(receiver)
        payload = payloads[receiver]
        model_state = receive_part(payload["model"], payloads[donor]["model"], part)
        received = set(exchanged_keys(list(payload["model"]), part))
        optimizer_state = receive_optimizer_state(payload["optimizer"], payloads[donor]["optimizer"],
                                                  payload["parameter_names"], received, optimizer)
        save_checkpoint({**payload, "model": model_state, "optimizer": optimizer_state, "received_from": donor},
                        destinations[receiver])
    return received_by
