"""Short FedCME (and SCAFFOLD) trainings on the real datasets from the offline mirror: they must learn.

A few clients and rounds on seeded subsets keep each under a minute on two cores; the
accuracy bound sits well above chance (10%) and below what the runs reach (about 0.47 on
Fashion-MNIST after 2 rounds, about 0.35 on CIFAR-10 after 3, at the time of writing).
"""

from __future__ import annotations

import pytest

from fedcme_core.config.schema import config_from_dict
from fedcme_core.rounds import final_model, load_experiment_dataset, run_experiment
from fedcme_core.client.evaluation import evaluate

pytestmark = pytest.mark.slow  # the real datasets, trained for a few rounds


@pytest.mark.parametrize(
    "algorithm, dataset, model, train_subset, rounds, bound",
    [({"name": "fedcme", "mu": 0.01}, "fmnist", "fmnist_cnn", 5000, 2, 0.35),
     ({"name": "fedcme", "mu": 0.01}, "cifar10", "cifar_cnn", 20000, 3, 0.25),
     ({"name": "scaffold"}, "fmnist", "fmnist_cnn", 5000, 3, 0.35)],  # round 0 without, rounds 1-2 with c and c_i
)
def test_fedcme_and_scaffold_learn_real_data_from_the_mirror(tmp_path, mirror, algorithm, dataset, model,
                                                             train_subset, rounds, bound):
    config = config_from_dict(
        {
            "seed": 0,
            "device": "cpu",
            "data": {"dataset": dataset, "mirror": str(mirror), "data_dir": str(tmp_path / "data"),
                     "train_subset": train_subset, "test_subset": 2000},
            "partition": {"method": "dirichlet", "alpha": 0.5},
            "federation": {"num_clients": 5, "clients_per_round": 5, "rounds": rounds},
            "training": {"local_epochs": 2},
            "model": {"name": model},
            "algorithm": algorithm,
        }
    )

    history = run_experiment(config, tmp_path / "run")

    assert len(history) == rounds
    assert history[-1]["test_accuracy"] > bound
    assert history[-1]["test_accuracy"] > history[0]["test_accuracy"]
    dataset_tensors = load_experiment_dataset(config.data, config.seed)
    assert dataset_tensors.x_test.shape[0] == 2000
    reloaded = evaluate(final_model(config, tmp_path / "run"), dataset_tensors.x_test, dataset_tensors.y_test, 10)
    assert reloaded.accuracy == pytest.approx(history[-1]["test_accuracy"])
