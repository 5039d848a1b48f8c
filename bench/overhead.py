"""Orchestration overhead: wall time of a FedCME round through the Prefect flow against the ideal,
and against a plain Python loop over the same core functions.

The flow (``flows.orchestration.train.run_training``: Prefect tasks on the configured task runner, MLflow
tracking into a scratch sqlite store) runs under a temporary Prefect server whose PREFECT_HOME
is a scratch folder. Every round's record (``rounds.run_round``) holds its wall time
``round_seconds`` and its parts; the ideal of a round, computed from the same record, is

    client_train_seconds / workers + exchange_seconds + aggregate_seconds + evaluate_seconds

(``client_train_seconds``: the clients' ``train_epochs`` time). Reported beside it: the ideal
with the clients' whole arithmetic (``client_work_seconds``: training plus the step-7 pass for
local features and the evaluation vector), and the barrier-bound ideal that no layout can beat,
max(client_work_seconds / workers, critical_client_seconds) + the server steps, where
``critical_client_seconds`` sums the longest client's work of each phase.

The flow runs with its default one task per client per phase, and (full mode) again with one
task per worker (``runner.client_tasks: worker``, variant ``flow_task_per_worker``).
The same rounds also run through ``rounds.run_experiment`` with the ``SerialExecutor``
(ideal with workers = 1) and with a ThreadPoolExecutor-based executor of 2 workers (no Prefect).
Variants are whole runs of R rounds, interleaved (flow, serial, threads) `--repeats` times;
round 0 (data loading, no alignment yet) is excluded when R > 1. Target: flow / ideal <= 1.05.
Quick mode (checks the script works): synthetic data, K=4, M=2, E=2, 1 round (round 0 measured),
1 repeat; the flow runs against the quick suite's shared Prefect server when `run_all.py --quick`
gives one ($FEDCME_BENCH_PREFECT_API_URL), else it starts its own temporary server.

    .venv/bin/python bench/overhead.py [--rounds 3] [--repeats 2] [--runner threads|dask] [--quick]
"""

from __future__ import annotations

import atexit
import concurrent.futures
import os
import shutil
import tempfile
import time
from pathlib import Path

import common

SCRATCH = Path(tempfile.mkdtemp(prefix="fedcme-bench-overhead-"))
atexit.register(shutil.rmtree, SCRATCH, ignore_errors=True)  # registered first: runs after Prefect's own exit hooks
os.environ["PREFECT_HOME"] = str(SCRATCH / "prefect-home")
os.environ.pop("PREFECT_API_URL", None)  # always a temporary server of our own
common.quiet_environment()

import torch

from fedcme_core import rounds
from fedcme_core.results import records
from fedcme_core.config.files import apply_overrides
from fedcme_core.config.schema import config_from_dict
from fedcme_core.rounds import (
    SerialExecutor,
    completed_rounds,
    load_server_state,
    run_experiment,
)


class ThreadPoolLoopExecutor:
    """The Executor protocol over a ThreadPoolExecutor: the clients of a phase in parallel threads."""

    def __init__(self, workers: int) -> None:
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers)

    def call(self, step, function, *args):
        return function(*args)

    def map(self, step, function, arguments, retries=0, costs=None):
        return list(self.pool.map(lambda args: rounds.with_retries(function, args, retries), arguments))

    def close(self) -> None:
        self.pool.shutdown()


IDEALS = ("train", "work", "barrier")


def ideal_seconds(record: dict, workers: int, ideal: str = "train") -> float:
    """The round's ideal wall time: its clients' `train_epochs` time, or their whole work, shared
    perfectly by the workers, or that work bounded below by each phase's longest client."""
    if ideal == "train":
        clients = record["client_train_seconds"] / workers
    elif ideal == "work":
        clients = record["client_work_seconds"] / workers
    else:
        clients = max(record["client_work_seconds"] / workers, record["critical_client_seconds"])
    return clients + record.get("exchange_seconds", 0.0) + record["aggregate_seconds"] + record["evaluate_seconds"]


def round_part(record, part: str) -> float:
    """A stored round record's time part: `phase1_seconds` is its first phase, `phase2_seconds` every
    later one summed (records.phase_seconds reads both forms), the others its own keys."""
    phases = records.phase_seconds(record)
    if part == "phase1_seconds":
        return phases[0] if phases else 0.0
    if part == "phase2_seconds":
        return sum(phases[1:])
    return record.get(part, 0.0)


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--rounds", type=int, default=None, help="rounds per run (round 0 is excluded when > 1)")
    parser.add_argument("--workers", type=int, default=2, help="parallel client trainings")
    parser.add_argument("--runner", default="threads", choices=["threads", "dask"], help="the flow's task runner")
    arguments = parser.parse_args()
    workers = arguments.workers
    shared_server = common.shared_prefect_api_url(arguments.quick)
    if shared_server:  # before prefect is imported
        os.environ["PREFECT_API_URL"] = shared_server
    runner = {"kind": arguments.runner, "workers": workers, "threads_per_worker": 1}
    if arguments.quick:
        values = common.experiment_values(
            data=common.data_section("synthetic", synthetic={"num_train": 256, "num_test": 64}),
            clients=4, per_round=2, epochs=2, alpha=0.5, runner=runner,
        )
        rounds, repeats = arguments.rounds or 1, arguments.repeats or 1
    else:
        values = common.experiment_values(
            data=common.data_section("fmnist"), clients=50, per_round=20, epochs=2, alpha=0.1, runner=runner
        )
        rounds, repeats = arguments.rounds or 3, arguments.repeats or 2
    values["federation"]["rounds"] = rounds
    config = config_from_dict(values)
    torch.set_num_threads(1)
    from flows.orchestration.train import run_training  # imports prefect (after PREFECT_HOME is set)

    runs_dir = SCRATCH / "runs"
    tracking_uri = f"sqlite:///{SCRATCH / 'mlflow.db'}"
    flows = {"flow": {}} if arguments.quick else {"flow": {}, "flow_task_per_worker": {"runner.client_tasks": "worker"}}
    histories: dict[str, list[list[dict]]] = {**{name: [] for name in flows}, "serial_loop": [], "threadpool_loop": []}
    call_seconds: dict[str, list[float]] = {name: [] for name in histories}
    threadpool = ThreadPoolLoopExecutor(workers)
    try:
        for repeat in range(repeats):
            variants = {
                **{
                    flow_name: lambda name, overrides=overrides: run_training(
                        config_from_dict(apply_overrides(values, overrides)), name, runs_dir=str(runs_dir),
                        tracking_uri=tracking_uri,
                    )
                    for flow_name, overrides in flows.items()
                },
                "serial_loop": lambda name: run_experiment(config, runs_dir / name, SerialExecutor()),
                "threadpool_loop": lambda name: run_experiment(config, runs_dir / name, threadpool),
            }
            for variant, action in variants.items():
                name = f"{variant}-{repeat}"
                call_seconds[variant].append(common.timed(lambda action=action, name=name: action(name)))
                run_dir = runs_dir / name
                histories[variant].append(load_server_state(run_dir, completed_rounds(run_dir))["history"])
    finally:
        threadpool.close()

    first = 1 if rounds > 1 else 0
    round_seconds, ideal, ratios = {}, {}, {}
    for variant, runs in histories.items():
        variant_workers = 1 if variant == "serial_loop" else workers
        records = [record for history in runs for record in history[first:]]
        round_seconds[variant] = common.median(record["round_seconds"] for record in records)
        for basis in IDEALS:
            ideal[f"{variant}_{basis}"] = common.median(ideal_seconds(record, variant_workers, basis) for record in records)
            ratios[f"{variant}_vs_{basis}_ideal"] = round(common.median(
                record["round_seconds"] / ideal_seconds(record, variant_workers, basis) for record in records
            ), 3)
    flow_records = [record for history in histories["flow"] for record in history[first:]]
    parts = ("client_train_seconds", "client_work_seconds", "critical_client_seconds", "phase1_seconds",
             "exchange_seconds", "phase2_seconds", "aggregate_seconds", "evaluate_seconds", "round_seconds")
    record = {
        **common.describe(config),
        "runner": runner,
        "prefect_server": "shared by the quick suite" if shared_server else "temporary (started by the flow)",
        "rounds_per_run": rounds,
        "rounds_measured": list(range(first, rounds)),
        "repeats": repeats,
        "round_seconds": common.rounded(round_seconds, 3),
        "ideal_seconds": common.rounded(ideal, 3),
        "flow_round_parts_seconds": {part: round(common.median(round_part(r, part) for r in flow_records), 3) for part in parts},
        "run_call_seconds": {name: round(common.median(values), 3) for name, values in call_seconds.items()},
        "ratio_flow_vs_ideal": ratios["flow_vs_train_ideal"],
        "ratio_threadpool_loop_vs_ideal": ratios["threadpool_loop_vs_train_ideal"],
        "ratio_serial_loop_vs_ideal": ratios["serial_loop_vs_train_ideal"],
        "ratios_vs_ideals": ratios,
        "ratio_flow_vs_threadpool_loop": common.ratio(round_seconds["flow"], round_seconds["threadpool_loop"]),
        "ratio_flow_vs_serial_loop": common.ratio(round_seconds["flow"], round_seconds["serial_loop"]),
        "ratio_flow_task_per_worker_vs_flow": (
            common.ratio(round_seconds["flow_task_per_worker"], round_seconds["flow"]) if "flow_task_per_worker" in flows else None
        ),
        "target": "ratio_flow_vs_ideal <= 1.05",
    }
    common.emit("overhead", record, arguments.results, quick=arguments.quick)


if __name__ == "__main__":
    started = time.perf_counter()
    main()

