"""FedLab's unbalanced Dirichlet partition (``lognormal_dirichlet``): log-normal client sizes,
a Dir(alpha) class prior per client, samples dealt one at a time (:mod:`fedcme_core.data.partition`
describes every method)."""

from __future__ import annotations

import math

import numpy as np

from fedcme_core.common.seeding import numpy_rng
from fedcme_core.data.labels import (
    PartitionError,
    check_arguments,
    indices_by_class,
    is_number,
    sorted_int64,
    validated_labels,
)


def lognormal_dirichlet_partition(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    sigma: float,
    seed: int,
    min_size: int = 10,
) -> list[np.ndarray]:
    """FedLab's unbalanced Dirichlet partition: log-normal sizes, Dir(alpha) class priors."""
    labels = validated_labels(labels)
    check_arguments(len(labels), num_clients, alpha, min_size)
    if not is_number(sigma) or not (math.isfinite(sigma) and sigma >= 0):
        raise PartitionError(f"sigma={sigma!r} must be a finite number >= 0")
    num_samples = len(labels)
    num_classes = int(labels.max()) + 1
    rng = numpy_rng(seed, "partition")
    client_sizes = _lognormal_sizes(rng, num_samples, num_clients, float(sigma), min_size)
    class_priors = rng.dirichlet(np.full(num_classes, float(alpha)), size=num_clients)
    class_indices = indices_by_class(labels)
    for indices_of_class in class_indices:
        rng.shuffle(indices_of_class)
    client_order = rng.permutation(np.repeat(np.arange(num_clients), client_sizes))
    drawn_classes = _deal_classes(rng, client_order, class_priors, np.array([len(c) for c in class_indices]))
    # The j-th draw of class c takes the j-th index of c's shuffled list.
    by_class = np.argsort(drawn_classes, kind="stable")
    assigned = np.empty(num_samples, dtype=np.int64)
    assigned[by_class] = np.concatenate(class_indices)
    owner_order = np.argsort(client_order, kind="stable")
    boundaries = np.cumsum(client_sizes)[:-1]
    return [sorted_int64(part) for part in np.split(assigned[owner_order], boundaries)]


def _lognormal_sizes(
    rng: np.random.Generator, num_samples: int, num_clients: int, sigma: float, min_size: int
) -> np.ndarray:
    """Client sizes: min_size each plus a LogNormal-proportional share of the rest, summing to N.

    The share is rounded by largest remainder (ties to the lower client id) **(choice)**.
    """
    raw = rng.lognormal(mean=math.log(num_samples / num_clients), sigma=sigma, size=num_clients)
    spare = num_samples - num_clients * min_size
    shares = raw / raw.sum() * spare
    sizes = np.floor(shares).astype(np.int64)
    leftover = spare - int(sizes.sum())
    by_remainder = np.argsort(-(shares - sizes), kind="stable")
    sizes[by_remainder[:leftover]] += 1
    return sizes + min_size


def _deal_classes(
    rng: np.random.Generator, client_order: np.ndarray, class_priors: np.ndarray, class_sizes: np.ndarray
) -> np.ndarray:
    """The class of every draw in `client_order`, from each client's prior over non-empty classes.

    Vectorised in rounds: draws are made for all remaining positions under the current set
    of non-empty classes; they are kept up to the first draw from a class that has run out,
    which then leaves the set. At most one round per class.
    """
    total = len(client_order)
    num_classes = len(class_sizes)
    drawn = np.empty(total, dtype=np.int64)
    remaining = class_sizes.astype(np.int64).copy()
    position = 0
    while position < total:
        weights = class_priors * (remaining > 0)
        empty_rows = weights.sum(axis=1) <= 0
        # A client whose prior lies wholly on exhausted classes follows the remaining counts.
        weights[empty_rows] = remaining.astype(np.float64)
        cumulative = np.cumsum(weights, axis=1)
        last_positive = num_classes - 1 - np.argmax(weights[:, ::-1] > 0, axis=1)
        clients = client_order[position:]
        thresholds = rng.random(len(clients)) * cumulative[clients, -1]
        classes = (cumulative[clients] <= thresholds[:, None]).sum(axis=1)
        classes = np.minimum(classes, last_positive[clients])
        counts = np.bincount(classes, minlength=num_classes)
        overdrawn = counts > remaining
        if overdrawn.any():
            # Position of the first draw beyond a class's remaining samples, over all classes.
            draws_by_class = np.argsort(classes, kind="stable")
            first_draw_of_class = np.cumsum(counts) - counts
            accepted = int(draws_by_class[first_draw_of_class[overdrawn] + remaining[overdrawn]].min())
        else:
            accepted = len(classes)
        drawn[position : position + accepted] = classes[:accepted]
        remaining -= np.bincount(classes[:accepted], minlength=num_classes)
        position += accepted
    return drawn
