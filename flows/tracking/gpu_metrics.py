"""Whether MLflow's system metrics will include the GPU's, and the one line that says why not.

MLflow samples GPU utilisation, memory and power through NVML (``nvidia-ml-py``, pinned in
requirements.txt) when a GPU is present; when the library is missing or NVML cannot start, it only
logs at INFO, which this pipeline hides. :func:`gpu_metrics_problem` gives that reason as one line,
for the command to print where a GPU is present (``flows/tracking/run.py``'s ``start_system_metrics``).
"""

from __future__ import annotations

import importlib


def gpu_metrics_problem(gpu_present: bool | None = None) -> str | None:
    """None when there is no GPU (nothing to sample) or NVML starts; else one line naming what is
    missing. `gpu_present`: None asks torch."""
    if gpu_present is None:
        import torch

        gpu_present = torch.cuda.is_available()
    if not gpu_present:
        return None
    try:
        pynvml = importlib.import_module("pynvml")
    except ImportError:
        return ("GPU system metrics off: nvidia-ml-py is not installed (pip install -r requirements.txt, "
                "or pip install nvidia-ml-py)")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return f"GPU system metrics off: NVML did not start ({error})"
    return None
