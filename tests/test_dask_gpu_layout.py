"""GPUs under Dask, on the CPU: the worker layout for a given GPU count, the CUDA probe on the
workers, the refusal of workers that resolve the device differently, and a local cluster whose
workers each get their own CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import os

import pytest
import torch

from flows.orchestration.dask_cluster import gpu_worker_environments, local_cluster, one_device, worker_device, worker_problem
from flows.common.errors import OrchestratorError


@pytest.mark.parametrize(("gpus", "workers", "visible", "pinned"), [
    (1, None, None, ["0"]),  # one worker per GPU
    (4, None, None, ["0", "1", "2", "3"]),
    (2, None, "5,7", ["5", "7"]),  # the ids this process sees, not torch's indices
    (1, 2, None, ["0", "0"]),  # two workers asked for: they share the one GPU
    (2, 3, "3,1", ["3", "1", "3"]),
])
def test_one_worker_per_visible_gpu_each_pinned(gpus, workers, visible, pinned):
    environments = gpu_worker_environments(gpus, workers, visible)

    assert [environment["CUDA_VISIBLE_DEVICES"] for environment in environments] == pinned
    assert all(environment["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8" for environment in environments)


def test_no_gpu_no_gpu_workers():
    with pytest.raises(OrchestratorError, match="device: cuda with the dask runner, but this machine has no visible GPU"):
        gpu_worker_environments(0)


def test_a_round_never_mixes_devices():
    assert one_device({"tcp://a:1": "cuda", "tcp://b:2": "cuda"}, "auto") == "cuda"
    with pytest.raises(OrchestratorError, match=r"resolve device: auto differently \(tcp://b:2: cpu, tcp://a:1: cuda\)"):
        one_device({"tcp://a:1": "cuda", "tcp://b:2": "cpu"}, "auto")
    with pytest.raises(OrchestratorError, match="Dask worker tcp://b:2: device: 'cuda' was requested"):
        one_device({"tcp://a:1": "cuda", "tcp://b:2": "error: device: 'cuda' was requested but no CUDA device is "
                    "available"}, "cuda")


def test_a_cpu_worker_refuses_a_cuda_run_itself(tmp_path, synthetic_config, monkeypatch):
    """The probe runs on the worker: a CPU-only worker names itself, whatever the driver has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    marker = tmp_path / "marker"
    marker.write_text("fedcme\n")
    from flows.orchestration.dask_cluster import code_digest

    values = synthetic_config({"device": "cuda"}).model_dump(mode="json")
    problem = worker_problem(str(marker), values, code_digest())

    assert problem == "device: 'cuda' was requested but no CUDA device is available on this worker"
    assert worker_device("auto") == "cpu"


@pytest.mark.slow  # a LocalCluster of two worker processes
def test_a_local_cluster_pins_each_worker_to_its_gpu():
    from distributed import Client

    cluster_kwargs = {"threads_per_worker": 1, "processes": True, "host": "127.0.0.1", "dashboard_address": None}
    with local_cluster(gpu_worker_environments(2, visible="3,5"), **cluster_kwargs) as cluster, Client(cluster) as client:
        seen = client.run(lambda: (os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("CUBLAS_WORKSPACE_CONFIG")))

    assert sorted(seen.values()) == [("3", ":4096:8"), ("5", ":4096:8")]


def test_the_task_runner_of_a_cuda_run_starts_one_pinned_worker_per_gpu(monkeypatch):
    from fedcme_core.config.schema import RunnerConfig
    from flows.orchestration.tasks import make_task_runner, uses_cuda

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    runner = RunnerConfig(kind="dask", workers=None)

    on_gpus = make_task_runner(runner, "cuda").cluster_kwargs
    on_cpu = make_task_runner(runner, "cpu").cluster_kwargs

    assert "n_workers" not in on_gpus
    assert [environment["CUDA_VISIBLE_DEVICES"] for environment in on_gpus["worker_environments"]] == ["4", "6"]
    assert "worker_environments" not in on_cpu and on_cpu["n_workers"] >= 1
    assert uses_cuda("auto") and not uses_cuda("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not uses_cuda("auto") and uses_cuda("cuda")
