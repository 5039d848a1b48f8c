"""One GPU, several clients at once: round time, its straggler, samples/s, GPU utilisation and peak
memory for 1, 4 and 16 concurrent clients.

Workload (full mode, at most about 5 minutes on one GPU): FedAvg on CIFAR-10 (cifar_cnn, the
offline mirror; synthetic data of the same shape without it, and the record says so), K=M=16,
alpha 0.5, E=2, batch 64, 3 rounds, ``device: cuda`` with the precision of ``--precision`` (bf16
autocast by default) and the layout the run's calibration picks. Each variant trains the same
partition and clients with 1, 4 or 16 worker threads, each thread one client at a time on its own
CUDA stream (fedcme_core/rounds/device.py), the training set copied to the GPU once. The round
loop is the project's (``fedcme_core.rounds.run_experiment``) with a thread pool for the phase's
clients in place of Prefect's task runner, so that the figures are the GPU's, not the
orchestration's.

Only the timed rounds (2..T) are measured: round 1 pays the run's setup, the layout calibration,
the first allocations and kernels. Per variant the record holds (medians over the timed rounds):

- ``round_seconds``, ``training_seconds`` (the training phase: its clients, run at once) and
  ``straggler_seconds`` (the slowest client's own time in that phase), with ``straggler_share`` =
  straggler / training (near 1: the phase waited on one client, so more workers cannot help) and
  ``concurrency`` = the clients' summed time / training (how many trained at once, on average;
  below 1 with one worker by the phase's time outside training: loading, checkpoints, uploads);
  ``largest_client_share``: the largest client's share of the round's samples (the phase lasts
  at least that client's time); ``timed``: each timed round's figures, its straggler's id and size;
- ``samples_per_second`` (the round's local-training samples / its time) and, beside a 1-worker
  variant measured first, ``speedup_vs_1_worker`` (its round time / this one's);
- ``gpu_utilisation_percent``: NVML's utilisation of torch's device, sampled every SAMPLE_SECONDS
  over the timed rounds only. The NVML device is found by the PCI bus id of
  ``torch.cuda.get_device_properties`` and checked against its UUID (so ``CUDA_VISIBLE_DEVICES``
  and CUDA's device order are honoured); null, with ``utilisation_note`` saying why, where NVML
  cannot tell;
- ``peak_allocated_mib`` / ``peak_reserved_mib``: ``torch.cuda.max_memory_allocated`` /
  ``max_memory_reserved`` over the timed rounds (null on the CPU);
- ``layout``, ``precision``, ``compute_chosen_by`` and ``tf32`` (the run's ``compute.json``),
  ``data`` (``real`` | ``synthetic``), the workload (``common.describe``) and ``gpu`` (torch's index,
  name, capability, driver, PCI bus id, UUID, CUDA_VISIBLE_DEVICES).

Without a CUDA device it says so in one line and exits with status 2. Quick mode (checks the
script works, on the CPU too): synthetic data, K=M=4, E=2, 2 rounds, 1 and 2 workers.

    .venv/bin/python bench/gpu.py [--workers 1,4,16] [--precision bf16|fp32|tf32] [--quick]
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import common

DEFAULT_WORKERS = (1, 4, 16)
SAMPLE_SECONDS = 0.25  # NVML utilisation sampling interval


class ThreadPoolRounds:
    """The round's steps in this process; the clients of a phase on `workers` threads. `clients`
    collects the training steps' results as dicts (client, phase, seconds, work_seconds, samples)."""

    def __init__(self, workers: int) -> None:
        self.pool = ThreadPoolExecutor(max_workers=workers)
        self.clients: list[dict[str, Any]] = []

    def call(self, step, function, *args):
        return function(*args)

    def map(self, step, function, arguments, retries=0, costs=None):
        import torch

        from fedcme_core.server.faults import StepFailure

        def one(args):
            torch.set_num_threads(1)
            return function(*args)

        results = list(self.pool.map(one, arguments))
        if step == "train_phase":
            self.clients += [dataclasses.asdict(result) if dataclasses.is_dataclass(result) else dict(result)
                             for result in results if not isinstance(result, StepFailure)]
        return results

    def take_clients(self) -> list[dict[str, Any]]:
        """The training summaries collected since the last call."""
        taken, self.clients = self.clients, []
        return taken


# ------------------------------------------------------------------------------ timing
def round_timing(record: Mapping[str, Any], clients: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One round's figures from its record (``RoundRecord.to_dict``) and its clients' training
    summaries: round and training-phase seconds, the straggler's seconds (the record's
    ``critical_client_seconds``: the slowest client of each phase, summed over the phases), its id
    and samples (the client whose own time over the round is the longest), the clients' summed time
    and the largest client's share of the round's samples."""
    from fedcme_core.results.records import phase_seconds

    training = sum(phase_seconds(record))
    per_client: dict[int, dict[str, float]] = {}
    for summary in clients:
        entry = per_client.setdefault(int(summary["client"]), {"seconds": 0.0, "samples": 0})
        entry["seconds"] += summary["work_seconds"]
        entry["samples"] += summary["samples"]
    slowest = max(per_client, key=lambda client: (per_client[client]["seconds"], -client))
    samples = sum(entry["samples"] for entry in per_client.values())
    return {"round": record["round"] + 1, "round_seconds": record["round_seconds"], "training_seconds": training,
            "straggler_seconds": record["critical_client_seconds"], "straggler_client": slowest,
            "straggler_samples": per_client[slowest]["samples"], "client_seconds": record["client_work_seconds"],
            "largest_client_share": max(entry["samples"] for entry in per_client.values()) / samples,
            "samples": record["samples_trained"]}


def timing_summary(rounds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Medians over the timed rounds (``round_timing`` dicts) of round, training and straggler
    seconds and samples/s, with straggler_share = straggler / training, concurrency = clients'
    summed time / training and the largest client's share of the samples."""
    median = common.median
    seconds = median([r["round_seconds"] for r in rounds])
    training = median([r["training_seconds"] for r in rounds])
    straggler = median([r["straggler_seconds"] for r in rounds])
    return {"round_seconds": round(seconds, 3), "training_seconds": round(training, 3),
            "straggler_seconds": round(straggler, 3), "straggler_share": common.ratio(straggler, training),
            "concurrency": common.ratio(median([r["client_seconds"] for r in rounds]), training),
            "largest_client_share": round(median([r["largest_client_share"] for r in rounds]), 3),
            "samples_per_second": round(median([r["samples"] for r in rounds]) / seconds, 1),
            "timed": [{key: round(value, 3) if isinstance(value, float) else value for key, value in r.items()}
                      for r in rounds]}


# ------------------------------------------------------------------------ which GPU
def nvml_bus_id(properties) -> str:
    """The PCI bus id of a device (``torch.cuda.get_device_properties``) as NVML and nvidia-smi
    write it: domain:bus:device.function, "00000000:65:00.0"."""
    return f"{properties.pci_domain_id:08X}:{properties.pci_bus_id:02X}:{properties.pci_device_id:02X}.0"


def nvml_uuid(properties) -> str:
    """The device's UUID as NVML writes it ("GPU-" and torch's 8-4-4-4-12 hex)."""
    return f"GPU-{str(properties.uuid).lower()}"


def gpu_identity(index: int) -> dict[str, Any]:
    """Torch's device `index` (after CUDA_VISIBLE_DEVICES): ``device_flags.gpu_identity`` with its
    PCI bus id and UUID."""
    import torch

    from fedcme_core.client.device_flags import gpu_identity as identity

    properties = torch.cuda.get_device_properties(index)
    return {**identity(torch.device("cuda", index)), "pci_bus_id": nvml_bus_id(properties),
            "uuid": nvml_uuid(properties)}


class UtilisationSampler:
    """Mean NVML GPU utilisation (%) between :meth:`start` and :meth:`stop`, every `interval` s.

    `read` returns one reading; :meth:`for_device` makes it for torch's device. A reading that
    fails ends the sampling (the mean is then over the readings before)."""

    def __init__(self, read: Callable[[], float] | None, interval: float = SAMPLE_SECONDS, note: str | None = None):
        self.read, self.interval, self.note = read, interval, note
        self.samples: list[float] = []
        self.halt = threading.Event()
        self.thread: threading.Thread | None = None

    @classmethod
    def for_device(cls, properties, nvml=None) -> UtilisationSampler:
        """A sampler of the GPU torch describes by `properties`, found in NVML (`nvml`: the pynvml
        module, imported where None) by its PCI bus id, else by its UUID, and checked against the UUID;
        one that cannot read it holds a note why."""
        try:
            if nvml is None:
                import pynvml as nvml
            nvml.nvmlInit()
            try:
                handle = nvml.nvmlDeviceGetHandleByPciBusId(nvml_bus_id(properties))
            except Exception:  # noqa: BLE001 - a bus id NVML does not know (a container's): by UUID
                handle = nvml.nvmlDeviceGetHandleByUUID(nvml_uuid(properties))
            found = nvml.nvmlDeviceGetUUID(handle)
            found = found.decode() if isinstance(found, bytes) else str(found)
        except Exception as error:  # noqa: BLE001 - ImportError or any NVMLError: no reading, say why
            return cls(None, note=f"NVML unavailable: {type(error).__name__}: {error}")
        if found.lower() != nvml_uuid(properties).lower():
            return cls(None, note=f"NVML's device at {nvml_bus_id(properties)} is {found}, torch's is "
                                  f"{nvml_uuid(properties)} (a MIG instance?)")
        return cls(lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))

    def _sample(self) -> None:
        while not self.halt.wait(self.interval):
            try:
                self.samples.append(self.read())
            except Exception as error:  # noqa: BLE001 - NVML errors: stop sampling, keep the readings
                self.note = f"sampling stopped: {type(error).__name__}: {error}"
                return

    def start(self) -> None:
        if self.read is not None and self.thread is None:
            self.thread = threading.Thread(target=self._sample, daemon=True)
            self.thread.start()

    def stop(self) -> None:
        self.halt.set()
        if self.thread is not None:
            self.thread.join()

    @property
    def mean(self) -> float | None:
        return round(sum(self.samples) / len(self.samples), 1) if self.samples else None


# ----------------------------------------------------------------------------- runs
def config_values(quick: bool, device: str, precision: str) -> dict:
    if quick:
        data = common.data_section("synthetic", synthetic={"num_train": 200, "num_test": 100, "shape": [3, 32, 32]})
        values = common.experiment_values(data=data, clients=4, per_round=4, epochs=2, rounds=2, model="cifar_cnn",
                                          algorithm={"name": "fedavg"}, alpha=0.5)
    else:
        values = common.experiment_values(data=common.data_section("cifar10"), clients=16, per_round=16, epochs=2,
                                          rounds=3, model="cifar_cnn", algorithm={"name": "fedavg"}, alpha=0.5)
    values["device"] = device
    values["training"]["precision"] = precision
    return values


def measure(values: dict, workers: int, index: int | None) -> dict:
    """One variant: the run of `values` with `workers` threads on torch's CUDA device `index` (None:
    the CPU); rounds 2.. timed, utilisation and peak memory over them only."""
    import torch

    from fedcme_core.config.schema import config_from_dict
    from fedcme_core.rounds import run_experiment
    from fedcme_core.rounds.run_record import run_compute_choice

    config = config_from_dict(values, "bench/gpu.py")
    executor = ThreadPoolRounds(workers)
    if index is None:
        sampler = UtilisationSampler(None, note="no CUDA device")
    else:
        sampler = UtilisationSampler.for_device(torch.cuda.get_device_properties(index))
    timed: list[dict[str, Any]] = []
    memory: dict[str, float | None] = {"peak_allocated_mib": None, "peak_reserved_mib": None}
    done = 0

    def on_round(record: dict[str, Any]) -> None:
        nonlocal done
        done += 1
        clients = executor.take_clients()
        if done > 1:
            timed.append(round_timing(record, clients))
        if done == 1 and index is not None:  # the timed rounds start now
            torch.cuda.synchronize(index)
            torch.cuda.reset_peak_memory_stats(index)
        if done == 1:
            sampler.start()
        if done == config.federation.rounds:
            sampler.stop()
            if index is not None:
                memory.update(peak_allocated_mib=round(torch.cuda.max_memory_allocated(index) / 2**20, 1),
                              peak_reserved_mib=round(torch.cuda.max_memory_reserved(index) / 2**20, 1))

    with tempfile.TemporaryDirectory(prefix="fedcme-bench-gpu-") as run_dir:
        started = time.perf_counter()
        try:
            run_experiment(config, run_dir, executor, on_round=on_round)
        finally:
            sampler.stop()
            executor.pool.shutdown()
        wall = time.perf_counter() - started
        choice = run_compute_choice(run_dir)
    record = {"workers": workers, "rounds": done, **timing_summary(timed),
              "gpu_utilisation_percent": sampler.mean, "utilisation_samples": len(sampler.samples), **memory,
              "layout": "channels_last" if choice.compute.channels_last else "nchw",
              "precision": choice.compute.precision, "compute_chosen_by": choice.chosen_by,
              "tf32": bool(choice.device.get("tf32", False)), "wall_seconds": round(wall, 2)}
    if sampler.note:
        record["utilisation_note"] = sampler.note
    return record


def main() -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--workers", default=",".join(map(str, DEFAULT_WORKERS)), help="concurrent clients per variant")
    parser.add_argument("--precision", choices=("bf16", "fp32", "tf32"), default="bf16")
    arguments = parser.parse_args()
    common.quiet_environment()
    import torch

    if not torch.cuda.is_available() and not arguments.quick:
        print("bench/gpu.py: no CUDA device here (torch.cuda.is_available() is False); nothing measured", file=sys.stderr)
        return 2
    index = torch.cuda.current_device() if torch.cuda.is_available() else None  # what `device: cuda` trains on
    workers = [int(value) for value in arguments.workers.split(",")] if not arguments.quick else [1, 2]
    values = config_values(arguments.quick, "cpu" if index is None else "cuda",
                           "fp32" if index is None else arguments.precision)
    from fedcme_core.config.schema import config_from_dict

    described = common.describe(config_from_dict(values, "bench/gpu.py"))
    about = {"device": "cpu" if index is None else torch.cuda.get_device_name(index),
             "gpu": None if index is None else gpu_identity(index),
             "data": "synthetic" if values["data"]["dataset"] == "synthetic" else "real", **described}
    single: float | None = None
    for count in workers:
        record = {**about, **measure(values, count, index)}
        if count == 1:
            single = record["round_seconds"]
        elif single is not None:
            record["speedup_vs_1_worker"] = common.ratio(single, record["round_seconds"])
        common.emit("gpu", record, arguments.results, quick=arguments.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
