"""Batched crop_flip augmentation (fedcme_core.data.augment): shapes, values, a hand-checked crop and
flip, seed determinism, the dataset defaults, and a resumed augmented run equal to a straight one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedcme_core.data.augment import PADDING, crop_flip
from fedcme_core.config.schema import config_from_dict
from fedcme_core.rounds import final_model, run_experiment
from fedcme_core.client.training import ClientHooks, load_local_run, save_local_run, train_epochs

from .helpers import TRAINING, fresh_run, same_state, tiny_client_data


def generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_shapes_values_and_layout_are_kept():
    batch = torch.rand(16, 3, 32, 32)
    out = crop_flip(batch, generator())
    nhwc = crop_flip(batch.contiguous(memory_format=torch.channels_last), generator())

    assert out.shape == batch.shape and out.dtype == batch.dtype and out.is_contiguous()
    assert nhwc.is_contiguous(memory_format=torch.channels_last) and torch.equal(nhwc, out)
    # reflect padding only repeats pixels of the image: every output value is one of its inputs
    for image, augmented in zip(batch, out):
        assert torch.isin(augmented, image).all()
    assert out.min() >= batch.min() and out.max() <= batch.max()


def test_a_crop_and_a_flip_checked_by_hand(monkeypatch):
    image = torch.arange(2 * 5 * 6, dtype=torch.float32).reshape(1, 2, 5, 6)  # [1, C=2, H=5, W=6]
    draws = {"randint": torch.tensor([[3], [1]]), "rand": torch.tensor([0.9])}  # dy=3, dx=1, no flip
    monkeypatch.setattr(torch, "randint", lambda *args, **kwargs: draws["randint"])
    monkeypatch.setattr(torch, "rand", lambda *args, **kwargs: draws["rand"])
    padded = F.pad(image, (PADDING,) * 4, mode="reflect")  # [1, 2, 13, 14]

    cropped = crop_flip(image, generator())
    draws["rand"] = torch.tensor([0.1])  # the same crop, flipped
    flipped = crop_flip(image, generator())

    assert torch.equal(cropped, padded[:, :, 3:8, 1:7])
    assert torch.equal(flipped, padded[:, :, 3:8, 1:7].flip(3))
    # the centre crop (dy = dx = padding) of an unflipped image is the image itself
    draws.update(randint=torch.tensor([[PADDING], [PADDING]]), rand=torch.tensor([0.7]))
    assert torch.equal(crop_flip(image, generator()), image)


def test_the_generator_decides_everything():
    batch = torch.rand(32, 3, 32, 32)

    first, again, other = crop_flip(batch, generator(1)), crop_flip(batch, generator(1)), crop_flip(batch, generator(2))

    assert torch.equal(first, again) and not torch.equal(first, other)
    assert not torch.equal(first, batch)


def test_the_batched_crop_equals_a_per_image_loop_and_covers_every_offset():
    batch = torch.rand(2000, 3, 8, 8)
    out = crop_flip(batch, generator(3))

    # the same draws, replayed from the same seed, applied one image at a time
    replay = generator(3)
    offsets = torch.randint(0, 2 * PADDING + 1, (2, len(batch)), generator=replay)
    flips = torch.rand(len(batch), generator=replay) < 0.5
    padded = F.pad(batch, (PADDING,) * 4, mode="reflect")
    for index in range(0, len(batch), 97):
        dy, dx = int(offsets[0, index]), int(offsets[1, index])
        expected = padded[index, :, dy : dy + 8, dx : dx + 8]
        assert torch.equal(out[index], expected.flip(2) if flips[index] else expected)
    assert set(offsets.flatten().tolist()) == set(range(2 * PADDING + 1))
    assert 0.45 < flips.float().mean().item() < 0.55


def test_dataset_defaults_follow_the_spec():
    assert config_from_dict({"data": {"dataset": "cifar10"}, "model": {"name": "cifar_cnn"}}).augmentation == "crop_flip"
    assert config_from_dict({"data": {"dataset": "fmnist"}}).augmentation == "none"
    assert config_from_dict({"data": {"dataset": "cifar10", "augment": "none"},
                             "model": {"name": "cifar_cnn"}}).augmentation == "none"


def test_a_local_run_resumed_mid_phase_draws_the_same_crops(tmp_path):
    inputs, labels = tiny_client_data(64)
    straight, stopped = fresh_run(seed=5), fresh_run(seed=5)
    train_epochs(straight, inputs, labels, ClientHooks(), 4, 16, augment=crop_flip)
    train_epochs(stopped, inputs, labels, ClientHooks(), 2, 16, augment=crop_flip)
    save_local_run(stopped, tmp_path / "swap.pt")
    resumed = load_local_run(tmp_path / "swap.pt", fresh_run(seed=99).model, TRAINING)
    train_epochs(resumed, inputs, labels, ClientHooks(), 2, 16, augment=crop_flip)
    plain = fresh_run(seed=5)
    train_epochs(plain, inputs, labels, ClientHooks(), 4, 16)

    assert same_state(straight.model, resumed.model)
    assert not same_state(straight.model, plain.model)  # the augmentation really ran


@pytest.mark.slow  # 4 runs each
@pytest.mark.parametrize("augment", ["crop_flip", "none"])
def test_an_augmented_fedcme_run_is_reproducible_and_resumes_to_the_same_model(tmp_path, synthetic_config, augment):
    config = synthetic_config({"data.augment": augment, "federation.rounds": 2})
    run_experiment(config, tmp_path / "a")
    run_experiment(config, tmp_path / "b")
    run_experiment(synthetic_config({"data.augment": augment, "federation.rounds": 1}), tmp_path / "resumed")
    run_experiment(config, tmp_path / "resumed")

    assert same_state(final_model(config, tmp_path / "a"), final_model(config, tmp_path / "b"))
    assert same_state(final_model(config, tmp_path / "a"), final_model(config, tmp_path / "resumed"))
