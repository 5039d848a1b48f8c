"""GPU system metrics: nvidia-ml-py is pinned, and a GPU without it (or without NVML) is one line."""

from __future__ import annotations

import importlib
import re
import sys
import types

from flows.tracking.gpu_metrics import gpu_metrics_problem

from .conftest import REPO_ROOT


def test_nvidia_ml_py_is_pinned_in_the_requirements():
    pins = re.findall(r"^nvidia-ml-py==(\d+\.\d+\.\d+)", (REPO_ROOT / "requirements.txt").read_text(), re.MULTILINE)
    assert len(pins) == 1


def test_no_gpu_no_line():
    assert gpu_metrics_problem(gpu_present=False) is None


def test_a_gpu_without_nvidia_ml_py_is_one_visible_line(monkeypatch):
    real_import = importlib.import_module
    monkeypatch.setattr(importlib, "import_module",
                        lambda name, *args: (_ for _ in ()).throw(ImportError(name)) if name == "pynvml"
                        else real_import(name, *args))

    line = gpu_metrics_problem(gpu_present=True)

    assert line is not None and "\n" not in line and "nvidia-ml-py is not installed" in line


def test_a_gpu_whose_nvml_fails_says_so_and_one_that_starts_says_nothing(monkeypatch):
    class NVMLError(Exception):
        pass

    fake = types.SimpleNamespace(NVMLError=NVMLError, nvmlInit=lambda: (_ for _ in ()).throw(NVMLError("Driver Not Loaded")))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert gpu_metrics_problem(gpu_present=True) == "GPU system metrics off: NVML did not start (Driver Not Loaded)"

    fake.nvmlInit = lambda: None
    assert gpu_metrics_problem(gpu_present=True) is None
