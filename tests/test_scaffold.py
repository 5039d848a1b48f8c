"""SCAFFOLD: the control variates by hand, option II on a real run, and round 0 equal to FedAvg."""

from __future__ import annotations

import math

import torch

from fedcme_core.algorithms import Upload, build_algorithm
from fedcme_core.algorithms.scaffold import (
    ControlVariateHooks,
    ScaffoldConfig,
    client_control_update,
    server_control_update,
)
from fedcme_core.common.checkpoints import load_checkpoint
from fedcme_core.rounds import RunPaths, final_model, load_server_state, run_experiment

from .helpers import LinearSplitModel, same_state


def test_client_control_update_by_hand():
    # c_i = [1, 2], c = [0.5, 0.5], x = [3, 3], y = [2, 4], K = 4 steps, lr = 0.25:
    # c_i+ - c_i = -c + (x - y) / (K * lr) = [-0.5 + 1, -0.5 - 1] = [0.5, -1.5].
    delta = client_control_update({"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([0.5, 0.5])},
                                  {"w": torch.tensor([3.0, 3.0])}, {"w": torch.tensor([2.0, 4.0])}, steps=4, lr=0.25)
    assert delta["w"].tolist() == [0.5, -1.5]


def test_server_control_update_by_hand():
    # c + (|S| / N) * mean(deltas): 2 of N = 4 clients, deltas [2, 0] and [0, 4]: c + [0.5, 1].
    control = server_control_update({"w": torch.tensor([1.0, 1.0])},
                                    [{"w": torch.tensor([2.0, 0.0])}, {"w": torch.tensor([0.0, 4.0])}], num_clients=4)
    assert control["w"].tolist() == [1.5, 2.0]


def test_each_step_is_corrected_by_lr_times_c_minus_c_i():
    model = LinearSplitModel(torch.ones(2, 2), torch.zeros(1, 2))
    # c - c_i = [[2, 2], [2, 2]] for the extractor and [[1, -1]] for the classifier.
    server = {"extractor.weight": torch.full((2, 2), 3.0), "classifier.weight": torch.tensor([[1.0, 0.0]])}
    client = {"extractor.weight": torch.full((2, 2), 1.0), "classifier.weight": torch.tensor([[0.0, 1.0]])}
    hooks = ControlVariateHooks(model, server, client, lr=0.1)

    hooks.after_step()
    hooks.after_step()

    assert torch.allclose(model.extractor.weight, torch.full((2, 2), 1.0 - 2 * 0.1 * 2.0))
    assert torch.allclose(model.classifier.weight, torch.tensor([[-0.2, 0.2]]))
    assert hooks.steps == 2


def test_the_server_keeps_c_and_each_client_its_c_i():
    algorithm = build_algorithm(ScaffoldConfig())
    uploads = [Upload(0, 10, {}, {"control_delta": {"w": torch.tensor([1.0])}}),
               Upload(3, 30, {}, {"control_delta": {"w": torch.tensor([3.0])}})]

    first = algorithm.server_update(algorithm.server_init({}), uploads, num_clients=8)
    second = algorithm.server_update(first, uploads[:1], num_clients=8)

    assert algorithm.server_init({}).to_dict() == {"control": None}  # the stored form, as before the typed state
    assert first.control["w"].tolist() == [0.5]  # (1 + 3) / 8, whatever the data sizes
    assert second.control["w"].tolist() == [0.625]


def test_round_zero_with_zero_control_variates_equals_fedavg(tmp_path, synthetic_config):
    fedavg = synthetic_config({"federation.rounds": 1}, algorithm={"name": "fedavg"})
    scaffold = synthetic_config({"federation.rounds": 1}, algorithm={"name": "scaffold"})
    run_experiment(fedavg, tmp_path / "fedavg")
    run_experiment(scaffold, tmp_path / "scaffold")

    assert same_state(final_model(fedavg, tmp_path / "fedavg"), final_model(scaffold, tmp_path / "scaffold"))

    # From round 1 on the corrections are non-zero, and the models part.
    run_experiment(synthetic_config({"federation.rounds": 2}, algorithm={"name": "fedavg"}), tmp_path / "fedavg")
    run_experiment(synthetic_config({"federation.rounds": 2}, algorithm={"name": "scaffold"}), tmp_path / "scaffold")
    assert not same_state(final_model(fedavg, tmp_path / "fedavg"), final_model(scaffold, tmp_path / "scaffold"))


def test_a_real_round_follows_option_two(tmp_path, synthetic_config):
    config = synthetic_config({"federation.rounds": 1, "runner.keep_round_files": True}, algorithm={"name": "scaffold"})
    history = run_experiment(config, tmp_path / "run")
    paths = RunPaths(tmp_path / "run")
    x = load_server_state(paths.root, 0)["model"]
    state = load_server_state(paths.root, 1)
    selected = history[0]["selected"]

    deltas = []
    for client in selected:
        upload = load_checkpoint(paths.upload(0, client))
        steps = config.training.local_epochs * math.ceil(upload["num_samples"] / config.training.batch_size)
        delta = upload["report"]["control_delta"]
        for name, value in delta.items():  # c = c_i = 0 in round 0: delta = (x - y) / (K * lr)
            expected = (x[name] - upload["model"][name]) / (steps * config.training.lr)
            assert torch.allclose(value, expected, rtol=1e-5, atol=1e-6), name
        kept = load_checkpoint(paths.client_state(client, 0))["control"]  # c_i+ = 0 + delta
        assert all(torch.equal(kept[name], delta[name]) for name in delta)
        deltas.append(delta)
    assert state["client_state_rounds"] == {client: 0 for client in selected}
    for name, value in state["algorithm"]["control"].items():  # c = sum(deltas) / N
        expected = sum(delta[name] for delta in deltas) / config.federation.num_clients
        assert torch.allclose(value, expected, rtol=1e-6, atol=1e-7), name
