"""fedcme_core.rounds.device: a client's rows gathered from the resident training set (the CUDA way)
equal those gathered per client (the CPU way), and the resident copies are bounded and released; the
worker stream is a no-op on the CPU, and on CUDA (a fake stream factory here) it waits for the work
before it and synchronises on every exit, an exception included."""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch

from fedcme_core.client.compute import Compute
from fedcme_core.data.datasets import Dataset
from fedcme_core.rounds import device as device_module
from fedcme_core.rounds import run_experiment
from fedcme_core.rounds.device import (
    client_data,
    gather_resident,
    release_resident,
    resident_training_set,
    worker_stream,
)

CPU = torch.device("cpu")


def dataset(seed: int = 0) -> Dataset:
    generator = torch.Generator().manual_seed(seed)
    return Dataset(name="synthetic", x_train=torch.randn(40, 3, 8, 8, generator=generator),
                   y_train=torch.randint(0, 10, (40,), generator=generator), x_test=torch.zeros(4, 3, 8, 8),
                   y_test=torch.zeros(4, dtype=torch.long), num_classes=10, mean=(0.0,) * 3, std=(1.0,) * 3)


@pytest.mark.parametrize("compute", [Compute(channels_last=False), Compute(channels_last=True)], ids=["nchw", "channels_last"])
def test_the_resident_gather_gives_the_per_client_rows_in_the_runs_layout(compute):
    data = dataset()
    indices = torch.tensor([7, 0, 31, 3, 3, 12])

    per_client = client_data(data, indices, CPU, compute)
    resident = gather_resident(data, indices, CPU, compute)

    for ours, theirs in zip(resident, per_client, strict=True):
        assert torch.equal(ours, theirs)
    assert compute.in_layout(resident[0]) and compute.in_layout(per_client[0])
    assert torch.equal(resident[0][2], data.x_train[31]) and resident[1].tolist() == data.y_train[indices].tolist()


def test_the_training_set_is_copied_once_per_process_layout_and_dataset():
    first, second = dataset(0), dataset(1)
    channels_last = Compute(channels_last=True)

    copy = resident_training_set(first, CPU, channels_last)
    assert resident_training_set(first, CPU, channels_last)[0] is copy[0]
    assert resident_training_set(first, CPU, Compute())[0] is not copy[0]  # another layout, another copy
    assert torch.equal(resident_training_set(second, CPU, channels_last)[0], second.x_train)
    assert channels_last.in_layout(copy[0]) and not Compute().in_layout(copy[0])


def test_the_worker_stream_does_nothing_on_the_cpu():
    ran = []
    with worker_stream(CPU):
        ran.append(torch.ones(2).sum().item())

    assert ran == [2.0]


class FakeStream:
    def __init__(self, name: str, events: list[str]) -> None:
        self.name, self.events = name, events

    def wait_stream(self, other: "FakeStream") -> None:
        self.events.append(f"{self.name} waits for {other.name}")

    def synchronize(self) -> None:
        self.events.append(f"{self.name} synchronised")


class FakeStreams:
    """A StreamFactory without CUDA: each thread its own stream, every call recorded."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.by_thread: dict[int, FakeStream] = {}
        self.current = FakeStream("default", self.events)

    def thread_stream(self, device):
        thread = threading.get_ident()
        if thread not in self.by_thread:
            self.by_thread[thread] = FakeStream(f"worker{len(self.by_thread)}", self.events)
        return self.by_thread[thread]

    def current_stream(self, device):
        return self.current

    @contextlib.contextmanager
    def use(self, stream):
        self.events.append(f"on {stream.name}")
        try:
            yield
        finally:
            self.events.append(f"off {stream.name}")


CUDA = torch.device("cuda")


def test_the_worker_stream_waits_for_queued_work_and_synchronises_at_the_end():
    streams = FakeStreams()
    with worker_stream(CUDA, streams):
        streams.events.append("client trains")

    assert streams.events == ["worker0 waits for default", "on worker0", "client trains", "off worker0",
                              "worker0 synchronised"]


def test_the_worker_stream_synchronises_when_the_client_raises():
    """An out-of-memory client must not leave its kernels running while its tensors are freed."""
    streams = FakeStreams()
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        with worker_stream(CUDA, streams):
            raise RuntimeError("CUDA out of memory")

    assert streams.events[-1] == "worker0 synchronised" and "off worker0" in streams.events


def test_each_worker_thread_keeps_its_own_stream():
    streams = FakeStreams()
    for _ in range(2):
        with worker_stream(CUDA, streams):
            pass

    def other_thread() -> None:
        with worker_stream(CUDA, streams):
            pass

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()

    assert [stream.name for stream in streams.by_thread.values()] == ["worker0", "worker1"]
    assert streams.events.count("worker0 synchronised") == 2 and streams.events[-1] == "worker1 synchronised"


def test_resident_copies_are_bounded_least_recently_used_first_and_released():
    release_resident()
    datasets = [dataset(seed) for seed in range(device_module.RESIDENT_LIMIT + 1)]
    first = resident_training_set(datasets[0], CPU, Compute())[0]
    for data in datasets[1:-1]:
        resident_training_set(data, CPU, Compute())
    assert resident_training_set(datasets[0], CPU, Compute())[0] is first  # used again: now the most recent
    resident_training_set(datasets[-1], CPU, Compute())  # one too many: the least recently used goes

    assert len(device_module._RESIDENT) == device_module.RESIDENT_LIMIT
    assert resident_training_set(datasets[0], CPU, Compute())[0] is first
    if device_module.RESIDENT_LIMIT > 1:
        assert (id(datasets[1].x_train), "cpu", False) not in device_module._RESIDENT
    assert release_resident() == device_module.RESIDENT_LIMIT and not device_module._RESIDENT


def test_a_finished_run_leaves_no_resident_copy(tmp_path, synthetic_config):
    resident_training_set(dataset(5), CPU, Compute())
    run_experiment(synthetic_config({"federation.rounds": 1}), tmp_path / "run")

    assert not device_module._RESIDENT
