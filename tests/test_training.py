"""The local-training loop: learns, and resumes at an epoch boundary bit for bit."""

from __future__ import annotations

import pytest
import torch

from fedcme_core.algorithms.fedcme import AlignmentHooks, FedCMEConfig
from fedcme_core.common.checkpoints import CheckpointError, save_checkpoint
from fedcme_core.client.features import GlobalFeatures
from fedcme_core.client.models import build_model
from fedcme_core.client.training import load_local_run, save_local_run

from .helpers import TRAINING, fresh_run, same_state, tiny_client_data, train


def alignment_hooks() -> AlignmentHooks:
    features = GlobalFeatures(values=torch.full((10, 512), 0.1), defined=torch.arange(10) < 3)
    return AlignmentHooks(features, FedCMEConfig(mu=0.5), device=torch.device("cpu"))


def test_loss_decreases_on_learnable_data():
    run = train(fresh_run(), tiny_client_data(), epochs=4)

    assert run.epochs_done == 4 and len(run.epoch_losses) == 4
    assert run.epoch_losses[-1] < 0.5 * run.epoch_losses[0]


def test_resume_from_midpoint_checkpoint_equals_straight_run(tmp_path):
    data = tiny_client_data()
    straight = train(fresh_run(), data, alignment_hooks(), epochs=4)

    first_half = train(fresh_run(), data, alignment_hooks(), epochs=2)
    save_local_run(first_half, tmp_path / "swap.pt", client=0)
    resumed = load_local_run(tmp_path / "swap.pt", build_model("fmnist_cnn", seed=99), TRAINING)
    train(resumed, data, alignment_hooks(), epochs=2)

    assert resumed.epochs_done == 4
    assert resumed.epoch_losses == straight.epoch_losses
    assert same_state(resumed.model, straight.model)


def test_resume_restores_momentum_and_batch_order(tmp_path):
    run = train(fresh_run(), tiny_client_data(), epochs=1)
    save_local_run(run, tmp_path / "run.pt")

    restored = load_local_run(tmp_path / "run.pt", build_model("fmnist_cnn", seed=5), TRAINING)

    assert torch.equal(restored.generator.get_state(), run.generator.get_state())
    original, loaded = run.optimizer.state_dict()["state"], restored.optimizer.state_dict()["state"]
    assert original.keys() == loaded.keys() and len(loaded) > 0
    assert all(torch.equal(original[i]["momentum_buffer"], loaded[i]["momentum_buffer"]) for i in original)


def test_truncated_checkpoint_is_named(tmp_path):
    path = tmp_path / "client.pt"
    save_local_run(fresh_run(), path)
    path.write_bytes(path.read_bytes()[:200])

    with pytest.raises(CheckpointError, match=r"client\.pt: content hash mismatch \(truncated or corrupted"):
        load_local_run(path, build_model("fmnist_cnn"), TRAINING)


def test_checkpoint_of_another_model_is_refused(tmp_path):
    path = tmp_path / "cifar.pt"
    save_local_run(train(fresh_run(), tiny_client_data(), epochs=0), path)

    with pytest.raises(CheckpointError, match="do not match the configured model"):
        load_local_run(path, build_model("cifar_cnn"), TRAINING)


def test_non_local_run_checkpoint_is_refused(tmp_path):
    path = tmp_path / "other.pt"
    save_checkpoint({"weights": torch.zeros(2)}, path)

    with pytest.raises(CheckpointError, match="not a local-run checkpoint"):
        load_local_run(path, build_model("fmnist_cnn"), TRAINING)
