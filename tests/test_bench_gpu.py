"""bench/gpu.py's CPU-checkable parts: the NVML device named by torch's PCI bus id and UUID, the
utilisation sampled over the timed rounds only, each round's straggler, and the quick run's record
(layout, precision, TF32, data, peak memory) on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from .conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))
try:
    import gpu
finally:
    sys.path.remove(str(REPO_ROOT / "bench"))

PROPERTIES = SimpleNamespace(pci_domain_id=0, pci_bus_id=0x65, pci_device_id=0x1F,
                             uuid="0AB1c2d3-0000-1111-2222-333344445555")


def test_the_nvml_device_is_named_by_torchs_pci_bus_id_and_uuid():
    assert gpu.nvml_bus_id(PROPERTIES) == "00000000:65:1F.0"
    assert gpu.nvml_uuid(PROPERTIES) == "GPU-0ab1c2d3-0000-1111-2222-333344445555"


class FakeNvml:
    """pynvml's calls that the sampler makes, on one device at one PCI bus id."""

    def __init__(self, uuid: str, utilisation: float = 70.0, fail: Exception | None = None,
                 bus_ids: tuple[str, ...] | None = None) -> None:
        self.uuid, self.utilisation, self.fail, self.looked_up, self.reads = uuid, utilisation, fail, [], 0
        self.bus_ids = bus_ids  # None: any bus id is found

    def nvmlInit(self):
        if self.fail:
            raise self.fail

    def nvmlDeviceGetHandleByPciBusId(self, bus_id):
        self.looked_up.append(bus_id)
        if self.bus_ids is not None and bus_id not in self.bus_ids:
            raise RuntimeError("NVML: not found")
        return "handle"

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.looked_up.append(uuid)
        if uuid.lower() != self.uuid.lower():
            raise RuntimeError("NVML: not found")
        return "handle"

    def nvmlDeviceGetUUID(self, handle):
        return self.uuid.encode()

    def nvmlDeviceGetUtilizationRates(self, handle):
        self.reads += 1
        return SimpleNamespace(gpu=self.utilisation)


def wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    return condition()


def test_the_sampler_reads_the_device_at_torchs_bus_id_and_only_between_start_and_stop():
    nvml = FakeNvml("GPU-0AB1C2D3-0000-1111-2222-333344445555", utilisation=70.0)
    sampler = gpu.UtilisationSampler.for_device(PROPERTIES, nvml)
    sampler.interval = 0.005
    time.sleep(0.05)
    assert nvml.looked_up == ["00000000:65:1F.0"] and nvml.reads == 0 and sampler.mean is None  # not started

    sampler.start()
    assert wait_for(lambda: len(sampler.samples) >= 2)
    sampler.stop()
    reads = nvml.reads
    time.sleep(0.05)

    assert nvml.reads == reads and sampler.mean == 70.0 and sampler.note is None


def test_a_bus_id_nvml_does_not_know_falls_back_to_torchs_uuid():
    nvml = FakeNvml("GPU-0AB1C2D3-0000-1111-2222-333344445555", bus_ids=())

    sampler = gpu.UtilisationSampler.for_device(PROPERTIES, nvml)

    assert nvml.looked_up == ["00000000:65:1F.0", "GPU-0ab1c2d3-0000-1111-2222-333344445555"]
    assert sampler.read is not None and sampler.read() == 70.0 and sampler.note is None


def test_a_device_nvml_cannot_match_or_reach_gives_no_reading_and_says_why():
    other = gpu.UtilisationSampler.for_device(PROPERTIES, FakeNvml("GPU-ffffffff-0000-1111-2222-333344445555"))
    broken = gpu.UtilisationSampler.for_device(PROPERTIES, FakeNvml("", fail=RuntimeError("driver not loaded")))

    for sampler in (other, broken):
        sampler.start()
        sampler.stop()
        assert sampler.read is None and sampler.mean is None
    assert "GPU-ffffffff" in other.note and "GPU-0ab1c2d3" in other.note and "00000000:65:1F.0" in other.note
    assert broken.note == "NVML unavailable: RuntimeError: driver not loaded"


def round_record(round_index, round_seconds, phase, critical, work, samples):
    return {"round": round_index, "round_seconds": round_seconds, "phase_seconds": [phase],
            "critical_client_seconds": critical, "client_work_seconds": work, "samples_trained": samples}


CLIENTS = [{"client": 0, "phase": 0, "seconds": 1.0, "work_seconds": 1.0, "samples": 100},
           {"client": 2, "phase": 0, "seconds": 3.0, "work_seconds": 3.0, "samples": 300},
           {"client": 1, "phase": 0, "seconds": 1.5, "work_seconds": 1.5, "samples": 100}]


def test_a_rounds_straggler_is_its_slowest_client_with_its_share_of_the_samples():
    timing = gpu.round_timing(round_record(1, 4.0, 3.2, 3.0, 5.5, 500), CLIENTS)

    assert timing == {"round": 2, "round_seconds": 4.0, "training_seconds": 3.2, "straggler_seconds": 3.0,
                      "straggler_client": 2, "straggler_samples": 300, "client_seconds": 5.5,
                      "largest_client_share": 0.6, "samples": 500}


def test_the_summary_is_the_median_of_the_timed_rounds_with_the_straggler_share():
    rounds = [gpu.round_timing(round_record(1, 4.0, 3.2, 3.0, 5.5, 500), CLIENTS),
              gpu.round_timing(round_record(2, 6.0, 4.0, 3.6, 6.0, 500), CLIENTS),
              gpu.round_timing(round_record(3, 5.0, 3.6, 3.4, 5.4, 500), CLIENTS)]

    summary = gpu.timing_summary(rounds)

    # Medians: round 5.0 s, training 3.6 s, straggler 3.4 s, clients' sum 5.5 s.
    assert summary["round_seconds"] == 5.0 and summary["training_seconds"] == 3.6
    assert summary["straggler_seconds"] == 3.4 and summary["straggler_share"] == 0.944  # 3.4 / 3.6
    assert summary["concurrency"] == 1.528  # 5.5 / 3.6
    assert summary["samples_per_second"] == 100.0 and summary["largest_client_share"] == 0.6
    assert [entry["round"] for entry in summary["timed"]] == [2, 3, 4]


def test_the_sampler_runs_over_the_timed_rounds_only(monkeypatch):
    events = []

    class Recorder:
        def __init__(self, *args, **kwargs):
            self.samples, self.note, self.mean = [], None, None

        def start(self):
            events.append("start")

        def stop(self):
            events.append("stop")

    real_take = gpu.ThreadPoolRounds.take_clients

    def take(self):
        events.append("round")  # on_round takes a committed round's clients first
        return real_take(self)

    monkeypatch.setattr(gpu, "UtilisationSampler", Recorder)
    monkeypatch.setattr(gpu.ThreadPoolRounds, "take_clients", take)
    values = gpu.config_values(True, "cpu", "fp32")
    values["federation"]["rounds"] = 3

    record = gpu.measure(values, 2, None)

    # Started once round 1 is committed, stopped once the last is (and again, harmlessly, on exit).
    assert events == ["round", "start", "round", "round", "stop", "stop"]
    assert record["rounds"] == 3 and [entry["round"] for entry in record["timed"]] == [2, 3]


@pytest.mark.slow  # two 2-round runs in a fresh interpreter: about 10 s
def test_the_quick_run_on_the_cpu_records_what_the_gpu_run_records(tmp_path):
    results = tmp_path / "gpu.jsonl"
    done = subprocess.run([sys.executable, "bench/gpu.py", "--quick", "--results", str(results)], cwd=REPO_ROOT,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True, timeout=300)

    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert [record["workers"] for record in records] == [1, 2]
    for record in records:
        assert record["data"] == "synthetic" and record["dataset"] == "synthetic" and record["K"] == 4
        assert record["device"] == "cpu" and record["gpu"] is None
        assert record["layout"] in ("nchw", "channels_last") and record["precision"] == "fp32"
        assert record["tf32"] is False and record["compute_chosen_by"] in ("calibration", "machine cache", "config")
        assert record["peak_allocated_mib"] is None and record["gpu_utilisation_percent"] is None
        assert record["utilisation_note"] == "no CUDA device"
        assert record["rounds"] == 2 and [entry["round"] for entry in record["timed"]] == [2]
        (timed,) = record["timed"]
        assert 0 < timed["straggler_seconds"] <= timed["training_seconds"] <= timed["round_seconds"]
        assert timed["straggler_client"] in range(4) and timed["samples"] == 400  # 200 samples x E=2
        assert record["samples_per_second"] == pytest.approx(400 / record["round_seconds"], rel=0.01)
    assert "speedup_vs_1_worker" not in records[0] and records[1]["speedup_vs_1_worker"] > 0


def test_on_a_gpu_peak_memory_is_reset_after_round_one_and_read_after_the_last(monkeypatch):
    import torch

    calls = []
    fake = {"synchronize": lambda index: calls.append(("synchronize", index)),
            "reset_peak_memory_stats": lambda index: calls.append(("reset", index)),
            "max_memory_allocated": lambda index: calls.append(("allocated", index)) or 3 * 2**20,
            "max_memory_reserved": lambda index: calls.append(("reserved", index)) or 5 * 2**20,
            "get_device_properties": lambda index: calls.append(("properties", index)) or PROPERTIES}
    for name, function in fake.items():
        assert callable(getattr(torch.cuda, name))  # the real API has it
        monkeypatch.setattr(torch.cuda, name, function)
    nvml = FakeNvml("GPU-0ab1c2d3-0000-1111-2222-333344445555")
    monkeypatch.setattr(gpu.UtilisationSampler, "for_device",
                        classmethod(lambda cls, properties: cls(lambda: float(nvml.reads), interval=0.001)))
    real_take = gpu.ThreadPoolRounds.take_clients
    monkeypatch.setattr(gpu.ThreadPoolRounds, "take_clients", lambda self: calls.append("round") or real_take(self))
    values = gpu.config_values(True, "cpu", "fp32")  # the CPU trains; index 1 stands for torch's cuda:1
    values["federation"]["rounds"] = 3

    record = gpu.measure(values, 2, 1)

    assert calls == [("properties", 1), "round", ("synchronize", 1), ("reset", 1), "round", "round",
                     ("allocated", 1), ("reserved", 1)]
    assert record["peak_allocated_mib"] == 3.0 and record["peak_reserved_mib"] == 5.0
    assert record["gpu_utilisation_percent"] is not None and "utilisation_note" not in record
