"""The whole round: `fedcme train` with today's defaults, against the old defaults and a bare
PyTorch loop, interleaved in one run.

Workloads (full mode): FedAvg on Fashion-MNIST (fmnist_cnn) and on CIFAR-10 (cifar_cnn), K=20,
M=10, E=2, alpha 0.1, batch 64, 5 rounds; every variant of a workload trains the same partition
(seed 0) and the same selected clients. Variants, run one after the other, `--repeats` times:

* ``defaults``: ``fedcme train`` with the config's defaults (``training.channels_last: auto``,
  ``training.precision: auto``; the run's calibration chooses both);
* ``old``:      ``fedcme train`` with ``channels_last: false, precision: fp32`` (the defaults
  before fedcme_core/client/compute.py);
* ``bare``:     one process, 2 torch threads, no orchestration or tracking: per round, each
  selected client trains E epochs from the global model (SGD as the config says), then a
  weighted average and a test-set pass at batch 128. It uses our model builder, partition and
  client selection, nothing else of ours.

``fedcme train`` runs as a fresh process with its own temporary Prefect server, in a scratch
PREFECT_HOME whose database one server start before the timed runs has migrated (the cold start
is bench/startup.py's), and a scratch MLflow sqlite store. Reported per variant (medians over repeats):
the round time (rounds 2..T; round 1 pays the first allocations), samples/s (local-training
samples per round / round time), the time outside the rounds (wall time of the process minus
its rounds: start-up, the final model logging, shutdown) and the peak RSS of the process tree
(sampled every 0.1 s). Targets: FMNIST round <= 0.5x bare; CIFAR-10 round >= 1.6x faster than
``old``; outside the rounds <= 8 s; peak RSS no higher than ``old``.

Quick mode (checks the script works): synthetic data, K=4, M=2, E=2, 2 rounds, 1 repeat; under
``run_all.py --quick`` the runs report to the quick suite's shared Prefect server
($FEDCME_BENCH_PREFECT_API_URL) instead of starting their own.

    .venv/bin/python bench/round.py [--workloads fmnist,cifar10] [--variants defaults,old,bare] [--repeats 2] [--quick]
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import common
import yaml

ROUND_LINE = re.compile(r"^round\s+(\d+)/(\d+)\s.*\s([\d.]+)s\s+ETA")
WORKLOADS = {"fmnist": ("fmnist", "fmnist_cnn"), "cifar10": ("cifar10", "cifar_cnn")}
VARIANTS = ("defaults", "old", "bare")
OLD_DEFAULTS = {"channels_last": False, "precision": "fp32"}


def workload_values(workload: str, quick: bool) -> dict:
    dataset, model = WORKLOADS[workload]
    if quick:
        shape = [3, 32, 32] if workload == "cifar10" else [1, 28, 28]
        data = common.data_section("synthetic", synthetic={"num_train": 200, "num_test": 100, "shape": shape})
        return common.experiment_values(data=data, clients=4, per_round=2, epochs=2, rounds=2, model=model,
                                        algorithm={"name": "fedavg"})
    return common.experiment_values(data=common.data_section(dataset), clients=20, per_round=10, epochs=2, rounds=5,
                                    model=model, algorithm={"name": "fedavg"})


class PeakRss:
    """The peak resident memory of a process tree, sampled every 0.1 s in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, common.tree_rss_bytes(self.pid))
            self._stop.wait(0.1)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def run_process(command: list[str], environment: dict, cwd: Path) -> tuple[list[str], float, int]:
    """(stdout lines, wall seconds, peak tree RSS) of one process."""
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    memory = PeakRss(process.pid)
    stdout, stderr = process.communicate()
    wall = time.perf_counter() - started
    peak = memory.stop()
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:3])} failed ({process.returncode}):\n{stderr[-3000:]}")
    return stdout.splitlines(), wall, peak


def prefect_environment(scratch: Path, shared_server: str | None = None) -> dict:
    """`fedcme train`'s environment: a scratch PREFECT_HOME and its own temporary server, or the
    quick suite's shared server."""
    environment = {**os.environ, "PREFECT_HOME": str(scratch / "prefect-home"), "FEDCME_CACHE_DIR": str(scratch / "cache")}
    environment.pop("PREFECT_API_URL", None)
    if shared_server:
        environment["PREFECT_API_URL"] = shared_server
    return environment


def warm_prefect_home(scratch: Path) -> None:
    """Start and stop the temporary server once, so that every timed run finds a migrated
    database, as a researcher's second and later runs do (the cold start is bench/startup.py's)."""
    script = ("from flows.orchestration.prefect_server import startup_timeout, temporary_prefect_server\n"
              "with temporary_prefect_server() as server:\n    server.wait_ready(startup_timeout())\n")
    subprocess.run([sys.executable, "-c", script], cwd=common.REPO_ROOT, env=prefect_environment(scratch), check=True,
                   capture_output=True)


def fedcme_train(values: dict, variant: str, scratch: Path, repeat: int, shared_server: str | None) -> dict:
    training = {**values["training"], **(OLD_DEFAULTS if variant == "old" else {})}
    config = scratch / f"{variant}.yaml"
    config.write_text(yaml.safe_dump({**values, "training": training}))
    environment = prefect_environment(scratch, shared_server)
    experiment = f"{variant}-{repeat}"
    command = [sys.executable, "-m", "flows.cli", "train", "--config", str(config), "--experiment", experiment,
               "--runs-dir", str(scratch / "runs"), "--tracking-uri", f"sqlite:///{scratch / 'mlflow.db'}"]
    lines, wall, peak = run_process(command, environment, common.REPO_ROOT)
    rounds = [float(match.group(3)) for line in lines if (match := ROUND_LINE.match(line))]
    compute = json.loads((scratch / "runs" / experiment / "compute.json").read_text())
    return {"round_seconds": rounds, "wall_seconds": wall, "peak_rss_bytes": peak, "compute": compute["name"]}


def bare(values: dict, scratch: Path) -> dict:
    path = scratch / "bare.json"
    path.write_text(json.dumps(values))
    lines, wall, peak = run_process([sys.executable, __file__, "--bare-child", str(path)], dict(os.environ),
                                    common.REPO_ROOT)
    return {**json.loads(lines[-1]), "wall_seconds": wall, "peak_rss_bytes": peak, "compute": "nchw+fp32"}


def bare_child(path: str) -> None:
    """The bare loop (see the module docstring); prints {"round_seconds": [...]}."""
    import torch
    import torch.nn.functional as F

    from fedcme_core.server.aggregation import select_clients
    from fedcme_core.config.schema import config_from_dict
    from fedcme_core.rounds import load_experiment_dataset, make_partition
    from fedcme_core.client.models import build_model

    torch.set_num_threads(2)
    config = config_from_dict(json.loads(Path(path).read_text()))
    dataset = load_experiment_dataset(config.data, config.seed)
    partition = make_partition(dataset.y_train.numpy(), config.partition, config.federation.num_clients, config.seed)
    training, federation = config.training, config.federation
    global_model = build_model(config.model.name, dataset.num_classes, None, seed=0)
    rounds = []
    for round_index in range(federation.rounds):
        started = time.perf_counter()
        selected = select_clients(federation.num_clients, federation.clients_per_round, seed=config.seed,
                                  round_index=round_index)
        states, sizes = [], []
        for client in selected:
            indices = torch.tensor(partition.clients[client])
            inputs, labels = dataset.x_train[indices], dataset.y_train[indices]
            model = build_model(config.model.name, dataset.num_classes, None, seed=0)
            model.load_state_dict(global_model.state_dict())
            optimizer = torch.optim.SGD(model.parameters(), lr=training.lr, momentum=training.momentum,
                                        weight_decay=training.weight_decay)
            generator = torch.Generator().manual_seed(client)
            model.train()
            for _ in range(training.local_epochs):
                order = torch.randperm(len(labels), generator=generator)
                for start in range(0, len(labels), training.batch_size):
                    batch = order[start : start + training.batch_size]
                    loss = F.cross_entropy(model(inputs[batch]), labels[batch])
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
            states.append(model.state_dict())
            sizes.append(len(labels))
        total = sum(sizes)
        global_model.load_state_dict({key: sum(state[key].float() * size / total for state, size in zip(states, sizes))
                                      for key in states[0]})
        global_model.eval()
        with torch.no_grad():
            for start in range(0, len(dataset.y_test), 128):
                global_model(dataset.x_test[start : start + 128])
        rounds.append(time.perf_counter() - started)
    print(json.dumps({"round_seconds": rounds}))


def summarise(runs: list[dict], samples_per_round: float) -> dict:
    steady = [common.median(run["round_seconds"][1:] or run["round_seconds"]) for run in runs]
    round_seconds = common.median(steady)
    outside = common.median([run["wall_seconds"] - sum(run["round_seconds"]) for run in runs])
    return {"round_seconds": round(round_seconds, 3), "samples_per_second": round(samples_per_round / round_seconds, 1),
            "outside_rounds_seconds": round(outside, 2),
            "peak_rss_mib": round(max(run["peak_rss_bytes"] for run in runs) / 2**20, 1),
            "compute": sorted({run["compute"] for run in runs})}


def samples_per_round(values: dict) -> float:
    """Local-training samples of one round on average: E x the selected clients' data, K clients sharing N."""
    from fedcme_core.config.schema import config_from_dict
    from fedcme_core.rounds import load_experiment_dataset

    config = config_from_dict(values)
    total = len(load_experiment_dataset(config.data, config.seed).y_train)
    federation = config.federation
    return config.training.local_epochs * total * federation.clients_per_round / federation.num_clients


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--workloads", default="fmnist,cifar10")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--bare-child", default=None, help=argparse_hidden())
    arguments = parser.parse_args()
    if arguments.bare_child:
        bare_child(arguments.bare_child)
        return
    common.quiet_environment()
    shared_server = common.shared_prefect_api_url(arguments.quick)
    repeats = 1 if arguments.quick else (arguments.repeats or 2)
    workloads = ["fmnist"] if arguments.quick else arguments.workloads.split(",")
    variants = arguments.variants.split(",")
    for workload in workloads:
        values = workload_values(workload, arguments.quick)
        runs: dict[str, list[dict]] = {variant: [] for variant in variants}
        with tempfile.TemporaryDirectory(prefix="fedcme-bench-round-") as scratch_name:
            scratch = Path(scratch_name)
            if not shared_server:
                warm_prefect_home(scratch)
            for repeat in range(repeats):
                for variant in variants:  # interleaved, so that machine noise hits them alike
                    runs[variant].append(bare(values, scratch) if variant == "bare"
                                         else fedcme_train(values, variant, scratch, repeat, shared_server))
        per_round = samples_per_round(values)
        figures = {variant: summarise(variant_runs, per_round) for variant, variant_runs in runs.items()}
        ratios = {}
        if "bare" in figures and "defaults" in figures:
            ratios["defaults_round_vs_bare"] = common.ratio(figures["defaults"]["round_seconds"], figures["bare"]["round_seconds"])
        if "old" in figures and "defaults" in figures:
            ratios["speedup_defaults_vs_old"] = common.ratio(figures["old"]["round_seconds"], figures["defaults"]["round_seconds"])
            ratios["peak_rss_defaults_vs_old"] = common.ratio(figures["defaults"]["peak_rss_mib"], figures["old"]["peak_rss_mib"])
        common.emit("round", {"workload": workload, "quick": arguments.quick, "repeats": repeats,
                              "prefect_server": "shared by the quick suite" if shared_server else "temporary (one per run)",
                              "samples_per_round": round(per_round, 1), "figures": figures, "ratios": ratios,
                              "raw": runs}, arguments.results)


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
