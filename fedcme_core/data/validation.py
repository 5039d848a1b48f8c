"""The validation split: a stratified, seeded part of the training set held out before partitioning.

``data.validation_fraction`` = f holds out, of each class c with n_c training samples,
round_half_up(f * n_c) samples (chosen by a permutation seeded by the experiment's seed and c), so
the validation set has the training set's class mix. No client trains on them: the partition is made
of the rows left. A tuning run (``data.evaluate_on: validation``) evaluates on them in place of the
test set, which it never reads (:func:`fedcme_core.data.datasets.hold_out_validation`).
"""

from __future__ import annotations

import math

import numpy as np

from fedcme_core.common.seeding import numpy_rng
from fedcme_core.data.sources import DataError


def class_holdout(count: int, fraction: float) -> int:
    """Samples held out of a class of `count`: floor(fraction * count + 0.5) (half rounds up)."""
    return int(math.floor(fraction * count + 0.5))


def validation_split(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, validation rows) of the training `labels` [N]: sorted int64 row indices that
    partition range(N); of each class, :func:`class_holdout` rows go to validation, drawn by
    ``numpy_rng(seed, "validation", c)``. `fraction` 0 holds out nothing. A fraction outside [0, 1), or
    one that holds out no sample or every sample, is a one-line DataError."""
    labels = np.asarray(labels)
    if isinstance(fraction, bool) or not 0 <= fraction < 1:
        raise DataError(f"data.validation_fraction: {fraction!r} must be in [0, 1)")
    rows = np.arange(len(labels), dtype=np.int64)
    if fraction == 0:
        return rows, np.empty(0, dtype=np.int64)
    held = []
    for label in np.unique(labels):
        members = rows[labels == label]
        count = class_holdout(len(members), fraction)
        held.append(numpy_rng(seed, "validation", int(label)).permutation(members)[:count])
    validation = np.sort(np.concatenate(held)).astype(np.int64)
    if len(validation) == 0 or len(validation) == len(labels):
        raise DataError(f"data.validation_fraction: {fraction} of {len(labels)} training samples holds out "
                        f"{len(validation)}; choose a fraction that leaves both parts non-empty")
    return np.setdiff1d(rows, validation).astype(np.int64), validation
