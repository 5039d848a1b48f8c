"""One GPU, several clients at once: samples/s, GPU utilisation and round time for 1, 4 and 16 concurrent clients.

Workload (full mode, at most about 5 minutes on one GPU): FedAvg on CIFAR-10 (cifar_cnn, the
offline mirror; synthetic data of the same shape without it), K=M=16, alpha 0.5, E=2, batch 64,
3 rounds, ``device: cuda`` with the precision of ``--precision`` (bf16 autocast by default).
Each variant trains the same partition and clients with 1, 4 or 16 worker threads, each thread
one client at a time on its own CUDA stream (fedcme_core/rounds/device.py), the training set
copied to the GPU once. The round loop is the project's (``fedcme_core.rounds.run_experiment``)
with a thread pool for the phase's clients in place of Prefect's task runner, so that the
figures are the GPU's, not the orchestration's. Reported per variant: the median round time of
rounds 2..3 (round 1 pays the first allocations and kernels), samples/s (local-training samples
of a round / its time) and the mean GPU utilisation over the timed rounds (``nvidia-smi``,
sampled every 0.25 s; null where it is missing).

Without a CUDA device it says so in one line and exits with status 2. Quick mode (checks the
script works, on the CPU too): synthetic data, K=M=4, E=2, 2 rounds, 1 and 2 workers.

    .venv/bin/python bench/gpu.py [--workers 1,4,16] [--precision bf16|fp32] [--quick]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import common

DEFAULT_WORKERS = (1, 4, 16)


class ThreadPoolRounds:
    """The round's steps in this process; the clients of a phase on `workers` threads."""

    def __init__(self, workers: int) -> None:
        self.pool = ThreadPoolExecutor(max_workers=workers)

    def call(self, step, function, *args):
        return function(*args)

    def map(self, step, function, arguments, retries=0, costs=None):
        import torch

        def one(args):
            torch.set_num_threads(1)
            return function(*args)

        return list(self.pool.map(one, arguments))


class UtilisationSampler:
    """Mean `nvidia-smi` GPU utilisation (%) while running; None without nvidia-smi."""

    def __init__(self, index: int) -> None:
        self.index, self.samples, self.stop = index, [], threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        command = ["nvidia-smi", f"--id={self.index}", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
        while not self.stop.wait(0.25):
            try:
                self.samples.append(float(subprocess.run(command, capture_output=True, text=True,
                                                         timeout=5).stdout.strip()))
            except (OSError, ValueError, subprocess.TimeoutExpired):
                return

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()

    @property
    def mean(self) -> float | None:
        return round(sum(self.samples) / len(self.samples), 1) if self.samples else None


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


def measure(values: dict, workers: int) -> dict:
    from fedcme_core.config.schema import config_from_dict
    from fedcme_core.rounds import run_experiment

    config = config_from_dict(values, "bench/gpu.py")
    records: list[dict] = []
    executor = ThreadPoolRounds(workers)
    with tempfile.TemporaryDirectory(prefix="fedcme-bench-gpu-") as run_dir, UtilisationSampler(0) as sampler:
        started = time.perf_counter()
        try:
            run_experiment(config, run_dir, executor, on_round=records.append)
        finally:
            executor.pool.shutdown()
        wall = time.perf_counter() - started
    timed = records[1:] or records
    seconds = common.median([record["round_seconds"] for record in timed])
    samples = common.median([record["samples_trained"] for record in timed])
    return {"workers": workers, "round_seconds": round(seconds, 3), "samples_per_second": round(samples / seconds, 1),
            "gpu_utilisation_percent": sampler.mean, "wall_seconds": round(wall, 2), "rounds": len(records)}


def main() -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--workers", default=",".join(map(str, DEFAULT_WORKERS)), help="concurrent clients per variant")
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    arguments = parser.parse_args()
    common.quiet_environment()
    import torch

    if not torch.cuda.is_available() and not arguments.quick:
        print("bench/gpu.py: no CUDA device here (torch.cuda.is_available() is False); nothing measured", file=sys.stderr)
        return 2
    device = "cuda" if torch.cuda.is_available() else "cpu"
    workers = [int(value) for value in arguments.workers.split(",")] if not arguments.quick else [1, 2]
    values = config_values(arguments.quick, device, arguments.precision if device == "cuda" else "fp32")
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    for count in workers:
        record = {"device": name, "precision": values["training"]["precision"], **measure(values, count)}
        common.emit("gpu", record, arguments.results, quick=arguments.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
