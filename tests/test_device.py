"""fedcme_core.rounds.device: a client's rows gathered from the resident training set (the CUDA way)
equal those gathered per client (the CPU way); the worker stream is a no-op on the CPU."""

from __future__ import annotations

import pytest
import torch

from fedcme_core.client.compute import Compute
from fedcme_core.data.datasets import Dataset
from fedcme_core.rounds.device import client_data, gather_resident, resident_training_set, worker_stream

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
