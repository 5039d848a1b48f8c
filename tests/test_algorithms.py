"""Algorithm hooks: hand-checked terms, and the degenerate settings that equal FedAvg exactly."""

from __future__ import annotations

import math

import numpy as np
import torch

from fedcme_core.algorithms import AlgorithmState, ClientContext, Matching, build_algorithm
from fedcme_core.algorithms.base import frozen_copy
from fedcme_core.algorithms.fedavg import FedAvgConfig
from fedcme_core.algorithms.fedcme import AlignmentHooks, FedCMEConfig, FedCMEState, MatchingRecord
from fedcme_core.algorithms.fedprox import FedProxConfig, ProximalHooks
from fedcme_core.algorithms.fedrs import FedRSConfig, RestrictedSoftmaxHooks, class_scaling
from fedcme_core.algorithms.moon import ContrastiveHooks, MoonConfig
from fedcme_core.client.features import GlobalFeatures
from fedcme_core.client.models import build_model

from .helpers import fresh_run, same_state, tiny_client_data, train


def context(model, **extra) -> ClientContext:
    return ClientContext(
        client_id=0, round_index=1, class_counts=np.array([5, 0, 3] + [0] * 7), global_state=model.state_dict(),
        seed=0, learning_rate=0.01, **extra
    )


# ------------------------------------------------------------------ hand-checked terms
def test_proximal_term_by_hand():
    model = build_model("cifar_cnn", seed=0)
    anchor = {key: value + 0.5 for key, value in model.state_dict().items()}
    hooks = ProximalHooks(model, anchor, mu=0.2)

    term = hooks.extra_loss(None, None, None, None)

    num_parameters = sum(parameter.numel() for parameter in model.parameters())
    assert math.isclose(term.detach().item(), 0.5 * 0.2 * num_parameters * 0.25, rel_tol=1e-5)


def test_fedrs_scaling_by_hand():
    counts = np.array([4, 0, 2, 0])

    presence = class_scaling(counts, alpha=0.5, scaling="presence")
    proportional = class_scaling(counts, alpha=0.5, scaling="proportional")
    logits = RestrictedSoftmaxHooks(presence).transform_logits(torch.ones(2, 4), torch.zeros(2, dtype=torch.long))

    assert presence.tolist() == [1.0, 0.5, 1.0, 0.5]
    assert proportional.tolist() == [1.0, 0.5, 0.75, 0.5]
    assert logits.tolist() == [[1.0, 0.5, 1.0, 0.5]] * 2


def test_moon_term_is_mu_log2_when_all_projections_agree():
    model = build_model("cifar_cnn", projection_dim=16, seed=0)
    inputs = torch.randn(4, 3, 32, 32)
    hooks = ContrastiveHooks(frozen_copy(model, model.state_dict()), frozen_copy(model, model.state_dict()), mu=2.0, tau=0.5)

    term = hooks.extra_loss(inputs, None, model.features(inputs), None)

    # cos(z, z_glob) = cos(z, z_prev) = 1: CE([2, 2], 0) = log 2.
    assert math.isclose(term.detach().item(), 2.0 * math.log(2.0), rel_tol=1e-5)


def test_moon_pulls_towards_global_and_away_from_previous():
    model = build_model("cifar_cnn", projection_dim=16, seed=0)
    previous = build_model("cifar_cnn", projection_dim=16, seed=1)
    inputs = torch.randn(8, 3, 32, 32)
    hooks = build_algorithm(MoonConfig(mu=1.0)).client_hooks(model, context(model, client_state={"model": previous.state_dict()}))

    towards_previous = hooks.extra_loss(inputs, None, previous.features(inputs), None)
    towards_global = hooks.extra_loss(inputs, None, model.features(inputs), None)

    assert towards_global.detach().item() < towards_previous.detach().item()


def test_fedcme_aligns_only_when_global_features_exist():
    model = build_model("fmnist_cnn", seed=0)
    algorithm = build_algorithm(FedCMEConfig(mu=0.1))
    defined = GlobalFeatures(values=torch.zeros(10, 512), defined=torch.ones(10, dtype=torch.bool))

    round_zero = algorithm.client_hooks(model, context(model, server=algorithm.server_init({})))
    later = algorithm.client_hooks(model, context(model, server=FedCMEState(global_features=defined)))

    assert type(round_zero).__name__ == "ClientHooks"
    assert isinstance(later, AlignmentHooks)


def test_fedcme_pieces_switch_independently():
    assert build_algorithm(FedCMEConfig(exchange="none")).phases(5) == [(0, 5)]
    assert build_algorithm(FedCMEConfig()).phases(5) == [(0, 2), (2, 5)]
    assert build_algorithm(FedCMEConfig(mu=0.0)).aligns is False
    assert build_algorithm(FedCMEConfig(exchange="extractor", mu=0.0)).phases(4) == [(0, 2), (2, 4)]
    matching = build_algorithm(FedCMEConfig(exchange="none")).match([0, 1, 2, 3], FedCMEState(), seed=0,
                                                                     round_index=0)
    assert matching.pairs == [] and matching.donors == {}


def test_fedavg_implements_every_hook_with_nothing_of_its_own():
    fedavg = build_algorithm(FedAvgConfig())

    assert fedavg.phases(3) == [(0, 3)] and fedavg.exchange({}, {}, {}) == []
    assert fedavg.server_init({}) == AlgorithmState() and fedavg.server_record(Matching(), []).to_dict() == {}
    assert fedavg.match([0, 1], AlgorithmState(), seed=0, round_index=0) == Matching()


def test_fedcme_state_and_record_keep_their_stored_form():
    features = GlobalFeatures(values=torch.ones(2, 3), defined=torch.tensor([True, False]))
    state = FedCMEState(global_features=features, evaluation_vectors={4: torch.tensor([0.5, 0.5])})

    stored = state.to_dict()
    back = FedCMEState.from_dict(stored)

    assert FedCMEState().to_dict() == {"global_features": None, "evaluation_vectors": {}}
    assert set(stored["global_features"]) == {"values", "defined"} and list(stored["evaluation_vectors"]) == [4]
    assert torch.equal(back.global_features.values, features.values) and torch.equal(back.evaluation_vectors[4],
                                                                                      torch.tensor([0.5, 0.5]))
    record = MatchingRecord.from_dict({"pairs": [[3, 1]], "evaluation_vectors": {"3": [0.5]}})  # JSON's keys
    assert record == MatchingRecord(pairs=[(3, 1)], evaluation_vectors={3: [0.5]})
    assert record.to_dict() == {"pairs": [[3, 1]], "evaluation_vectors": {3: [0.5]}}


def test_fedcme_round_zero_matching_is_random_but_seeded():
    algorithm = build_algorithm(FedCMEConfig())

    first = algorithm.match([3, 5, 8, 9], FedCMEState(), seed=0, round_index=0)
    again = algorithm.match([3, 5, 8, 9], FedCMEState(), seed=0, round_index=0)

    assert first == again and len(first.pairs) == 2
    assert sorted(first.donors) == [3, 5, 8, 9]


# ---------------------------------------------- degenerate settings == FedAvg, exactly
def fedavg_run(projection_dim=None):
    return train(fresh_run(projection_dim=projection_dim), tiny_client_data(), epochs=2)


def test_proximal_hooks_with_mu_zero_equal_fedavg():
    run = fresh_run()
    hooks = ProximalHooks(run.model, {k: v.clone() for k, v in run.model.state_dict().items()}, mu=0.0)

    assert same_state(train(run, tiny_client_data(), hooks, epochs=2).model, fedavg_run().model)


def test_restricted_softmax_with_alpha_one_equals_fedavg():
    run = fresh_run()
    hooks = build_algorithm(FedRSConfig(alpha=1.0)).client_hooks(run.model, context(run.model))

    assert isinstance(hooks, RestrictedSoftmaxHooks)
    assert same_state(train(run, tiny_client_data(), hooks, epochs=2).model, fedavg_run().model)


def test_contrastive_hooks_with_mu_zero_equal_fedavg_on_the_moon_backbone():
    run = fresh_run(projection_dim=32)
    reference = frozen_copy(run.model, run.model.state_dict())
    hooks = ContrastiveHooks(reference, reference, mu=0.0, tau=0.5)

    assert same_state(train(run, tiny_client_data(), hooks, epochs=2).model, fedavg_run(projection_dim=32).model)


def test_alignment_hooks_with_mu_zero_equal_fedavg():
    run = fresh_run()
    features = GlobalFeatures(values=torch.ones(10, 512), defined=torch.ones(10, dtype=torch.bool))
    hooks = AlignmentHooks(features, FedCMEConfig(mu=0.0), device=torch.device("cpu"))

    assert same_state(train(run, tiny_client_data(), hooks, epochs=2).model, fedavg_run().model)


def test_fedprox_with_large_mu_stays_closer_to_the_global_model():
    start = fresh_run().model.state_dict()
    free = fedavg_run()
    anchored_run = fresh_run()
    anchored = train(anchored_run, tiny_client_data(), build_algorithm(FedProxConfig(mu=1.0)).client_hooks(
        anchored_run.model, context(anchored_run.model)), epochs=2)

    def distance(model):
        return sum(float(torch.sum((value - start[key]) ** 2)) for key, value in model.state_dict().items())

    assert distance(anchored.model) < distance(free.model)
