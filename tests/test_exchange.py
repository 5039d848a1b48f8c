"""Exchange of classifier / extractor / model between two clients' states and checkpoints."""

from __future__ import annotations

import pytest
import torch

from fedcme_core.common.checkpoints import load_checkpoint
from fedcme_core.server.exchange import exchange_checkpoints, exchanged_keys, swap_parts
from fedcme_core.client.models import build_model

from .helpers import phase_one_checkpoints


def two_states():
    return build_model("cifar_cnn", seed=1).state_dict(), build_model("cifar_cnn", seed=2).state_dict()


def test_classifier_swap_gives_each_the_others_classifier():
    first, second = two_states()

    new_first, new_second = swap_parts(first, second, "classifier")

    assert torch.equal(new_first["classifier.weight"], second["classifier.weight"])
    assert torch.equal(new_second["classifier.bias"], first["classifier.bias"])
    assert torch.equal(new_first["backbone.0.weight"], first["backbone.0.weight"])
    assert torch.equal(new_second["backbone.0.weight"], second["backbone.0.weight"])


@pytest.mark.parametrize("part", ["classifier", "extractor", "model"])
def test_swapping_twice_restores_both_models(part):
    first, second = two_states()

    restored_first, restored_second = swap_parts(*swap_parts(first, second, part), part)

    assert all(torch.equal(restored_first[key], first[key]) for key in first)
    assert all(torch.equal(restored_second[key], second[key]) for key in second)


def test_parts_partition_the_state():
    keys = list(build_model("fmnist_cnn").state_dict())

    classifier, extractor = exchanged_keys(keys, "classifier"), exchanged_keys(keys, "extractor")

    assert classifier == ["classifier.weight", "classifier.bias"]
    assert sorted(classifier + extractor) == sorted(keys) and exchanged_keys(keys, "model") == keys


def test_checkpoint_exchange_resets_momentum_of_received_parameters_only(tmp_path):
    swap, destinations = phase_one_checkpoints(tmp_path)

    exchange_checkpoints(swap, {0: 1, 1: 0}, "classifier", destinations)

    before = {client: load_checkpoint(path) for client, path in swap.items()}
    after = {client: load_checkpoint(path) for client, path in destinations.items()}
    assert torch.equal(after[0]["model"]["classifier.weight"], before[1]["model"]["classifier.weight"])
    assert torch.equal(after[1]["model"]["classifier.weight"], before[0]["model"]["classifier.weight"])
    names = before[0]["parameter_names"]
    classifier_indices = {names.index("classifier.weight"), names.index("classifier.bias")}
    assert set(after[0]["optimizer"]["state"]) == set(before[0]["optimizer"]["state"]) - classifier_indices
    assert after[0]["epochs_done"] == before[0]["epochs_done"] and after[0]["received_from"] == 1


def test_many_to_one_exchange_reads_every_donor_before_writing(tmp_path):
    swap, _ = phase_one_checkpoints(tmp_path, clients=3, epochs=0)
    before = {client: load_checkpoint(path)["model"] for client, path in swap.items()}
    # Client 0 serves 1 and 2; 1 serves 0; 2 serves none.
    donors = {0: 1, 1: 0, 2: 0}

    exchange_checkpoints(swap, donors, "classifier", swap)

    after = {client: load_checkpoint(path)["model"] for client, path in swap.items()}
    for receiver, donor in donors.items():
        assert torch.equal(after[receiver]["classifier.weight"], before[donor]["classifier.weight"])
