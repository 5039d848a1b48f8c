"""The local Dask cluster of the ``dask`` runner: worker processes that train at full speed.

Dask's nanny sets ``MALLOC_TRIM_THRESHOLD_=65536`` in every worker process it spawns
(``distributed.nanny.pre-spawn-environ``). Setting any glibc malloc threshold switches off glibc's
dynamic mmap threshold, so every activation and gradient buffer above 128 KiB is mmap-ed and
unmapped again at each training step and its pages faulted in anew: measured on fmnist_cnn
(batch 64, 1 thread), local training runs at 619-683 samples/s with that variable against
963-1043 without it (``BENCHMARKS.md``, "Parallel efficiency"). Our workers leave glibc's
defaults alone (dask documents a ``None`` value as "do not set"); the nanny's other
variables (``OMP_NUM_THREADS=1`` and the like) stay.
"""

from __future__ import annotations

from typing import Any

import dask
from distributed import LocalCluster

WORKER_ENVIRONMENT = {"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}


def local_cluster(**cluster_kwargs: Any) -> LocalCluster:
    """A ``distributed.LocalCluster(**cluster_kwargs)`` whose worker processes keep glibc's malloc defaults."""
    with dask.config.set(WORKER_ENVIRONMENT):
        return LocalCluster(**cluster_kwargs)
