"""Parallel efficiency: local-training throughput of one round's client trainings with
2 workers x 1 torch thread against 1 worker x 1 thread, for three layouts.

The work is the real step of a round: ``rounds.train_phase_step`` for each of the M
selected clients (FedAvg, one phase of E epochs on the client's partition; it writes the
upload checkpoint), in a prepared run directory. Layouts:

* threads:   ``concurrent.futures.ThreadPoolExecutor`` in this process, torch threads = 1
             (what the default ``threads`` runner does);
* processes: ``concurrent.futures.ProcessPoolExecutor`` (forkserver, preloading torch and the
             core once; or --start-method spawn), each worker torch threads = 1;
* dask:      ``flows.orchestration.dask_cluster.local_cluster(n_workers=2, threads_per_worker=1, processes=True)``
             on 127.0.0.1 (a LocalCluster whose workers keep glibc's malloc defaults), each
             worker torch threads = 1 (what the ``dask`` runner starts);
* bare:      the processes layout running, from the same global model, a bare PyTorch loop
             over each client's tensors (E epochs, then one no-grad pass as step 7 does) and
             none of our code: how two such processes scale on this machine.

Each layout starts one 2-worker pool; "1 worker" is the same pool used one task at a time
(dask: every task pinned to one worker), "2 workers" submits all M tasks at once, largest client
first as the round does (since commit cc40c33; before, in selection order). Start-up
(pool start, imports, dataset and partition loading in every worker) is timed separately and
excluded from throughput; 1w and 2w runs of every layout are interleaved. Throughput is the
round's trained samples over its wall time. Target: speedup 2w/1w >= 1.85 (default runner).

Quick mode (checks the script works): synthetic data, K=4, M=2, E=1, 1 repeat, and only the
threads, processes and bare layouts unless --layouts names dask (a LocalCluster start costs more than
the rest of the quick run).

    .venv/bin/python bench/parallel.py [--layouts threads,processes,dask] [--repeats 3] [--quick]
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import tempfile
import time
import types
from pathlib import Path

import common

common.quiet_environment()

import torch

from fedcme_core import rounds
from fedcme_core.config.schema import config_from_dict
from fedcme_core.client.compute import Compute
from fedcme_core.client.models import build_model
from fedcme_core.data.partition_file import load_partition
from local_training import bare_loop

LAYOUTS = ("threads", "processes", "dask", "bare")
QUICK_LAYOUTS = ("threads", "processes", "bare")


def warm_worker(config, run_dir: str) -> int:
    """Per worker, once: 1 torch thread, the dataset and the partition loaded (cached per process)."""
    torch.set_num_threads(1)
    rounds.load_experiment_dataset(config.data, config.seed)
    rounds.run_partition(config, Path(run_dir))
    return torch.get_num_threads()


def train_client(config, run_dir: str, client: int) -> dict:
    torch.set_num_threads(1)
    return rounds.train_phase_step(config, run_dir, 0, client, 0, None)


def bare_client(config, run_dir: str, client: int) -> dict:
    """The same client's arithmetic with none of our code: from the same global model, a bare
    PyTorch loop over its tensors for E epochs, then one no-grad pass over them (as step 7 does)."""
    torch.set_num_threads(1)
    dataset = rounds.load_experiment_dataset(config.data, config.seed)
    partition, _ = rounds.run_partition(config, Path(run_dir))
    indices = torch.tensor(partition.clients[client])
    inputs, labels = dataset.x_train[indices], dataset.y_train[indices]  # [D_k, C_in, H, W], [D_k]
    model = build_model(config.model.name, num_classes=dataset.num_classes)
    model.load_state_dict(rounds.shared_server_state(Path(run_dir), 0)["model"])  # w^0, as our step starts
    started = time.perf_counter()
    for _ in range(config.training.local_epochs):
        bare_loop(model, inputs, labels, config.training.batch_size, config.training, Compute())  # NCHW fp32
    model.eval()
    with torch.no_grad():
        for start in range(0, labels.shape[0], 128):
            model(inputs[start : start + 128])
    seconds = time.perf_counter() - started
    # The figures our step's result carries (its `seconds` and `samples`), as attributes alike.
    return types.SimpleNamespace(client=client, seconds=seconds,
                                 samples=int(labels.shape[0]) * config.training.local_epochs)


class ThreadLayout:
    def __init__(self, config, run_dir: str, workers: int) -> None:
        warm_worker(config, run_dir)
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers)

    def serial(self, config, run_dir, clients):
        return [self.pool.submit(train_client, config, run_dir, client).result() for client in clients]

    def parallel(self, config, run_dir, clients):
        return list(self.pool.map(lambda client: train_client(config, run_dir, client), clients))

    def close(self) -> None:
        self.pool.shutdown()


class ProcessLayout:
    task = staticmethod(train_client)

    def __init__(self, config, run_dir: str, workers: int, start_method: str) -> None:
        context = multiprocessing.get_context(start_method)
        if start_method == "forkserver":  # workers fork from a server that imported these once
            context.set_forkserver_preload(["torch", "fedcme_core.rounds"])
        self.pool = concurrent.futures.ProcessPoolExecutor(
            max_workers=workers, mp_context=context, initializer=warm_worker, initargs=(config, run_dir)
        )
        # Start every worker now, initializer included: submit short tasks until all have answered.
        seen: set[int] = set()
        while len(seen) < workers:
            seen.update(self.pool.map(_pid, [0.05] * workers))

    def serial(self, config, run_dir, clients):
        return [self.pool.submit(self.task, config, run_dir, client).result() for client in clients]

    def parallel(self, config, run_dir, clients):
        futures = [self.pool.submit(self.task, config, run_dir, client) for client in clients]
        return [future.result() for future in futures]

    def close(self) -> None:
        self.pool.shutdown()


class BareLayout(ProcessLayout):
    """The processes layout running `bare_client` instead of our step."""

    task = staticmethod(bare_client)


def _pid(pause: float) -> int:
    time.sleep(pause)
    return os.getpid()


class DaskLayout:
    def __init__(self, config, run_dir: str, workers: int) -> None:
        from distributed import Client

        from flows.orchestration.dask_cluster import local_cluster

        self.cluster = local_cluster(
            n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
        )
        self.client = Client(self.cluster)
        self.client.run(warm_worker, config, run_dir)
        self.first_worker = min(self.client.scheduler_info()["workers"])

    def serial(self, config, run_dir, clients):
        futures = [
            self.client.submit(train_client, config, run_dir, client, workers=[self.first_worker], pure=False)
            for client in clients
        ]
        return self.client.gather(futures)

    def parallel(self, config, run_dir, clients):
        futures = [self.client.submit(train_client, config, run_dir, client, pure=False) for client in clients]
        return self.client.gather(futures)

    def close(self) -> None:
        self.client.close()
        self.cluster.close()


def start_layout(name: str, config, run_dir: str, workers: int, start_method: str):
    if name == "threads":
        return ThreadLayout(config, run_dir, workers)
    if name == "processes":
        return ProcessLayout(config, run_dir, workers, start_method)
    if name == "bare":
        return BareLayout(config, run_dir, workers, start_method)
    return DaskLayout(config, run_dir, workers)


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--layouts", default=None,
                        help=f"comma-separated subset of {', '.join(LAYOUTS)} (default: all; quick: {', '.join(QUICK_LAYOUTS)})")
    parser.add_argument("--start-method", default="forkserver", choices=["spawn", "forkserver"])
    parser.add_argument("--clients", type=int, default=None, help="M, clients trained per round")
    parser.add_argument("--epochs", type=int, default=None, help="E, local epochs")
    arguments = parser.parse_args()
    chosen = arguments.layouts or ",".join(QUICK_LAYOUTS if arguments.quick else LAYOUTS)
    layouts = [name.strip() for name in chosen.split(",") if name.strip()]
    unknown = set(layouts) - set(LAYOUTS)
    if unknown:
        parser.error(f"unknown layouts {sorted(unknown)}")
    workers = 2
    torch.set_num_threads(1)
    if arguments.quick:
        values = common.experiment_values(
            data=common.data_section("synthetic", synthetic={"num_train": 256, "num_test": 64}),
            clients=4, per_round=arguments.clients or 2, epochs=arguments.epochs or 1, alpha=0.5,
            algorithm={"name": "fedavg"},
        )
        repeats = arguments.repeats or 1
    else:
        values = common.experiment_values(
            data=common.data_section("fmnist"), clients=50, per_round=arguments.clients or 20,
            epochs=arguments.epochs or 2, alpha=0.1, algorithm={"name": "fedavg"},
        )
        repeats = arguments.repeats or 3
    config = config_from_dict(values)
    with tempfile.TemporaryDirectory(prefix="fedcme-bench-parallel-") as scratch:
        run_dir = str(Path(scratch) / "run")
        rounds.prepare_run(config, run_dir)
        # Largest client first, as `rounds.run_round` hands a phase's clients to the workers
        # (read from the file: the layouts' start-up below still loads the run's partition).
        sizes = [len(indices) for indices in load_partition(rounds.RunPaths(run_dir).partition).clients]
        clients = rounds.largest_first(list(rounds.select_step(config, 0).clients), sizes)

        started_layouts, startup = {}, {}
        try:
            for name in layouts:
                started = time.perf_counter()
                started_layouts[name] = start_layout(name, config, run_dir, workers, arguments.start_method)
                startup[name] = time.perf_counter() - started
            for layout in started_layouts.values():  # warm-up round (untimed)
                layout.parallel(config, run_dir, clients)
            walls = {(name, w): [] for name in started_layouts for w in (1, workers)}
            in_task = {(name, w): [] for name in started_layouts for w in (1, workers)}
            samples = 0
            for _ in range(repeats):
                for name, layout in started_layouts.items():
                    for count, run in ((1, layout.serial), (workers, layout.parallel)):
                        began = time.perf_counter()
                        summaries = run(config, run_dir, clients)
                        walls[(name, count)].append(time.perf_counter() - began)
                        in_task[(name, count)].append(sum(summary.seconds for summary in summaries))
                        samples = sum(summary.samples for summary in summaries)
        finally:
            for layout in started_layouts.values():
                layout.close()

    for name in started_layouts:
        one = samples / common.median(walls[(name, 1)])
        two = samples / common.median(walls[(name, workers)])
        record = {
            "layout": name,
            "start_method": arguments.start_method if name in ("processes", "bare") else None,
            **common.describe(config),
            "workers": [1, workers],
            "threads_per_worker": 1,
            "repeats": repeats,
            "samples_per_round": samples,
            "startup_seconds": round(startup[name], 4),
            "round_wall_seconds": {"1w": round(common.median(walls[(name, 1)]), 3),
                                   f"{workers}w": round(common.median(walls[(name, workers)]), 3)},
            "in_task_seconds": {"1w": round(common.median(in_task[(name, 1)]), 3),
                                f"{workers}w": round(common.median(in_task[(name, workers)]), 3)},
            "samples_per_second": {"1w": round(one, 1), f"{workers}w": round(two, 1)},
            f"speedup_{workers}w_vs_1w": common.ratio(two, one),
            "target": "speedup >= 1.85 (default runner: threads)",
        }
        common.emit("parallel", record, arguments.results, quick=arguments.quick)


if __name__ == "__main__":
    main()
