"""Where a client's local training runs: its rows of the training set, and its CUDA stream.

- :func:`client_data`: client k's rows (x [D_k, C, H, W] in the run's layout, y [D_k]) on the
  run's device. On CUDA they are gathered on the GPU from a copy of the training set made once
  per process, dataset, device and layout, already in the run's layout (GPU memory, not the
  process's RSS). At most RESIDENT_LIMIT such copies are kept, the least recently used dropped
  first (a grid of several seeds or subsets in one process adds one dataset per seed), and
  :func:`release_resident` drops them all at the end of a run. On the CPU each client's rows are
  gathered and laid out when it trains: a second whole copy in the other layout would raise the
  peak RSS (:func:`fedcme_core.rounds.setup.load_experiment_dataset`). Both give the same tensors
  (tests/test_device.py gathers the resident way on the CPU).
- :func:`worker_stream`: the calling worker thread's own CUDA stream, so the clients that the
  thread runner trains at once overlap on one GPU. The stream first waits for the work queued
  before it (the model's upload to the GPU), and on every exit from the block, an exception
  (out of memory, say) included, the stream is synchronised: no kernel of the client runs on
  after the block, when its tensors may be freed to another thread. On the CPU it does nothing.
  The streams come from a :class:`StreamFactory` (CUDA's by default; tests pass a fake).
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, ContextManager, Protocol

import torch

from fedcme_core.data import datasets as data_module
from fedcme_core.client.compute import Compute

RESIDENT_LIMIT = 2  # as many datasets as load_experiment_dataset keeps per process

_LOCK = threading.Lock()
_RESIDENT: OrderedDict[tuple[int, str, bool], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = OrderedDict()


def resident_training_set(dataset: data_module.Dataset, device: torch.device,
                          compute: Compute) -> tuple[torch.Tensor, torch.Tensor]:
    """The training set on `device` in the run's layout (x [N, C, H, W], y [N]), copied once per
    process while it stays among the RESIDENT_LIMIT most recently used copies."""
    key = (id(dataset.x_train), str(device), compute.channels_last)
    with _LOCK:
        if key in _RESIDENT:
            _RESIDENT.move_to_end(key)
        else:  # the entry holds the source tensor, so its id is not reused meanwhile
            while len(_RESIDENT) >= RESIDENT_LIMIT:
                _RESIDENT.popitem(last=False)
            _RESIDENT[key] = (dataset.x_train, compute.layout(dataset.x_train.to(device)), dataset.y_train.to(device))
        _, x, y = _RESIDENT[key]
    return x, y


def release_resident() -> int:
    """Drop every resident copy (at the end of a run) and return CUDA's cached blocks to the
    driver where CUDA was used; returns how many copies were dropped."""
    with _LOCK:
        dropped = len(_RESIDENT)
        _RESIDENT.clear()
    if dropped and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    return dropped


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


class StreamFactory(Protocol):
    """Where worker_stream gets its streams: the calling thread's own stream on a device, the
    device's current stream, and a context that makes a stream current."""

    def thread_stream(self, device: torch.device) -> Any: ...

    def current_stream(self, device: torch.device) -> Any: ...

    def use(self, stream: Any) -> ContextManager[Any]: ...


class CudaStreams:
    """CUDA's streams: one per worker thread and device, made on the thread's first use."""

    def __init__(self) -> None:
        self._local = threading.local()

    def thread_stream(self, device: torch.device) -> torch.cuda.Stream:
        streams = self._local.__dict__.setdefault("by_device", {})
        if str(device) not in streams:
            streams[str(device)] = torch.cuda.Stream(device)
        return streams[str(device)]

    def current_stream(self, device: torch.device) -> torch.cuda.Stream:
        return torch.cuda.current_stream(device)

    def use(self, stream: torch.cuda.Stream) -> ContextManager[Any]:
        return torch.cuda.stream(stream)


CUDA_STREAMS = CudaStreams()


@contextlib.contextmanager
def worker_stream(device: torch.device, streams: StreamFactory | None = None) -> Iterator[None]:
    """Queue the block's CUDA work on this thread's own stream (from `streams`, CUDA's by default)
    after the work queued before it, and wait for it on every exit, exceptions included."""
    if device.type != "cuda":
        yield
        return
    streams = CUDA_STREAMS if streams is None else streams
    stream = streams.thread_stream(device)
    stream.wait_stream(streams.current_stream(device))
    try:
        with streams.use(stream):
            yield
    finally:
        stream.synchronize()
