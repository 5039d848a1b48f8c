"""The dask runner's LocalCluster: worker processes keep glibc's malloc defaults."""

from __future__ import annotations

import os

import pytest
from distributed import Client, LocalCluster

from flows.orchestration.dask_cluster import local_cluster

pytestmark = pytest.mark.slow  # two LocalClusters of worker processes

CLUSTER = {"n_workers": 1, "threads_per_worker": 1, "processes": True, "host": "127.0.0.1", "dashboard_address": None}


def worker_environment(cluster) -> dict[str, str | None]:
    with Client(cluster) as client:
        values = client.run(lambda: {key: os.environ.get(key) for key in ("MALLOC_TRIM_THRESHOLD_", "OMP_NUM_THREADS")})
    (environment,) = values.values()
    return environment


def test_workers_do_not_get_dasks_malloc_trim_threshold(monkeypatch):
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)  # a plain LocalCluster writes it into os.environ
    with local_cluster(**CLUSTER) as cluster:
        ours = worker_environment(cluster)
    with LocalCluster(**CLUSTER) as cluster:
        plain = worker_environment(cluster)

    assert ours == {"MALLOC_TRIM_THRESHOLD_": None, "OMP_NUM_THREADS": "1"}
    assert plain["MALLOC_TRIM_THRESHOLD_"] == "65536"  # what the nanny would otherwise set
