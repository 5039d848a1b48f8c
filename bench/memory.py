"""Memory: peak resident memory (RSS) of a run's whole process tree, with 2 workers against 1,
and with K=1000 clients against K=50 (M=20 both).

Each variant runs in a fresh child process (`bench/memory.py --child ...`) while this process
samples the RSS of the child and all its descendants (psutil, every 20 ms; /proc without it)
and keeps the peak (the figures are RSS sums, as the targets; the peak sum of PSS, where shared
pages such as torch's libraries count once across processes, is reported beside). A run is one round of FedCME (E local epochs) with the Dask
runner, whose workers are processes:

* core: ``rounds.run_experiment`` with an executor that sends each client's local training
        to a ``flows.orchestration.dask_cluster.local_cluster(n_workers=w, threads_per_worker=1, processes=True)`` on
        127.0.0.1 (the other steps in the driver, as the Prefect flow runs them);
* flow: ``flows.orchestration.train.run_training`` with ``runner.kind: dask`` (Prefect's DaskTaskRunner on the
        same LocalCluster, a temporary Prefect server and MLflow sqlite store, all in scratch
        folders) - the tree then also holds the Prefect server.

Variants: (w=1, K=50), (w=2, K=50), (w=2, K=1000); Dirichlet alpha 0.5 (alpha 0.1 cannot give
1000 clients 10 samples each). Targets: peak(w=2) / peak(w=1) <= 1.5 and
peak(K=1000) / peak(K=50) <= 1.3: the dataset held once per machine. A child that leaves a process
of its session running (a server, a worker) fails the benchmark, naming it, after it is killed.

Quick mode (checks the script works; its figures say nothing): core only, synthetic data,
K=4 and K=40, M=2, E=2; each child is a fork of this process with the imports already done
(not a fresh interpreter) and the LocalCluster's workers are threads in the child
(processes=False): fresh interpreters and worker processes cost most of the quick run.

    .venv/bin/python bench/memory.py [--via core,flow] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

from flows.common.processes import command_line, group_members

common.quiet_environment()

SAMPLE_SECONDS = 0.02
PSS_EVERY = 10  # PSS (reads smaps) on every 10th sample
QUICK_SAMPLE_SECONDS = 0.05  # quick: short runs, fewer samples (each walks the process table)
QUICK_PSS_EVERY = 4


# ------------------------------------------------------------------------ the child
class DaskExecutor:
    """The Executor protocol with the clients of a phase on a Dask LocalCluster (others in-process)."""

    def __init__(self, workers: int, processes: bool = True) -> None:
        import torch
        from distributed import Client

        from flows.orchestration.dask_cluster import local_cluster

        # in-process workers (processes=False) talk over dask's inproc transport: no host to bind
        where = {"host": "127.0.0.1"} if processes else {}
        self.cluster = local_cluster(
            n_workers=workers, threads_per_worker=1, processes=processes, dashboard_address=None, **where
        )
        self.client = Client(self.cluster)
        self.client.run(torch.set_num_threads, 1)

    def call(self, step, function, *args):
        return function(*args)

    def map(self, step, function, arguments, retries=0, costs=None):  # no retries: a failure ends the benchmark
        return self.client.gather([self.client.submit(function, *args, pure=False) for args in arguments])

    def close(self) -> None:
        self.client.close()
        self.cluster.close()


def child(spec: dict) -> None:
    """One run of the variant `spec`, in this (fresh or forked) process; prints a JSON summary
    line and writes it to `summary.json` in the scratch folder."""
    import torch

    from fedcme_core.config.schema import config_from_dict

    torch.set_num_threads(1)
    scratch = Path(spec["scratch"])
    values = spec["values"]
    started = time.perf_counter()
    if spec["via"] == "flow":
        os.environ["PREFECT_HOME"] = str(scratch / "prefect-home")
        os.environ.pop("PREFECT_API_URL", None)
        from flows.orchestration.prefect_server import run_against_prefect
        from flows.orchestration.train import run_training

        # The temporary server as `fedcme train` starts it: stopped when the run returns, also in a
        # forked child (which exits without atexit handlers, where Prefect's own would stop its server).
        summary = run_against_prefect(lambda ready: run_training(
            config_from_dict(values), "memory", ready=ready, runs_dir=str(scratch / "runs"),
            tracking_uri=f"sqlite:///{scratch / 'mlflow.db'}"), "the memory bench")
        rounds = summary["rounds"]
    else:
        from fedcme_core.rounds import run_experiment

        executor = DaskExecutor(values["runner"]["workers"], processes=spec.get("processes", True))
        try:
            rounds = len(run_experiment(config_from_dict(values), scratch / "runs" / "memory", executor))
        finally:
            executor.close()
    summary = json.dumps({"rounds": rounds, "seconds": time.perf_counter() - started})
    (scratch / "summary.json").write_text(summary, encoding="utf-8")
    print(summary, flush=True)


def forked_child(spec: dict) -> None:
    """Quick mode: `child` in a fork of the measuring process (own session, like the subprocess)."""
    os.setsid()
    os.chdir(spec["scratch"])
    child(spec)


def preload() -> None:
    """Quick mode: import what a child imports once, here, so that each forked child skips it."""
    import distributed  # noqa: F401
    import torch._dynamo  # noqa: F401  (imported lazily by the first optimizer)

    import fedcme_core.rounds  # noqa: F401
    from fedcme_core.config.schema import config_from_dict  # noqa: F401


class ForkedChild:
    """The subprocess.Popen calls used below, for a multiprocessing fork running `forked_child`."""

    def __init__(self, spec: dict) -> None:
        import multiprocessing

        self.process = multiprocessing.get_context("fork").Process(target=forked_child, args=(spec,))
        self.process.start()
        self.pid = self.process.pid
        self.returncode = None

    def poll(self):
        if self.process.exitcode is not None:
            self.returncode = self.process.exitcode
        return self.returncode

    def communicate(self):
        self.process.join()
        self.poll()
        return "", "(see the output above)"

    def wait(self):
        return self.communicate()


# ----------------------------------------------------------------------- the parent
def left_behind(session: int) -> str:
    """The processes of a finished child's session (its process group) still running, killed; "" if none
    (a zombie, exited and waiting for init to reap it, is not running)."""
    running = [(pid, command_line(pid)) for pid in group_members(session)]
    for pid, _ in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return "; ".join(f"{pid} {command[:100]}" for pid, command in running)


def peak_tree_rss(spec: dict, timeout: float, fork: bool = False) -> tuple[int, int, dict]:
    """Run a child for `spec` (a fresh process, or with `fork` a fork of this one); the peak RSS
    and peak PSS (bytes) of its process tree, its summary."""
    if fork:
        process = ForkedChild(spec)
        interval, pss_every = QUICK_SAMPLE_SECONDS, QUICK_PSS_EVERY
    else:
        command = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
        process = subprocess.Popen(command, cwd=spec["scratch"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, start_new_session=True)
        interval, pss_every = SAMPLE_SECONDS, PSS_EVERY
    peak, peak_pss, samples, started = 0, 0, 0, time.perf_counter()
    try:
        while process.poll() is None:
            peak = max(peak, common.tree_rss_bytes(process.pid))
            if samples % pss_every == 0:
                peak_pss = max(peak_pss, common.tree_rss_bytes(process.pid, proportional=True))
            samples += 1
            if time.perf_counter() - started > timeout:
                raise TimeoutError(f"memory child {spec['name']} ran over {timeout:.0f} s")
            time.sleep(interval)
        _, stderr = process.communicate()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    left = left_behind(process.pid)
    if left:
        raise RuntimeError(f"memory child {spec['name']} left processes running (killed now): {left}")
    if process.returncode != 0:
        raise RuntimeError(f"memory child {spec['name']} failed (exit {process.returncode}):\n{stderr[-3000:]}")
    summary = json.loads((Path(spec["scratch"]) / "summary.json").read_text(encoding="utf-8"))
    return peak, peak_pss, summary


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--via", default=None, help="comma-separated: core, flow (default: core,flow; quick: core)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per child run")
    arguments = parser.parse_args()
    if arguments.child is not None:
        child(json.loads(arguments.child))
        return
    vias = [via.strip() for via in (arguments.via or ("core" if arguments.quick else "core,flow")).split(",")]
    if arguments.quick:
        data = common.data_section("synthetic", synthetic={"num_train": 400, "num_test": 100})
        small, large, per_round, epochs, min_size = 4, 40, 2, 2, 2
        preload()
    else:
        data = common.data_section("fmnist")
        small, large, per_round, epochs, min_size = 50, 1000, 20, 2, 10
    variants = {f"w1_K{small}": (1, small), f"w2_K{small}": (2, small), f"w2_K{large}": (2, large)}
    for via in vias:
        peaks, pss, summaries = {}, {}, {}
        for name, (workers, clients) in variants.items():
            values = common.experiment_values(
                data=data, clients=clients, per_round=per_round, epochs=epochs, alpha=0.5, min_size=min_size,
                runner={"kind": "dask", "workers": workers, "threads_per_worker": 1},
            )
            with tempfile.TemporaryDirectory(prefix="fedcme-bench-memory-") as scratch:
                spec = {"name": name, "via": via, "scratch": scratch, "values": values,
                        "processes": not arguments.quick}
                peaks[name], pss[name], summaries[name] = peak_tree_rss(spec, arguments.timeout, fork=arguments.quick)
        mib = {name: round(value / 2**20, 1) for name, value in peaks.items()}
        pss_mib = {name: round(value / 2**20, 1) for name, value in pss.items()}
        record = {
            "via": via,
            "dataset": data["dataset"],
            "model": "fmnist_cnn",
            "algorithm": "fedcme",
            "M": per_round,
            "E": epochs,
            "K": {"few": small, "many": large},
            "rounds": 1,
            "alpha": 0.5,
            "runner": "dask LocalCluster, threads_per_worker=1, processes=" + ("False (quick)" if arguments.quick else "True"),
            "child": "fork of the measuring process (quick)" if arguments.quick else "fresh process",
            "torch_threads": 1,  # per client training (each worker); this measuring process trains nothing
            "peak_rss_mib": mib,
            "peak_pss_mib": pss_mib,
            "run_seconds": {name: round(summary["seconds"], 2) for name, summary in summaries.items()},
            "ratio_2w_vs_1w": common.ratio(peaks[f"w2_K{small}"], peaks[f"w1_K{small}"]),
            "ratio_many_vs_few_clients": common.ratio(peaks[f"w2_K{large}"], peaks[f"w2_K{small}"]),
            "pss_ratios": {
                "2w_vs_1w": common.ratio(pss[f"w2_K{small}"], pss[f"w1_K{small}"]),
                "many_vs_few_clients": common.ratio(pss[f"w2_K{large}"], pss[f"w2_K{small}"]),
            },
            "targets": {"ratio_2w_vs_1w": "<= 1.5", "ratio_many_vs_few_clients": "<= 1.3 (K=1000 vs K=50)"},
        }
        common.emit("memory", record, arguments.results, quick=arguments.quick)


if __name__ == "__main__":
    main()
