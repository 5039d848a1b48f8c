"""Tests of fedcme_core.client.features: local features, global features with memory, alignment."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from fedcme_core.client.features import (
    GlobalFeatures,
    aggregate_global_features,
    alignment_loss,
    local_features,
    local_statistics,
)
from fedcme_core.server.matching import evaluation_vector
from fedcme_core.client.models import build_model

from .helpers import LinearSplitModel


def HandSetModel() -> LinearSplitModel:
    """features(x) = x @ diag(1, 2).T; classify(h) = h @ ones(3, 2).T."""
    return LinearSplitModel(torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.ones(3, 2))


@pytest.mark.parametrize("batch_size", [1, 2, 1024])
def test_local_features_hand_set(batch_size: int) -> None:
    # Prepare: features [1,1]->[1,2], [3,1]->[3,2] (class 0), [2,2]->[2,4] (class 2).
    model = HandSetModel().train()
    x = torch.tensor([[1.0, 1.0], [3.0, 1.0], [2.0, 2.0]])
    y = torch.tensor([0, 0, 2])

    # Execute
    means, counts = local_features(model, x, y, num_classes=3, batch_size=batch_size)

    # Assert
    assert means.dtype == torch.float32 and counts.dtype == torch.int64
    torch.testing.assert_close(means, torch.tensor([[2.0, 2.0], [0.0, 0.0], [2.0, 4.0]]))
    assert counts.tolist() == [2, 0, 1]
    assert model.training
    assert not means.requires_grad


@pytest.mark.parametrize("batch_size", [1, 2, 1024])
def test_one_pass_statistics_hand_set(batch_size: int) -> None:
    # Prepare: logits = (h1 + h2) for every class, so argmax is class 0 for every sample:
    # the evaluation subset {0, 2} holds one class-0 sample (right) and one class-2 sample (wrong).
    model = HandSetModel()
    x = torch.tensor([[1.0, 1.0], [3.0, 1.0], [2.0, 2.0]])
    y = torch.tensor([0, 0, 2])

    statistics = local_statistics(model, x, y, num_classes=3, eval_positions=np.array([0, 2]), batch_size=batch_size)

    torch.testing.assert_close(statistics.feature_means, torch.tensor([[2.0, 2.0], [0.0, 0.0], [2.0, 4.0]]))
    assert statistics.feature_counts.tolist() == [2, 0, 1]
    assert statistics.evaluation_vector.tolist() == [1.0, 0.0, 0.0]
    assert local_statistics(model, x, y, num_classes=3).evaluation_vector is None


@pytest.mark.parametrize("name, shape", [("fmnist_cnn", (1, 28, 28)), ("cifar_cnn", (3, 32, 32))])
def test_one_pass_statistics_equal_the_two_separate_passes(name: str, shape: tuple[int, ...]) -> None:
    generator = torch.Generator().manual_seed(3)
    model = build_model(name, seed=1)
    x = torch.randn(300, *shape, generator=generator)
    y = torch.randint(0, 7, (300,), generator=generator)  # classes 7-9 absent
    subset = np.sort(np.random.default_rng(0).choice(300, size=60, replace=False))

    statistics = local_statistics(model, x, y, 10, eval_positions=subset)
    means, counts = local_features(model, x, y, 10)

    torch.testing.assert_close(statistics.feature_means, means, rtol=0, atol=1e-6)
    assert torch.equal(statistics.feature_counts, counts)
    np.testing.assert_array_equal(statistics.evaluation_vector, evaluation_vector(model, x[subset], y[subset], 10))
    assert statistics.evaluation_vector[7:].tolist() == [0.0, 0.0, 0.0]


def two_client_uploads() -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    client_a = (
        torch.tensor([[1.0, 0.0], [0.0, 0.0], [4.0, 4.0], [0.0, 0.0]]),
        torch.tensor([1, 0, 2, 0]),
        1.0,
    )
    client_b = (
        torch.tensor([[3.0, 6.0], [2.0, 2.0], [0.0, 0.0], [0.0, 0.0]]),
        torch.tensor([5, 1, 0, 0]),
        3.0,
    )
    return [client_a, client_b]


def test_aggregate_without_memory_renormalises_weights() -> None:
    # Prepare: D_A = 1, D_B = 3.
    uploads = two_client_uploads()

    # Execute
    result = aggregate_global_features(uploads, previous=None)

    # Assert
    # class 0: (1*[1,0] + 3*[3,6]) / 4 = [2.5, 4.5]; class 1: only B -> [2,2];
    # class 2: only A -> [4,4]; class 3: nobody, no memory -> undefined.
    expected = torch.tensor([[2.5, 4.5], [2.0, 2.0], [4.0, 4.0], [0.0, 0.0]])
    torch.testing.assert_close(result.values, expected)
    assert result.defined.tolist() == [True, True, True, False]
    assert result.values.dtype == torch.float32


def test_aggregate_memory_replaces_missing_class() -> None:
    # Prepare: previous zeta[1] = [8, 0] and zeta[3] = [7, 7] defined; zeta[0], zeta[2] not.
    uploads = two_client_uploads()
    previous = GlobalFeatures(
        values=torch.tensor([[9.0, 9.0], [8.0, 0.0], [9.0, 9.0], [7.0, 7.0]]),
        defined=torch.tensor([False, True, False, True]),
    )

    # Execute
    result = aggregate_global_features(uploads, previous)

    # Assert
    # class 0: both hold it -> [2.5, 4.5] (memory unused).
    # class 1: A lacks it and uses memory [8,0]: (1*[8,0] + 3*[2,2]) / 4 = [3.5, 1.5].
    # class 2: B lacks it, no memory -> only A: [4, 4].
    # class 3: nobody holds it, both use memory [7,7] -> [7, 7].
    expected = torch.tensor([[2.5, 4.5], [3.5, 1.5], [4.0, 4.0], [7.0, 7.0]])
    torch.testing.assert_close(result.values, expected)
    assert result.defined.tolist() == [True, True, True, True]


def test_aggregate_undefined_class_stays_undefined() -> None:
    # Prepare
    uploads = two_client_uploads()

    # Execute
    result = aggregate_global_features(uploads, GlobalFeatures.empty(4, 2))

    # Assert
    assert not result.defined[3]
    assert result.values[3].tolist() == [0.0, 0.0]


def test_aggregate_rejects_shape_mismatch() -> None:
    # Prepare
    uploads = two_client_uploads()

    # Execute / Assert
    with pytest.raises(ValueError):
        aggregate_global_features(uploads, GlobalFeatures.empty(3, 2))


def test_global_features_round_trip_weights_only() -> None:
    # Prepare
    original = GlobalFeatures(
        values=torch.tensor([[1.0, 2.0], [0.0, 0.0]]), defined=torch.tensor([True, False])
    )
    buffer = io.BytesIO()

    # Execute
    torch.save(original.to_dict(), buffer)
    buffer.seek(0)
    restored = GlobalFeatures.from_dict(torch.load(buffer, weights_only=True))

    # Assert
    assert torch.equal(restored.values, original.values)
    assert torch.equal(restored.defined, original.defined)
    assert not GlobalFeatures.empty(3, 2).any_defined
    assert original.any_defined


def alignment_batch() -> tuple[torch.Tensor, torch.Tensor]:
    features = torch.tensor([[1.0, 2.0], [3.0, 4.0], [0.0, 0.0]], requires_grad=True)  # [B, d]
    labels = torch.tensor([0, 0, 1])
    return features, labels


def test_alignment_loss_two_classes_by_hand() -> None:
    # Prepare: batch means class 0 = [2, 3], class 1 = [0, 0]; zeta[0] = [1, 1], zeta[1] = [2, 0].
    features, labels = alignment_batch()
    zeta = GlobalFeatures(
        values=torch.tensor([[1.0, 1.0], [2.0, 0.0], [5.0, 5.0]]),
        defined=torch.tensor([True, True, True]),
    )

    # Execute
    mean_loss = alignment_loss(features, labels, zeta)
    sum_loss = alignment_loss(features, labels, zeta, reduction="sum_all")
    sum_dims_loss = alignment_loss(features, labels, zeta, reduction="sum_dims")

    # Assert: squared differences [1, 4] and [4, 0]: sum 9, mean over 2 classes x 2 dims 9/4, and the
    # squared norms 5 and 4 averaged over the 2 classes 9/2 (Q x d = 4 and d = 2 times the mean).
    # Class 2 is defined but absent from the batch, so it does not count.
    assert mean_loss is not None and sum_loss is not None and sum_dims_loss is not None
    assert mean_loss.item() == pytest.approx(2.25)
    assert sum_loss.item() == pytest.approx(9.0)
    assert sum_dims_loss.item() == pytest.approx(4.5)
    assert sum_loss.item() / mean_loss.item() == pytest.approx(4.0)
    assert sum_dims_loss.item() / mean_loss.item() == pytest.approx(2.0)


def test_alignment_loss_none_when_no_class_defined() -> None:
    # Prepare
    features, labels = alignment_batch()

    # Execute
    loss = alignment_loss(features, labels, GlobalFeatures.empty(3, 2))

    # Assert
    assert loss is None


def test_alignment_loss_gradient_only_through_defined_classes() -> None:
    # Prepare: only class 0 defined; loss = mean(([2,3] - [1,1])^2) = (1 + 4) / 2 = 2.5.
    features, labels = alignment_batch()
    zeta = GlobalFeatures(
        values=torch.tensor([[1.0, 1.0], [2.0, 0.0], [0.0, 0.0]]),
        defined=torch.tensor([True, False, False]),
    )

    # Execute
    loss = alignment_loss(features, labels, zeta)
    assert loss is not None
    loss.backward()

    # Assert: d loss / d f_i = (2 / 2) * (m - zeta[0]) * (1 / 2) = [0.5, 1.0] for both class-0 rows.
    assert loss.item() == pytest.approx(2.5)
    assert features.grad is not None
    torch.testing.assert_close(features.grad, torch.tensor([[0.5, 1.0], [0.5, 1.0], [0.0, 0.0]]))
    assert not zeta.values.requires_grad


def test_alignment_loss_rejects_unknown_reduction() -> None:
    # Prepare
    features, labels = alignment_batch()

    # Execute / Assert
    with pytest.raises(ValueError):
        alignment_loss(
            features, labels, GlobalFeatures.empty(3, 2), reduction="none"  # type: ignore[arg-type]
        )
