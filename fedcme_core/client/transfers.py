"""The local loop's moves between the host and the training device, once per epoch or phase.

The training step itself moves nothing and reads nothing back: every tensor it indexes or adds is
on the device already (tests/test_host_syncs.py counts, per step, the moves through these functions,
every ``Tensor.to``/``cpu``/``cuda`` naming a device, and every operation that makes a GPU wait for
the host, for every algorithm).
"""

from __future__ import annotations

import torch


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` on `device`: the same tensor where it is there already (the CPU path); to CUDA from
    pinned memory, asynchronously on the current stream (the host does not wait)."""
    if tensor.device == device:
        return tensor
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` on the CPU (the same tensor where it is there already); from CUDA the host waits."""
    return tensor if tensor.device.type == "cpu" else tensor.cpu()
