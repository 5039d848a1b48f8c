"""The process-wide torch settings that make training on a GPU bit-reproducible, and their record.

:func:`configure_device` runs in every process that trains or evaluates (the command's own, and
each Dask worker's, through ``fedcme_core.rounds.steps``, the calibration's training step and
``flows.orchestration.dask_cluster``), before the run's first CUDA kernel. On CUDA it

- turns on ``torch.use_deterministic_algorithms`` (``index_add_`` of the local features then adds
  in a fixed order, and an operation with no deterministic kernel raises instead of drifting);
- sets ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` unless it already holds a deterministic value (cuBLAS
  reads it when it first runs in the process, so it must be set before any matrix product);
- turns cuDNN's benchmark off and its deterministic mode on;
- computes fp32 as IEEE fp32: TensorFloat-32 (TF32, 10 mantissa bits, cuDNN's default for
  convolutions on Ampere and later) only where the run's precision is ``tf32``.

What is then bit-identical on a GPU: the same config on the same GPU model, driver, torch and
these flags (``compute.json``'s ``device`` section records them). Another GPU model or driver may
pick other kernels and give other bits; fp32 results stay within float rounding of the CPU's.

On the CPU nothing is set: torch's CPU kernels used here are deterministic run to run already
(``tests/test_golden_runs.py``), and the deterministic mode would only add the cost of filling
every new tensor's memory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

DETERMINISTIC_WORKSPACES = (":4096:8", ":16:8")  # the values cuBLAS documents as reproducible
WORKSPACE = ":4096:8"


def configure_device(device: torch.device, precision: str = "fp32") -> dict[str, Any]:
    """Set this process's torch flags for training on `device` in `precision` (fp32 | bf16 | tf32);
    idempotent and cheap, so every step may call it. Returns :func:`device_flags` (plain JSON)."""
    if device.type == "cuda":
        if os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in DETERMINISTIC_WORKSPACES:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = WORKSPACE
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        fp32 = "tf32" if precision == "tf32" else "ieee"
        torch.backends.cuda.matmul.fp32_precision = fp32
        torch.backends.cudnn.conv.fp32_precision = fp32
        torch.backends.cudnn.rnn.fp32_precision = fp32
    return device_flags(device)


def device_flags(device: torch.device) -> dict[str, Any]:
    """The settings in force for `device` in this process: {"type": "cpu"} on the CPU; on CUDA
    also deterministic, cudnn_deterministic, cudnn_benchmark, tf32 (bool) and cublas_workspace_config."""
    if device.type != "cuda":
        return {"type": device.type}
    return {
        "type": "cuda",
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "tf32": "tf32" in (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    }


DRIVER_VERSION_FILE = Path("/proc/driver/nvidia/version")


def driver_version(path: Path = DRIVER_VERSION_FILE) -> str:
    """The NVIDIA kernel driver's version ("550.54.15"), as the driver reports it in `path`; "unknown"
    where it cannot be read (not Linux, or no NVIDIA driver)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "unknown"
    found = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+)+)", text)
    return found.group(1) if found else "unknown"


def gpu_identity(device: torch.device) -> dict[str, Any]:
    """Which GPU `device` is: index (torch's, after CUDA_VISIBLE_DEVICES), name, compute capability,
    driver, CUDA_VISIBLE_DEVICES and the CUDA version torch was built with. Needs CUDA."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    return {"index": index, "name": torch.cuda.get_device_name(index), "capability": f"{major}.{minor}",
            "driver": driver_version(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "cuda": torch.version.cuda}


def device_record(device: torch.device, precision: str) -> dict[str, Any]:
    """What `compute.json` records of the device: :func:`configure_device`'s flags (set here) and,
    on CUDA, :func:`gpu_identity`."""
    record = configure_device(device, precision)
    if device.type == "cuda":
        record.update(gpu_identity(device))
    return record
