"""How a round hands its work out: clients submitted largest first and its critical path, one shared
read of the server state, evaluation on every core with the one-thread figures, balanced groups."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcme_core.common.checkpoints import save_checkpoint
from fedcme_core.client.evaluation import evaluate
from fedcme_core.data.partition_file import load_partition
from fedcme_core.rounds import (
    RunPaths,
    SerialExecutor,
    balanced_groups,
    completed_rounds,
    final_model,
    load_experiment_dataset,
    load_server_state,
    run_compute,
    run_experiment,
    shared_server_state,
)


class RecordingExecutor(SerialExecutor):
    """The serial executor, noting the clients of every parallel map in submission order."""

    def __init__(self) -> None:
        self.submitted: list[list[int]] = []
        self.costs: list[list[float]] = []

    def map(self, step, function, arguments, retries=0, costs=None):
        self.submitted.append([args[3] for args in arguments])
        self.costs.append(list(costs))
        return super().map(step, function, arguments, retries, costs)


def test_clients_are_submitted_largest_first_and_the_round_reports_its_critical_path(tmp_path, synthetic_config):
    executor = RecordingExecutor()

    history = run_experiment(synthetic_config({"federation.rounds": 1}), tmp_path / "run", executor)

    sizes = {client: len(indices) for client, indices in enumerate(load_partition(RunPaths(tmp_path / "run").partition).clients)}
    assert len(executor.submitted) == 2  # phase 1 and phase 2 of FedCME
    for submitted, costs in zip(executor.submitted, executor.costs):
        assert sorted(submitted) == sorted(history[0]["selected"])
        assert [sizes[client] for client in submitted] == sorted((sizes[client] for client in submitted), reverse=True)
        assert costs == [float(sizes[client]) for client in submitted]
    record = history[0]
    assert 0 < record["client_train_seconds"] < record["client_work_seconds"]
    assert record["client_work_seconds"] / 4 <= record["critical_client_seconds"] <= record["client_work_seconds"]


def test_clients_share_one_read_of_the_server_state_until_it_changes(tmp_path, synthetic_config):
    run_dir = tmp_path / "run"
    run_experiment(synthetic_config({"federation.rounds": 1}), run_dir)

    first = shared_server_state(run_dir, 1)
    assert shared_server_state(run_dir, 1) is first
    save_checkpoint({**first, "round": 99}, RunPaths(run_dir).server_state(1))
    assert shared_server_state(run_dir, 1)["round"] == 99


def same_value(first, second) -> bool:
    """Deep equality of server states: dicts, lists, tensors and numpy arrays, exactly."""
    if isinstance(first, dict):
        return isinstance(second, dict) and first.keys() == second.keys() and all(
            same_value(first[key], second[key]) for key in first)
    if isinstance(first, (list, tuple)):
        return len(first) == len(second) and all(same_value(a, b) for a, b in zip(first, second))
    if isinstance(first, torch.Tensor):
        return isinstance(second, torch.Tensor) and first.dtype == second.dtype and torch.equal(first, second)
    if isinstance(first, np.ndarray):
        return np.array_equal(first, second)
    return first == second


@pytest.mark.parametrize("algorithm", [{"name": "scaffold"}, {"name": "fedcme", "mu": 0.1}], ids=["scaffold", "fedcme"])
def test_the_round_leaves_the_server_state_it_shares_as_it_was_read(tmp_path, synthetic_config, algorithm):
    # match, every client, aggregate and commit of the last round all read the one shared dict.
    run_dir = tmp_path / "run"
    run_experiment(synthetic_config(algorithm=algorithm), run_dir)
    last = completed_rounds(run_dir) - 1

    shared = shared_server_state(run_dir, last)

    assert shared["round"] == last and shared["history"] and shared["algorithm"]
    assert same_value(shared, load_server_state(run_dir, last))


class EvaluateOnOneThread(SerialExecutor):
    """Runs the evaluate step with the caller on one torch thread, and notes what it returns."""

    def call(self, step, function, *args):
        if step != "evaluate":
            return function(*args)
        torch.set_num_threads(1)
        self.figures = function(*args)
        self.threads_after = torch.get_num_threads()
        return self.figures


def test_evaluation_uses_every_core_and_gives_the_one_thread_figures(tmp_path, synthetic_config):
    config = synthetic_config({"federation.rounds": 1})
    executor = EvaluateOnOneThread()
    run_experiment(config, tmp_path / "run", executor)
    dataset = load_experiment_dataset(config.data, config.seed)
    model = run_compute(tmp_path / "run").model(final_model(config, tmp_path / "run"))  # the step's layout

    assert executor.threads_after == 1  # restored after the step
    one_thread = evaluate(model, dataset.x_test, dataset.y_test, dataset.num_classes)
    assert (executor.figures.test_accuracy, executor.figures.test_loss) == (one_thread.accuracy, one_thread.loss)


@pytest.mark.parametrize(
    "costs, groups, expected",
    [
        ([5, 4, 3, 3, 3], 2, [[0, 3], [1, 2, 4]]),  # loads 5|4, 5|7, 8|7, 8|10
        ([1, 1, 1, 1], 2, [[0, 2], [1, 3]]),
        ([2, 9, 4], 1, [[1, 2, 0]]),
        ([3], 4, [[0]]),
        ([], 2, []),
    ],
)
def test_balanced_groups_hand_computed(costs, groups, expected):
    assert balanced_groups(costs, groups) == expected
