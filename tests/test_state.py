"""The round's typed values (fedcme_core.rounds.state): the server state and its stored form."""

from __future__ import annotations

import pickle

import torch

from fedcme_core.algorithms import AlgorithmState
from fedcme_core.algorithms.fedcme import FedCMEState
from fedcme_core.rounds.state import Aggregate, PhaseResult, ServerState

MODEL = {"w": torch.tensor([1.0, 2.0])}


def test_a_server_state_is_stored_as_before_and_reads_back():
    state = ServerState(round=2, model=MODEL, algorithm=FedCMEState(evaluation_vectors={1: torch.tensor([0.5])}),
                        client_state_rounds={1: 1}, history=({"round": 0}, {"round": 1}))

    stored = state.to_dict()
    back = ServerState.from_dict(stored, FedCMEState)

    assert list(stored) == ["round", "model", "algorithm", "client_state_rounds", "history"]
    assert stored["algorithm"]["global_features"] is None and stored["history"] == [{"round": 0}, {"round": 1}]
    assert back.round == 2 and back.client_state_rounds == {1: 1} and back.history == state.history
    assert torch.equal(back.algorithm.evaluation_vectors[1], torch.tensor([0.5]))


def test_a_state_stored_before_the_algorithm_section_reads_its_keys_from_the_top():
    legacy = {"round": 1, "model": MODEL, "global_features": None, "evaluation_vectors": {3: torch.tensor([1.0])},
              "client_state_rounds": {}, "history": [{"round": 0}]}

    fedcme, fedavg = ServerState.from_dict(legacy, FedCMEState), ServerState.from_dict(legacy, AlgorithmState)

    assert list(fedcme.algorithm.evaluation_vectors) == [3] and fedavg.algorithm == AlgorithmState()


def test_step_results_cross_processes_pickled():
    result = PhaseResult(client=3, phase=1, seconds=1.5, work_seconds=2.0, samples=40, loss=0.7)
    aggregate = Aggregate(train_loss=0.5, clients=2, rejected={4: "diverged"}, record=AlgorithmState())

    assert pickle.loads(pickle.dumps(result)) == result and pickle.loads(pickle.dumps(aggregate)) == aggregate
