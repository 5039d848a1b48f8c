"""Hsu, Qi, Brown's per-client Dirichlet partition (``client_dirichlet``): client k's label mix is
q_k ~ Dir(alpha * p), p the class distribution of the labels partitioned ("Measuring the Effects of
Non-Identical Data Distribution for Federated Visual Classification", arXiv:1909.06335, 2019).
:mod:`fedcme_core.data.partition` lists every method.

Where NIID-Bench's label-dir (``dirichlet``) draws, for each class, how it is split over the
clients, this draws, for each client, how its data is split over the classes. With C balanced
classes the concentration is alpha / C per class: alpha = C gives label mixes uniform on the
simplex, alpha -> 0 one class per client, alpha -> inf every client's mix equal to p.
"""

from __future__ import annotations

import numpy as np

from fedcme_core.common.seeding import numpy_rng
from fedcme_core.data.labels import (
    PartitionError,
    check_arguments,
    indices_by_class,
    sorted_int64,
    validated_labels,
)


def client_dirichlet_partition(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    seed: int,
    min_size: int = 10,
) -> list[np.ndarray]:
    """Hsu et al.'s partition of `labels` [N] over K = `num_clients` clients: client k's sorted int64 indices.

    Every random choice comes from ``numpy_rng(seed, "partition")``, in this order:

    1. Each class's indices (ascending) are shuffled, class 0 first.
    2. q [K, C] (:func:`client_class_mixes`): row k ~ Dir(alpha * p) with p_c = N_c / N, N_c the
       count of class c in 0..C-1 (C = max(labels) + 1); a class absent from `labels` has q_k[c] = 0.
    3. Client sizes are equal, not skewed: n_k = N // K, one more for each of the first N mod K
       clients (:func:`client_sizes`), as Hsu et al. give every client the same number of samples.
    4. Clients are filled one after the other, client 0 first **(choice)** (:func:`client_class_counts`):
       client k takes n_k samples without replacement, one at a time, each of class c with
       probability q_k[c] / sum of q_k over the classes that still have samples left (q_k is
       renormalised once a class runs out), and takes that class's next unused shuffled index.

    `min_size` is checked but inert: the arguments check refuses K * min_size > N, so every
    n_k >= N // K >= min_size, and the partition is never drawn again (as ``dirichlet``'s is). The
    result is a function of (labels, K, alpha, seed), bit-identical across runs.
    """
    labels = validated_labels(labels)
    check_arguments(len(labels), num_clients, alpha, min_size)
    rng = numpy_rng(seed, "partition")
    class_indices = indices_by_class(labels)
    for indices_of_class in class_indices:
        rng.shuffle(indices_of_class)
    concentration = float(alpha) * np.bincount(labels) / len(labels)
    mixes = client_class_mixes(rng, concentration, num_clients)
    counts = client_class_counts(rng, np.bincount(labels), client_sizes(len(labels), num_clients), mixes,
                                 concentration)
    # Client k takes the next counts[k, c] indices of class c's shuffled list.
    starts = np.cumsum(counts, axis=0) - counts
    return [sorted_int64(np.concatenate([class_indices[c][starts[k, c]:starts[k, c] + counts[k, c]]
                                         for c in range(len(class_indices))])) for k in range(num_clients)]


def client_sizes(num_samples: int, num_clients: int) -> np.ndarray:
    """n_k = N // K + (1 if k < N mod K else 0), int64 [K]: 10 samples over 4 clients -> [3, 3, 2, 2]."""
    sizes = np.full(num_clients, num_samples // num_clients, dtype=np.int64)
    sizes[: num_samples % num_clients] += 1
    return sizes


def client_class_mixes(rng: np.random.Generator, concentration: np.ndarray, num_clients: int) -> np.ndarray:
    """q float [K, C]: row k ~ Dir(concentration) over the classes with concentration > 0 (one
    ``rng.dirichlet`` call, rows in client order), 0 on the others."""
    present = concentration > 0
    mixes = np.zeros((num_clients, len(concentration)))
    mixes[:, present] = rng.dirichlet(concentration[present], size=num_clients)
    return mixes


def client_class_counts(
    rng: np.random.Generator,
    class_sizes: np.ndarray,
    quotas: np.ndarray,
    mixes: np.ndarray,
    concentration: np.ndarray,
) -> np.ndarray:
    """counts int64 [K, C]: client k = 0, 1, ... in turn draws quotas[k] samples without
    replacement from what clients 0..k-1 left of class_sizes [C], each of class c with probability
    mixes[k, c] / sum over c' with samples left of mixes[k, c'].

    Needs sum(quotas) <= sum(class_sizes). When mixes[k] is 0 on every class left (at tiny
    alpha a draw can put all its float mass on a class earlier clients used up), the rest of client
    k's draws use a fresh q ~ Dir(concentration over the classes left), drawn from `rng`: the law of
    q_k renormalised over those classes, which floating point rounded to 0 **(choice)**.

    Each client draws its remaining quota at once from the renormalised mix and keeps the draws up
    to the first one beyond a class's samples left (that class is then exhausted; the rest are
    drawn again): exactly one-at-a-time sampling, in at most C + 1 batches per client.
    """
    remaining = np.asarray(class_sizes, dtype=np.int64).copy()
    num_classes = len(remaining)
    counts = np.zeros((len(quotas), num_classes), dtype=np.int64)
    for client, quota in enumerate(quotas):
        mix = np.asarray(mixes[client], dtype=np.float64).copy()
        need = int(quota)
        while need > 0:
            left = remaining > 0
            if not left.any():
                raise PartitionError(f"client_dirichlet: client {client} needs {need} more samples, none are left")
            weights = np.where(left, mix, 0.0)
            if not weights.sum() > 0:
                mix = np.zeros(num_classes)
                mix[left] = rng.dirichlet(concentration[left])
                weights = mix
            draws = rng.choice(num_classes, size=need, p=weights / weights.sum())
            kept = _draws_within(draws, remaining)
            taken = np.bincount(draws[:kept], minlength=num_classes)
            counts[client] += taken
            remaining -= taken
            need -= kept
    return counts


def _draws_within(draws: np.ndarray, remaining: np.ndarray) -> int:
    """How many of `draws` (classes, in order) come before the first draw of a class beyond its
    `remaining` samples: [0, 1, 0, 0] with remaining [2, 5] -> 3."""
    drawn = np.bincount(draws, minlength=len(remaining))
    over = np.flatnonzero(drawn > remaining)
    return min((int(np.flatnonzero(draws == c)[remaining[c]]) for c in over), default=len(draws))
