"""Client selection and FedAvg-style weighted model averaging.

FedAvg (McMahan et al.) as used by FedCME (Nie et al., arXiv:2307.08574, Eq. 3; SPEC
steps 1 and 8): w^{t+1} = sum_{k in M} (D_k / sum_{j in M} D_j) * w_k^t.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from fedcme_core.common.seeding import numpy_rng


def select_clients(
    num_clients: int, clients_per_round: int, *, seed: int, round_index: int
) -> list[int]:
    """SPEC step 1: M of K clients uniformly without replacement, sorted ascending."""
    if num_clients <= 0:
        raise ValueError(f"num_clients must be positive, got {num_clients}")
    if not 0 < clients_per_round <= num_clients:
        raise ValueError(
            f"clients_per_round must be in 1..{num_clients}, got {clients_per_round}"
        )
    rng = numpy_rng(seed, "select", round_index)
    chosen = rng.choice(num_clients, size=clients_per_round, replace=False)
    return sorted(int(client) for client in chosen)


def weighted_average(
    states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]
) -> dict[str, torch.Tensor]:
    """SPEC step 8: sum_k (w_k / sum_j w_j) * state_k for every floating-point tensor.

    Computed in float64 and cast back to each tensor's dtype, on the first state's
    device. Non-floating tensors (e.g. BatchNorm's num_batches_tracked) are copied from
    the first state. The result never aliases an input tensor.
    """
    if not states:
        raise ValueError("no states to average")
    if len(weights) != len(states):
        raise ValueError(f"{len(weights)} weights for {len(states)} states")
    weight_values = [float(weight) for weight in weights]
    if any(not weight > 0 for weight in weight_values):
        raise ValueError(f"weights must be positive, got {weight_values}")
    total_weight = sum(weight_values)
    normalised_weights = [weight / total_weight for weight in weight_values]

    reference = states[0]
    for index, state in enumerate(states[1:], start=1):
        missing = set(reference) ^ set(state)
        if missing:
            raise ValueError(f"state {index} differs from state 0 in key {sorted(missing)[0]!r}")

    averaged: dict[str, torch.Tensor] = {}
    for key, reference_tensor in reference.items():
        for index, state in enumerate(states[1:], start=1):
            if state[key].shape != reference_tensor.shape:
                raise ValueError(
                    f"key {key!r}: state {index} has shape {tuple(state[key].shape)}, "
                    f"state 0 has {tuple(reference_tensor.shape)}"
                )
        if not torch.is_floating_point(reference_tensor):
            averaged[key] = reference_tensor.detach().clone()
            continue
        device = reference_tensor.device
        accumulator = torch.zeros(reference_tensor.shape, dtype=torch.float64, device=device)
        for weight, state in zip(normalised_weights, states, strict=True):
            accumulator += weight * state[key].detach().to(device, torch.float64)
        averaged[key] = accumulator.to(reference_tensor.dtype)
    return averaged
