"""Tests of fedcme_core.server.aggregation: client selection and weighted averaging."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcme_core.server.aggregation import select_clients, weighted_average


def constant_state(value: float, batches_tracked: int = 0) -> dict[str, torch.Tensor]:
    """A BatchNorm-like state whose every floating tensor is filled with `value`."""
    return {
        "conv.weight": torch.full((2, 1, 3, 3), value),
        "conv.bias": torch.full((2,), value),
        "bn.running_mean": torch.full((2,), value),
        "bn.num_batches_tracked": torch.tensor(batches_tracked, dtype=torch.int64),
        "head.weight": torch.full((3, 2), value, dtype=torch.float64),
    }


def test_weighted_average_constant_models() -> None:
    # Prepare: FLSim's constant-model trick; (1*1 + 2*4 + 5*8) / (1+2+5) = 49/8 = 6.125.
    states = [constant_state(1.0, 7), constant_state(4.0, 9), constant_state(8.0, 11)]
    weights = [1.0, 2.0, 5.0]

    # Execute
    averaged = weighted_average(states, weights)

    # Assert
    assert set(averaged) == set(states[0])
    for key in ("conv.weight", "conv.bias", "bn.running_mean", "head.weight"):
        assert averaged[key].dtype == states[0][key].dtype
        assert averaged[key].shape == states[0][key].shape
        assert torch.all(averaged[key] == 6.125), key
    assert averaged["bn.num_batches_tracked"].item() == 7
    assert averaged["bn.num_batches_tracked"].dtype == torch.int64


def test_weighted_average_does_not_alias_inputs() -> None:
    # Prepare
    states = [constant_state(3.0, 1)]

    # Execute
    averaged = weighted_average(states, [2.0])
    for tensor in averaged.values():
        tensor.add_(1)

    # Assert
    assert torch.all(states[0]["conv.weight"] == 3.0)
    assert states[0]["bn.num_batches_tracked"].item() == 1


def test_weighted_average_key_mismatch_names_key() -> None:
    # Prepare
    other = constant_state(2.0)
    other["extra.weight"] = torch.zeros(1)

    # Execute / Assert
    with pytest.raises(ValueError, match="extra.weight"):
        weighted_average([constant_state(1.0), other], [1.0, 1.0])


def test_weighted_average_shape_mismatch_names_key() -> None:
    # Prepare
    other = constant_state(2.0)
    other["conv.bias"] = torch.zeros(3)

    # Execute / Assert
    with pytest.raises(ValueError, match="conv.bias"):
        weighted_average([constant_state(1.0), other], [1.0, 1.0])


@pytest.mark.parametrize("weights", [[1.0], [1.0, 0.0], [1.0, -2.0]])
def test_weighted_average_rejects_bad_weights(weights: list[float]) -> None:
    # Prepare
    states = [constant_state(1.0), constant_state(2.0)]

    # Execute / Assert
    with pytest.raises(ValueError):
        weighted_average(states, weights)


@settings(max_examples=50, deadline=None)
@given(
    constants=st.lists(st.floats(-100, 100), min_size=1, max_size=6),
    data=st.data(),
)
def test_weighted_average_is_the_weighted_mean(
    constants: list[float], data: st.DataObject
) -> None:
    # Prepare
    size = len(constants)
    weights = data.draw(st.lists(st.floats(0.01, 1000), min_size=size, max_size=size))
    states = [{"w": torch.full((4,), value, dtype=torch.float64)} for value in constants]
    expected = sum(w * c for w, c in zip(weights, constants)) / sum(weights)

    # Execute
    averaged = weighted_average(states, weights)

    # Assert
    assert torch.allclose(averaged["w"], torch.full((4,), expected, dtype=torch.float64), atol=1e-9)


def test_select_clients_deterministic_sorted_unique_in_range() -> None:
    # Prepare / Execute
    first = select_clients(50, 20, seed=3, round_index=4)
    again = select_clients(50, 20, seed=3, round_index=4)

    # Assert
    assert first == again
    assert first == sorted(first)
    assert len(set(first)) == 20
    assert all(0 <= client < 50 for client in first)
    assert all(isinstance(client, int) for client in first)


def test_select_clients_differs_between_rounds() -> None:
    # Prepare / Execute
    selections = {tuple(select_clients(50, 20, seed=3, round_index=t)) for t in range(5)}

    # Assert
    assert len(selections) > 1


def test_select_clients_all_when_m_equals_k() -> None:
    assert select_clients(5, 5, seed=0, round_index=0) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("clients_per_round", [0, 6])
def test_select_clients_validates_m(clients_per_round: int) -> None:
    with pytest.raises(ValueError):
        select_clients(5, clients_per_round, seed=0, round_index=0)
