"""Tests of fedcme_core.client.evaluation on a hand-set linear model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedcme_core.client.architectures import MODEL_INFERENCE_BATCH, MODEL_INPUT_SHAPES
from fedcme_core.client.evaluation import INFERENCE_BATCH_SIZE, EvalResult, eval_mode, evaluate, torch_threads
from fedcme_core.client.features import local_statistics
from fedcme_core.client.models import build_model

from .helpers import IdentityModel, LinearSplitModel

LN3 = math.log(3.0)


def hand_set_data() -> tuple[torch.Tensor, torch.Tensor]:
    # Logits [ln3, 0, 0] give softmax [3/5, 1/5, 1/5]: CE = ln(5/3) if right, ln 5 if wrong.
    x = torch.tensor(
        [
            [LN3, 0.0, 0.0],  # y=0: correct, CE ln(5/3)
            [LN3, 0.0, 0.0],  # y=1: wrong (predicts 0), CE ln 5
            [0.0, LN3, 0.0],  # y=1: correct, CE ln(5/3)
            [0.0, LN3, 0.0],  # y=1: correct, CE ln(5/3)
        ]
    )
    y = torch.tensor([0, 1, 1, 1])
    return x, y


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("batch_size", [1, 3, 1024])
def test_evaluate_hand_set_model(batch_size: int, workers: int) -> None:
    # Prepare
    model = IdentityModel(3)
    x, y = hand_set_data()

    # Execute
    result = evaluate(model, x, y, num_classes=3, batch_size=batch_size, workers=workers)

    # Assert
    assert isinstance(result, EvalResult)
    assert result.num_samples == 4
    assert result.accuracy == pytest.approx(3 / 4)
    assert result.loss == pytest.approx((3 * math.log(5 / 3) + math.log(5)) / 4, rel=1e-6)
    np.testing.assert_allclose(result.per_class_accuracy, [1.0, 2 / 3, 0.0])
    np.testing.assert_array_equal(result.per_class_count, [1, 3, 0])
    assert result.per_class_accuracy.dtype == np.float64
    assert result.per_class_count.dtype == np.int64


def batch_sizes_seen(model: torch.nn.Module) -> list[int]:
    """The batch of every call of model.features, recorded by a forward pre-hook on its first layer."""
    seen: list[int] = []
    first = model.extractor if hasattr(model, "extractor") else model.backbone[0]
    first.register_forward_pre_hook(lambda module, inputs: seen.append(inputs[0].shape[0]))
    return seen


def test_every_no_grad_pass_runs_at_the_models_own_batch_unless_told() -> None:
    model = IdentityModel(3)
    seen = batch_sizes_seen(model)
    x, y = torch.randn(7, 3), torch.tensor([0, 1, 2, 0, 1, 2, 0])

    evaluate(model, x, y, num_classes=3)  # a model that names no batch: the core's default
    model.inference_batch_size = 3
    evaluate(model, x, y, num_classes=3)
    local_statistics(model, x, y, num_classes=3, eval_positions=np.array([0, 1]))
    evaluate(model, x, y, num_classes=3, batch_size=5)

    assert seen == [7] + [3, 3, 1] * 2 + [5, 2]
    assert INFERENCE_BATCH_SIZE >= 7


@pytest.mark.parametrize("name", sorted(MODEL_INFERENCE_BATCH))
def test_each_architecture_names_its_inference_batch(name: str) -> None:
    model = build_model(name, 10, projection_dim=None, seed=0)
    seen = batch_sizes_seen(model)
    shape = MODEL_INPUT_SHAPES[name]
    batch = MODEL_INFERENCE_BATCH[name]

    evaluate(model, torch.zeros(batch + 1, *shape), torch.zeros(batch + 1, dtype=torch.long), num_classes=10)

    assert model.inference_batch_size == batch and seen == [batch, 1]


def test_workers_give_the_one_thread_figures_bit_for_bit() -> None:
    # Each batch runs whole on one torch thread, in inference mode, and the batches are summed in
    # order; fmnist_cnn's 1024x512 layer rounds differently when MKL splits it over 2 threads on
    # AVX-512, so the one-thread figures are the reference.
    model = build_model("fmnist_cnn", 10, seed=0)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(300, 1, 28, 28, generator=generator)
    y = torch.randint(0, 10, (300,), generator=generator)
    inside: list[tuple[int, bool]] = []
    model.backbone[0].register_forward_pre_hook(
        lambda module, inputs: inside.append((torch.get_num_threads(), torch.is_inference_mode_enabled())))
    with torch_threads(1):
        one_thread = evaluate(model, x, y, num_classes=10, batch_size=32)
    inside.clear()

    with torch_threads(2):
        parallel = evaluate(model, x, y, num_classes=10, batch_size=32, workers=2)
        assert torch.get_num_threads() == 2  # restored
    assert inside == [(1, True)] * 10
    assert (parallel.loss, parallel.accuracy) == (one_thread.loss, one_thread.accuracy)
    np.testing.assert_array_equal(parallel.per_class_accuracy, one_thread.per_class_accuracy)
    np.testing.assert_array_equal(parallel.per_class_count, one_thread.per_class_count)


@pytest.mark.parametrize("was_training", [True, False])
def test_evaluate_restores_previous_mode(was_training: bool) -> None:
    # Prepare
    model = IdentityModel(3)
    model.train(was_training)
    model.classifier.train(not was_training)
    x, y = hand_set_data()

    # Execute
    evaluate(model, x, y, num_classes=3)

    # Assert
    assert model.training is was_training
    assert model.classifier.training is (not was_training)


def test_eval_mode_sets_eval_inside() -> None:
    # Prepare
    model = IdentityModel(3).train()

    # Execute
    with eval_mode(model):
        modes_inside = [module.training for module in model.modules()]

    # Assert
    assert not any(modes_inside)
    assert all(module.training for module in model.modules())


def test_evaluate_does_not_track_gradients() -> None:
    # Prepare
    model = IdentityModel(3)
    x, y = hand_set_data()

    # Execute
    evaluate(model, x, y, num_classes=3)

    # Assert
    assert all(parameter.grad is None for parameter in model.parameters())


@pytest.mark.parametrize("rows, labels, batch_size, message", [
    (0, 0, None, "cannot {purpose} an empty set"),
    (4, 3, None, "x has 4 samples but y has 3"),
    (4, 4, 0, "batch_size must be positive, got 0"),
])
@pytest.mark.parametrize("pass_name, purpose", [("evaluate", "evaluate on"),
                                                ("local_statistics", "compute local features of")])
def test_bad_inputs_of_either_pass_are_named_in_one_line(rows, labels, batch_size, message, pass_name, purpose):
    model = LinearSplitModel(torch.eye(3), torch.eye(3))
    run = evaluate if pass_name == "evaluate" else local_statistics

    with pytest.raises(ValueError) as raised:
        run(model, torch.zeros(rows, 3), torch.zeros(labels, dtype=torch.int64), num_classes=3, batch_size=batch_size)

    assert str(raised.value) == message.format(purpose=purpose)
