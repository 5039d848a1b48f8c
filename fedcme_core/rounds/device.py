"""Where a client's local training runs: its rows of the training set, and its CUDA stream.

- :func:`client_data`: client k's rows (x [D_k, C, H, W] in the run's layout, y [D_k]) on the
  run's device. On CUDA they are gathered on the GPU from a copy of the training set made once
  per process and device, already in the run's layout (GPU memory, not the process's RSS). On
  the CPU each client's rows are gathered and laid out when it trains: a second whole copy in
  the other layout would raise the peak RSS (:func:`fedcme_core.rounds.setup.load_experiment_dataset`).
  Both give the same tensors (tests/test_device.py gathers the resident way on the CPU).
- :func:`worker_stream`: the calling worker thread's own CUDA stream, so the clients that the
  thread runner trains at once overlap on one GPU. The stream first waits for the work queued
  before it (the model's upload to the GPU), and the block ends with the stream synchronised, so
  the client's results are complete when the block returns. On the CPU it does nothing.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

from fedcme_core.data import datasets as data_module
from fedcme_core.client.compute import Compute

_LOCK = threading.Lock()
_RESIDENT: dict[tuple[int, str, bool], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
_STREAMS = threading.local()


def resident_training_set(dataset: data_module.Dataset, device: torch.device,
                          compute: Compute) -> tuple[torch.Tensor, torch.Tensor]:
    """The training set on `device` in the run's layout, copied once per process (x [N, C, H, W], y [N])."""
    key = (id(dataset.x_train), str(device), compute.channels_last)
    with _LOCK:
        if key not in _RESIDENT:  # the entry holds the source tensor, so its id is not reused meanwhile
            _RESIDENT[key] = (dataset.x_train, compute.layout(dataset.x_train.to(device)), dataset.y_train.to(device))
        _, x, y = _RESIDENT[key]
    return x, y


def gather_resident(dataset: data_module.Dataset, indices: torch.Tensor, device: torch.device,
                    compute: Compute) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = resident_training_set(dataset, device, compute)
    rows = indices.to(device)
    return compute.layout(x[rows]), y[rows]  # [D_k, C, H, W], [D_k]


def client_data(dataset: data_module.Dataset, indices: torch.Tensor, device: torch.device,
                compute: Compute) -> tuple[torch.Tensor, torch.Tensor]:
    """SPEC step 4's D_k: the client's rows of the training set, on `device`, in the run's layout."""
    if device.type == "cuda":
        return gather_resident(dataset, indices, device, compute)
    return compute.layout(dataset.x_train[indices].to(device)), dataset.y_train[indices].to(device)


@contextlib.contextmanager
def worker_stream(device: torch.device) -> Iterator[None]:
    """Queue the block's CUDA work on this thread's own stream, and wait for it at the end."""
    if device.type != "cuda":
        yield
        return
    streams = _STREAMS.__dict__.setdefault("by_device", {})
    stream = streams.get(str(device))
    if stream is None:
        stream = streams[str(device)] = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        yield
    stream.synchronize()
