"""The test set split among the clients, each share following its client's training label mix.

Benchmarks of personalised and federated learning report, beside the global model's accuracy on the
whole test set, a *local* accuracy: the accuracy on each client's share of the test set, where a
client's share holds the classes it trains on in the proportions it trains on them.
:func:`local_shares` makes those shares; the evaluate step scores the global model on them
(:func:`fedcme_core.client.evaluation.local_accuracy`).
"""

from __future__ import annotations

import numpy as np

from fedcme_core.common.seeding import numpy_rng
from fedcme_core.data.labels import PartitionError, validated_labels

SHARES_TAG = "test-shares"  # the seed tag of the shares' shuffles: numpy_rng(seed, SHARES_TAG, c) for class c


def largest_remainder(total: int, weights: np.ndarray) -> np.ndarray:
    """`total` split in proportion to the non-negative integer `weights` [K] (sum > 0), as int64 [K].

    Each k gets floor(total * w_k / W), W = sum(w); the r = total - sum(floors) left over go one each to the
    r clients of largest remainder (total * w_k mod W), ties to the lower index. A weight of 0 gets 0: the
    remainders sum to r * W, each below W, so at least r + 1 are positive when r > 0.
    """
    weights = np.asarray(weights, dtype=np.int64)
    whole = int(weights.sum())
    products = total * weights
    quotas = products // whole
    remainders = products % whole
    left = total - int(quotas.sum())
    order = np.argsort(-remainders, kind="stable")  # largest remainder first, ties in client order
    quotas[order[:left]] += 1
    return quotas


def local_shares(train_counts: np.ndarray, test_labels: np.ndarray, seed: int) -> list[np.ndarray]:
    """Client k's share of the test set, one sorted int64 index array per client (K arrays).

    `train_counts` [K, C]: client k's number of training samples of class c; `test_labels` [N]: the test
    set's labels, each below C. For each class c, its test samples are shuffled by
    ``numpy_rng(seed, SHARES_TAG, c)`` and dealt in client order, client k taking
    :func:`largest_remainder` (n_c, train_counts[:, c])[k] of them: n_c * N_kc / N_c up to rounding, so
    every test sample of the class goes to exactly one client whose training holds the class, and each
    share's class mix follows its client's training mix. A class that no client trains on goes to nobody
    (its test samples are in no share). Raises PartitionError in one line for counts that are not a
    2-d array of non-negative integers, or a label of no column of the counts.
    """
    counts = np.asarray(train_counts)
    if counts.ndim != 2 or counts.dtype == np.bool_ or not np.issubdtype(counts.dtype, np.integer):
        raise PartitionError(f"train_counts must be a 2-d integer array [K, C], got shape {counts.shape} "
                             f"and dtype {counts.dtype}")
    if counts.size and counts.min() < 0:
        raise PartitionError(f"train_counts must be non-negative, got {counts.min()}")
    labels = validated_labels(test_labels)
    num_clients, num_classes = counts.shape
    if int(labels.max()) >= num_classes:
        raise PartitionError(f"test labels contain class {int(labels.max())} but train_counts has "
                             f"{num_classes} classes")
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for label in range(num_classes):
        indices = np.flatnonzero(labels == label)
        if indices.size == 0 or counts[:, label].sum() == 0:
            continue
        shuffled = numpy_rng(seed, SHARES_TAG, label).permutation(indices)
        bounds = np.cumsum(largest_remainder(indices.size, counts[:, label]))[:-1]
        for client, dealt in enumerate(np.split(shuffled, bounds)):
            parts[client].append(dealt)
    return [np.sort(np.concatenate(part)).astype(np.int64) if part else np.zeros(0, dtype=np.int64)
            for part in parts]
