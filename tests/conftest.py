"""Shared fixtures: the offline data mirror and small synthetic experiment configs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from fedcme_core.config import config_from_dict
from fedcme_core.config_files import apply_overrides

REPO_ROOT = Path(__file__).resolve().parents[1]

# Small CPU tests: one intra-op thread avoids oversubscribing CI's two cores.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def prefect_server():
    """A real Prefect server for the session (prefect_test_harness); yields its API URL."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield PREFECT_API_URL.value()


@pytest.fixture(scope="session")
def mirror() -> Path:
    """The offline dataset mirror (../shared/data beside the checkout, or FEDCME_DATA_MIRROR)."""
    path = Path(os.environ.get("FEDCME_DATA_MIRROR") or REPO_ROOT.parent / "shared" / "data")
    assert (path / "fashion-mnist").is_dir() and (path / "cifar-10").is_dir(), f"no data mirror at {path}"
    return path


SYNTHETIC = {
    "seed": 3,
    "device": "cpu",
    "data": {"dataset": "synthetic", "synthetic": {"num_train": 240, "num_test": 100, "shape": [1, 28, 28], "noise": 1.0}},
    "partition": {"method": "dirichlet", "alpha": 0.5, "min_size": 10},
    "federation": {"num_clients": 6, "clients_per_round": 4, "rounds": 2},
    "training": {"local_epochs": 2, "batch_size": 32},
    "model": {"name": "fmnist_cnn"},
    "algorithm": {"name": "fedcme", "mu": 0.1},
}


@pytest.fixture
def synthetic_config():
    """Build a small synthetic-data config; dotted overrides like {"algorithm.name": "fedavg"}."""

    def build(overrides: dict | None = None, algorithm: dict | None = None):
        values = dict(SYNTHETIC)
        if algorithm is not None:
            values["algorithm"] = algorithm
        return config_from_dict(apply_overrides(values, overrides or {}))

    return build
