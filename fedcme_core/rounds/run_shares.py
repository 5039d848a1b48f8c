"""A run's test shares (:func:`fedcme_core.data.local_shares.local_shares`): computed once per process
and run from the run's partition, its dataset and its seed, and never written to disk (they are a pure
function of the three, as the partition file's cache in :mod:`fedcme_core.rounds.run_record` is of its file)."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from fedcme_core.config.schema import ExperimentConfig
from fedcme_core.data.local_shares import local_shares
from fedcme_core.data.partition import class_counts
from fedcme_core.rounds import run_record
from fedcme_core.rounds.setup import load_experiment_dataset
from fedcme_core.rounds.store import RunPaths


def run_test_shares(config: ExperimentConfig, run_dir: str | Path) -> tuple[np.ndarray, ...]:
    """Client k's indices into the run's test set (``x_test``), one array per client: each share follows
    the client's training label mix. Computed once per process while the partition file is unchanged."""
    path = RunPaths(run_dir).partition
    return _cached_shares(str(path), path.stat().st_mtime_ns, config.data, config.seed)


@functools.lru_cache(maxsize=4)
def _cached_shares(path: str, modified_ns: int, data_config, seed: int) -> tuple[np.ndarray, ...]:
    dataset = load_experiment_dataset(data_config, seed)
    partition = run_record.run_partition_file(Path(path).parent)
    counts = class_counts(dataset.y_train.numpy(), partition.clients, dataset.num_classes)
    return tuple(local_shares(counts, dataset.y_test.numpy(), seed))
