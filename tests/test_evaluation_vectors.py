"""Tests of fedcme_core.server.matching's inputs: the evaluation subset D_eval a client draws and
its per-class accuracy vector eps_k on it (the vectors MakeMatching pairs by cosine)."""

from __future__ import annotations

import numpy as np
import torch

from fedcme_core.server.matching import eval_subset, evaluation_vector

from .helpers import IdentityModel


def eval_labels() -> np.ndarray:
    # 20 samples: class 0 x16, class 1 x1 (position 7), class 3 x3 (positions 2, 11, 19).
    labels = np.zeros(20, dtype=np.int64)
    labels[7] = 1
    labels[[2, 11, 19]] = 3
    return labels


def test_eval_subset_contains_every_present_class() -> None:
    # Prepare
    labels = eval_labels()

    # Execute
    subsets = [
        eval_subset(labels, 0.2, seed=s, round_index=0, client_id=c)
        for s in range(5)
        for c in range(5)
    ]

    # Assert: size round(0.2 * 20) = 4, sorted, distinct, every class 0, 1, 3 present.
    for subset in subsets:
        assert len(subset) == 4
        assert subset.dtype == np.int64
        assert np.all(np.diff(subset) > 0)
        assert set(labels[subset].tolist()) == {0, 1, 3}
        assert 7 in subset


def test_eval_subset_deterministic_and_seeded_by_client() -> None:
    # Prepare
    labels = eval_labels()

    # Execute
    first = eval_subset(labels, 0.3, seed=1, round_index=2, client_id=3)
    again = eval_subset(labels, 0.3, seed=1, round_index=2, client_id=3)
    others = [eval_subset(labels, 0.3, seed=1, round_index=2, client_id=c) for c in range(4, 12)]

    # Assert
    assert np.array_equal(first, again)
    assert any(not np.array_equal(first, other) for other in others)


def test_eval_subset_small_sizes() -> None:
    # Prepare
    labels = eval_labels()

    # Execute
    tiny = eval_subset(labels, 0.01, seed=0, round_index=0, client_id=0)
    two = eval_subset(labels, 0.1, seed=0, round_index=0, client_id=0)
    everything = eval_subset(labels, 1.0, seed=0, round_index=0, client_id=0)

    # Assert: at least 1; when the size is below the class count, one sample per drawn class.
    assert len(tiny) == 1
    assert len(two) == 2 and len(set(labels[two].tolist())) == 2
    assert everything.tolist() == list(range(20))


def test_evaluation_vector_hand_set_model() -> None:
    # Prepare: predictions are argmax(x): 0, 0, 1, 1, 2 for labels 0, 1, 1, 1, 0.
    model = IdentityModel(4)
    x = torch.tensor(
        [
            [1.0, 0.0, 0.0, 0.0],
            [1.0, 0.0, 0.0, 0.0],
            [0.0, 1.0, 0.0, 0.0],
            [0.0, 1.0, 0.0, 0.0],
            [0.0, 0.0, 1.0, 0.0],
        ]
    )
    y = torch.tensor([0, 1, 1, 1, 0])

    # Execute
    eps = evaluation_vector(model, x, y, num_classes=4, batch_size=2)

    # Assert: class 0: 1/2, class 1: 2/3, classes 2 and 3 absent -> 0.
    assert eps.dtype == np.float64
    np.testing.assert_allclose(eps, [0.5, 2 / 3, 0.0, 0.0])
