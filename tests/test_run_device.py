"""The resolved device is recorded with the run (compute.json) and used by every step, and a resume on
another device is refused in one line naming both, unless the change is allowed."""

from __future__ import annotations

import json

import pytest
import torch

from fedcme_core.client.compute import Compute, ComputeChoice
from fedcme_core.rounds import RunPaths, run_experiment
from fedcme_core.rounds.run_record import device_change, run_device, write_compute_choice
from fedcme_core.rounds.store import RunError


def recorded(tmp_path, device: dict) -> str:
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True)
    write_compute_choice(run_dir, ComputeChoice(Compute(), "config", device=device))
    return str(run_dir)


def test_a_run_records_the_device_it_resolved(tmp_path, synthetic_config):
    config = synthetic_config({"federation.rounds": 1})  # device: auto
    run_experiment(config, tmp_path / "run")

    recorded_device = json.loads(RunPaths(tmp_path / "run").compute.read_text())["device"]
    assert recorded_device["type"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert run_device(config, tmp_path / "run").type == recorded_device["type"]


def test_every_step_takes_the_recorded_device_and_a_worker_without_the_gpu_says_so(tmp_path, synthetic_config,
                                                                                  monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = synthetic_config({})
    assert run_device(config, recorded(tmp_path, {"type": "cpu"})) == torch.device("cpu")
    with pytest.raises(RunError, match="the run trains on cuda, and this process sees no CUDA device"):
        run_device(config, recorded(tmp_path / "gpu", {"type": "cuda", "name": "NVIDIA H100"}))


def test_a_record_without_a_device_resolves_the_config(tmp_path, synthetic_config):
    assert run_device(synthetic_config({"device": "cpu"}), recorded(tmp_path, {})) == torch.device("cpu")
    assert device_change(recorded(tmp_path / "old", {}), torch.device("cpu")) is None


def test_resuming_on_another_device_is_one_line_naming_both_unless_allowed(tmp_path):
    gpu_run = recorded(tmp_path, {"type": "cuda", "name": "NVIDIA H100 80GB HBM3"})

    assert device_change(recorded(tmp_path / "cpu", {"type": "cpu"}), torch.device("cpu")) is None
    with pytest.raises(RunError) as refused:
        device_change(gpu_run, torch.device("cpu"))
    line = str(refused.value)
    assert "\n" not in line and "trained on cuda (NVIDIA H100 80GB HBM3)" in line and "resolves device to cpu" in line
    assert "--allow-device-change" in line
    allowed = device_change(gpu_run, torch.device("cpu"), allow_change=True)
    assert allowed is not None and "trained on cuda (NVIDIA H100 80GB HBM3)" in allowed


def test_reopening_a_run_on_another_device_is_refused_before_anything_changes(tmp_path, synthetic_config):
    from fedcme_core import rounds

    config = synthetic_config({"device": "cpu"})
    run_dir = tmp_path / "run"
    rounds.prepare_run(config, run_dir)
    paths = RunPaths(run_dir)
    record = json.loads(paths.compute.read_text())
    record["device"] = {"type": "cuda", "name": "NVIDIA H100 80GB HBM3"}  # as if it had trained on a GPU
    paths.compute.write_text(json.dumps(record))
    before = paths.compute.read_bytes()

    with pytest.raises(RunError, match=r"trained on cuda \(NVIDIA H100 80GB HBM3\), this machine resolves device to cpu"):
        rounds.prepare_run(config, run_dir)
    assert paths.compute.read_bytes() == before

    assert rounds.prepare_run(config, run_dir, allow_device_change=True).completed_rounds == 0
    assert json.loads(paths.compute.read_text())["device"]["type"] == "cpu"  # calibrated anew for the CPU
