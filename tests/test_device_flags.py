"""The GPU path's process flags and what is recorded of them, checked on the CPU with fakes where CUDA
is needed: native bf16 on the given GPU without emulation, configure_device's determinism and TF32
flags, the explicit tf32 precision, and the device's section of compute.json and its MLflow tags."""

from __future__ import annotations

import contextlib
import json
import os

import pytest
import torch

from fedcme_core.client import compute as compute_module
from fedcme_core.client import device_flags
from fedcme_core.client.compute import ComputeChoice, candidates, native_bf16, resolve
from fedcme_core.client.device_flags import configure_device

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.fixture(autouse=True)
def restored_flags(monkeypatch, tmp_path):
    """Every process-wide flag configure_device may set, put back after the test."""
    monkeypatch.setenv("FEDCME_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    saved = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
             torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.fp32_precision,
             torch.backends.cudnn.conv.fp32_precision, torch.backends.cudnn.rnn.fp32_precision)
    yield
    torch.use_deterministic_algorithms(saved[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[1], saved[2]
    torch.backends.cuda.matmul.fp32_precision = saved[3]
    torch.backends.cudnn.conv.fp32_precision, torch.backends.cudnn.rnn.fp32_precision = saved[4], saved[5]


def test_native_bf16_asks_the_given_gpu_without_counting_emulation(monkeypatch):
    current, asked = [0], []

    @contextlib.contextmanager
    def on_device(device):
        before, current[0] = current[0], torch.device(device).index
        yield
        current[0] = before

    def is_bf16_supported(including_emulation=True):
        asked.append((current[0], including_emulation))
        return current[0] == 1  # GPU 1 is an A100, GPU 0 a T4 (emulated bf16 only)

    monkeypatch.setattr(torch.cuda, "device", on_device)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)

    assert native_bf16(torch.device("cuda:1")) is True
    assert native_bf16(torch.device("cuda:0")) is False
    assert asked == [(1, False), (0, False)]


def test_configure_device_makes_cuda_deterministic_and_fp32_ieee():
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.conv.fp32_precision = "tf32"  # cuDNN's own default for convolutions

    flags = configure_device(CUDA, "fp32")

    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
    assert not torch.backends.cudnn.benchmark
    assert torch.backends.cuda.matmul.fp32_precision == torch.backends.cudnn.conv.fp32_precision == "ieee"
    assert flags == {"type": "cuda", "deterministic": True, "cudnn_deterministic": True, "cudnn_benchmark": False,
                     "tf32": False, "cublas_workspace_config": ":4096:8"}
    assert configure_device(CUDA, "bf16")["tf32"] is False
    assert configure_device(CUDA, "tf32")["tf32"] is True
    assert torch.backends.cuda.matmul.fp32_precision == torch.backends.cudnn.conv.fp32_precision == "tf32"


def test_configure_device_keeps_a_deterministic_workspace_and_replaces_another(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    assert configure_device(CUDA)["cublas_workspace_config"] == ":16:8"
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    assert configure_device(CUDA)["cublas_workspace_config"] == ":4096:8"


def test_configure_device_leaves_the_cpu_as_it_is():
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.conv.fp32_precision)

    assert configure_device(CPU, "fp32") == {"type": "cpu"}
    assert (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.conv.fp32_precision) == before
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_tf32_is_a_cuda_option_asked_for_explicitly(monkeypatch):
    from fedcme_core.config.schema import ConfigError, config_from_dict

    monkeypatch.setattr(compute_module, "native_bf16", lambda device: True)
    assert [option.name for option in candidates(False, "tf32", CUDA)] == ["nchw+tf32"]
    assert [option.name for option in candidates(False, "auto", CUDA)] == ["nchw+fp32", "nchw+bf16"]  # never auto
    with pytest.raises(ValueError, match="tf32 is TensorFloat-32 of CUDA GPUs"):
        candidates(False, "tf32", CPU)
    with pytest.raises(ConfigError, match="training.precision: tf32 is TensorFloat-32 of CUDA GPUs"):
        config_from_dict({"device": "cpu", "training": {"precision": "tf32"}})
    assert config_from_dict({"device": "cuda", "training": {"precision": "tf32"}}).training.precision == "tf32"


def test_the_choice_records_the_gpu_and_its_flags_in_compute_json_and_mlflow_tags(monkeypatch):
    monkeypatch.setattr(compute_module, "machine_name", lambda device: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(device_flags, "gpu_identity", lambda device: {
        "index": 0, "name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "driver": "550.54.15",
        "cuda_visible_devices": "3", "cuda": "13.0"})

    choice = resolve(False, "tf32", CUDA, "model|shape", step=None)  # fixed by the config: nothing trains
    recorded = ComputeChoice.from_json(json.loads(json.dumps(choice.to_json())))

    assert recorded.device["type"] == "cuda" and recorded.device["name"] == "NVIDIA H100 80GB HBM3"
    assert recorded.device["driver"] == "550.54.15" and recorded.device["tf32"] is True
    assert recorded.device["deterministic"] is True and recorded.device["cudnn_benchmark"] is False
    tags = recorded.tags()
    assert tags["device"] == "cuda" and tags["gpu_name"] == "NVIDIA H100 80GB HBM3" and tags["tf32"] == "true"
    assert tags["compute"] == "nchw+tf32" and tags["deterministic"] == "true"


def test_a_cpu_choice_records_the_cpu_and_an_old_record_reads_without_a_device():
    choice = resolve(False, "fp32", CPU, "model|shape", step=None)
    old = {key: value for key, value in choice.to_json().items() if key != "device"}

    assert choice.to_json()["device"] == {"type": "cpu"} and choice.tags()["device"] == "cpu"
    assert ComputeChoice.from_json(old).device == {} and "device" not in ComputeChoice.from_json(old).tags()


def test_the_driver_version_is_read_from_the_driver(tmp_path):
    version = tmp_path / "version"
    version.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
                       "GCC version:  gcc version 12.2.0\n")
    open_module = tmp_path / "open"
    open_module.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.10  Release Build\n")

    assert device_flags.driver_version(version) == "550.54.15"
    assert device_flags.driver_version(open_module) == "570.86.10"
    assert device_flags.driver_version(tmp_path / "missing") == "unknown"
