"""The GPU path's acceptance: one command, at most about 5 minutes on one GPU, one JSON record.

Phases (CIFAR-shaped synthetic data, cifar_cnn, K=8, M=4, E=2, 2 rounds, fp32 with TF32 off):

1. determinism: every algorithm (FedAvg, FedProx, MOON, FedRS, SCAFFOLD, FedCME) with 1 and 4
   worker threads on the GPU, each twice: the four final models must be bit-identical, and within
   CPU_TOLERANCE (max |GPU - CPU| over every parameter) of the same run on the CPU;
2. kill and resume: a FedCME run in a child process, SIGKILLed once round 1 is committed,
   resumed here: its model must equal a straight run's bit for bit;
3. syncs per step: the training steps of every algorithm under ``torch.cuda.set_sync_debug_mode``
   ("warn"), the warnings counted per step (must be 0);
4. peak GPU memory of each phase (``torch.cuda.max_memory_allocated``);
5. ``bench/gpu.py`` (1 and 4 workers, fp32: its timed rounds only, with each variant's straggler,
   peak memory, layout, precision, TF32 and NVML utilisation of torch's device) and a 2-worker Dask
   run of ``fedcme train`` on the one GPU; both must exit 0.

Without a CUDA device it prints one line and exits with status 2. ``--dry-run`` runs what a CPU
can check (phases 1 and 2 on the CPU at the smallest sizes, 1 round; phase 3's counting is
tests/test_host_syncs.py's on the CPU) and writes the record with ``"dry_run": true``.

    .venv/bin/python bench/gpu_acceptance.py [--results PATH] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import common

ALGORITHMS = {"fedavg": {"name": "fedavg"}, "fedprox": {"name": "fedprox", "mu": 0.01},
              "moon": {"name": "moon", "mu": 1.0}, "fedrs": {"name": "fedrs", "alpha": 0.5},
              "scaffold": {"name": "scaffold"}, "fedcme": {"name": "fedcme", "mu": 0.1}}
WORKERS = (1, 4)
CPU_TOLERANCE = 1e-3  # fp32 on both, TF32 off: kernels differ in summation order only
REPO = Path(__file__).resolve().parents[1]


def config_values(algorithm: str, device: str, dry_run: bool, rounds: int | None = None) -> dict:
    synthetic = {"num_train": 160 if dry_run else 800, "num_test": 64 if dry_run else 200, "shape": [3, 32, 32]}
    values = common.experiment_values(data=common.data_section("synthetic", synthetic=synthetic), clients=8,
                                      per_round=4, epochs=2, rounds=rounds or (1 if dry_run else 2),
                                      model="cifar_cnn", algorithm=ALGORITHMS[algorithm], alpha=0.5)
    values["device"] = device
    values["training"].update(precision="fp32", channels_last=False)
    if algorithm == "moon":
        values.setdefault("model", {})["projection_dim"] = 16
    return values


def train(values: dict, run_dir: Path, workers: int) -> dict:
    """The final model's state (CPU tensors) of a run of `values` on `workers` threads."""
    from gpu import ThreadPoolRounds

    from fedcme_core.config.schema import config_from_dict
    from fedcme_core.rounds import final_model, run_experiment

    config = config_from_dict(values, "bench/gpu_acceptance.py")
    executor = ThreadPoolRounds(workers)
    try:
        run_experiment(config, run_dir, executor)
    finally:
        executor.pool.shutdown()
    return final_model(config, run_dir).state_dict()


def peak_mib(device: str) -> float | None:
    import torch

    if device != "cuda":
        return None
    peak = torch.cuda.max_memory_allocated() / 2**20
    torch.cuda.reset_peak_memory_stats()
    return round(peak, 1)


def determinism(device: str, dry_run: bool, folder: Path) -> dict:
    import torch

    results = {}
    for algorithm in ALGORITHMS:
        values = config_values(algorithm, device, dry_run)
        states = [train(values, folder / f"{algorithm}-w{workers}-{repeat}", workers)
                  for workers in WORKERS for repeat in range(2)]
        identical = all(torch.equal(states[0][key], state[key]) for state in states[1:] for key in states[0])
        cpu = train(config_values(algorithm, "cpu", dry_run), folder / f"{algorithm}-cpu", 1)
        difference = max((states[0][key].double() - cpu[key].double()).abs().max().item() for key in cpu)
        results[algorithm] = {"bit_identical": identical, "max_abs_vs_cpu": difference,
                              "within_tolerance": difference <= CPU_TOLERANCE, "peak_mib": peak_mib(device)}
    return results


CHILD = """
import json, sys
import torch
from fedcme_core.config.schema import config_from_dict
from fedcme_core.rounds import run_experiment
torch.set_num_threads(1)  # as the parent's: CPU bits depend on the thread count
run_experiment(config_from_dict(json.loads(sys.argv[1])), sys.argv[2])
"""


def kill_and_resume(device: str, dry_run: bool, folder: Path) -> dict:
    """A run killed after its first committed round, resumed, against a straight run."""
    import torch

    from fedcme_core.rounds import completed_rounds

    values = config_values("fedcme", device, dry_run, rounds=3)
    killed_dir = folder / "killed"
    child = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(values), str(killed_dir)], cwd=REPO)
    deadline = time.monotonic() + 240
    while child.poll() is None and time.monotonic() < deadline:
        if killed_dir.exists() and completed_rounds(killed_dir) >= 1:
            child.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    child.wait()
    rounds_at_kill = completed_rounds(killed_dir) if killed_dir.exists() else 0
    resumed = train(values, killed_dir, 1)
    straight = train(values, folder / "straight", 1)
    return {"killed": child.returncode == -signal.SIGKILL, "rounds_at_kill": rounds_at_kill,
            "bit_identical": all(torch.equal(resumed[key], straight[key]) for key in straight),
            "peak_mib": peak_mib(device)}


def syncs_per_step(device: str, folder: Path) -> dict:
    """Sync warnings per training step, per algorithm (CUDA's sync debug mode)."""
    import torch

    from fedcme_core.client import training

    counts: dict[str, list[int]] = {}
    real_step = training._train_step
    for algorithm in ALGORITHMS:
        per_step = counts.setdefault(algorithm, [])

        def counted(*args, **kwargs):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    return real_step(*args, **kwargs)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
                    per_step.append(len(caught))

        training._train_step = counted
        try:
            train(config_values(algorithm, device, False, rounds=1), folder / f"syncs-{algorithm}", 1)
        finally:
            training._train_step = real_step
    return {algorithm: {"steps": len(steps), "syncs": sum(steps)} for algorithm, steps in counts.items()}


def subprocess_record(command: list[str], timeout: float) -> dict:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return {"returncode": done.returncode, "seconds": round(time.perf_counter() - started, 1),
            "records": [json.loads(line) for line in lines],
            "stderr_tail": done.stderr.strip().splitlines()[-1:] if done.returncode else []}


def gpu_bench(folder: Path) -> dict:
    return subprocess_record([sys.executable, "bench/gpu.py", "--workers", "1,4", "--precision", "fp32",
                              "--results", str(folder / "gpu.jsonl")], timeout=150)


def dask_run(folder: Path) -> dict:
    """`fedcme train` with a 2-worker LocalCluster on the one GPU (fedcme, 2 rounds)."""
    config = folder / "dask.json"
    config.write_text(json.dumps(config_values("fedcme", "cuda", False)))
    return subprocess_record([sys.executable, "-m", "flows.cli", "train", "--config", str(config),
                              "--experiment", "dask-gpu", "--runs-dir", str(folder / "runs"),
                              "--set", "runner.kind=dask", "--set", "runner.workers=2",
                              "--set", "runner.threads_per_worker=1", "--set", "tracking.system_metrics=false"],
                             timeout=120)


def passed(record: dict) -> bool:
    phases = record["determinism"].values()
    ok = all(phase["bit_identical"] and phase["within_tolerance"] for phase in phases)
    ok = ok and record["resume"]["bit_identical"]
    ok = ok and all(record[key]["returncode"] == 0 for key in ("gpu_bench", "dask") if key in record)
    if record["syncs_per_step"] is not None:
        ok = ok and all(counts["syncs"] == 0 for counts in record["syncs_per_step"].values())
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--results", default=str(common.RESULTS), help="JSON lines file to append the record to")
    parser.add_argument("--dry-run", action="store_true", help="the CPU-checkable phases, on the CPU, smallest sizes")
    arguments = parser.parse_args()
    common.quiet_environment()
    import torch

    if not arguments.dry_run and not torch.cuda.is_available():
        print("bench/gpu_acceptance.py: no CUDA device here (torch.cuda.is_available() is False); "
              "nothing checked (--dry-run checks the CPU parts)", file=sys.stderr)
        return 2
    device = "cpu" if arguments.dry_run else "cuda"
    torch.set_num_threads(1)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fedcme-gpu-acceptance-") as temporary:
        folder = Path(temporary)
        record = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "dry_run": arguments.dry_run,
                  "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "cpu_tolerance": CPU_TOLERANCE,
                  "determinism": determinism(device, arguments.dry_run, folder),
                  "resume": kill_and_resume(device, arguments.dry_run, folder),
                  "syncs_per_step": None if device == "cpu" else syncs_per_step(device, folder)}
        if device == "cuda":
            from fedcme_core.client.device_flags import device_record

            record.update(flags=device_record(torch.device("cuda"), "fp32"), gpu_bench=gpu_bench(folder),
                          dask=dask_run(folder))
    record.update(passed=passed(record), seconds=round(time.perf_counter() - started, 1))
    common.emit("gpu_acceptance", record, arguments.results, quick=arguments.dry_run)
    return 0 if record["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
