"""bf16 autocast against fp32 in accuracy: may ``training.precision: auto`` pick bf16 by default?

Workload (full mode): FedAvg and FedCME(mu=0.01) on Fashion-MNIST (fmnist_cnn) and on CIFAR-10
(cifar_cnn, crop_flip), both from the offline mirror; K=20, M=10, E=2, alpha 0.1, batch 64,
30 rounds, seeds 0 and 1; every run once in fp32 and once with bf16 autocast (weights, optimizer
state and aggregation stay fp32), NCHW in both, so that precision is the only difference: 16 runs.
The round loop is the project's (``fedcme_core.rounds.run_experiment``), a phase's clients on a
thread pool (bench/gpu.py's ``ThreadPoolRounds``); ``--jobs`` runs go at once, each in a process.

The rule (issue "Twice the samples per second", Deliver 1): per setting (dataset, algorithm),
d = the mean over seeds of bf16's final accuracy minus fp32's, the final accuracy being the mean
of the last 5 rounds. bf16 may be a default only if

    mean over settings of |d| <= 0.5 points   and   |d| <= the fp32 seed-to-seed std in every setting.

It needs native bf16 (CUDA, or a CPU with AVX512-BF16 or AMX: ``fedcme_core.client.compute.native_bf16``).
Elsewhere it says so in one line and exits with status 2: emulated bf16 computes the same numbers
at 0.13-0.16x of fp32's speed (BENCHMARKS "bf16 autocast on a CPU without native bf16"), and
``--allow-emulated`` runs it anyway. Quick mode (checks the script, on any CPU): synthetic data of
both shapes, K=M=2, E=2, 2 rounds (the last 2 as the final window), seeds 0 and 1, in this process.

    .venv/bin/python bench/bf16_accuracy.py [--device auto|cpu|cuda] [--datasets fmnist,cifar10] [--jobs N]
                                            [--rounds T] [--resume] [--quick]
"""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed

import common

DATASETS = {"fmnist": "fmnist_cnn", "cifar10": "cifar_cnn"}
ALGORITHMS = {"fedavg": {"name": "fedavg"}, "fedcme(0.01)": {"name": "fedcme", "mu": 0.01}}
SEEDS = (0, 1)
PRECISIONS = ("fp32", "bf16")
FINAL_WINDOW = 5
MEAN_BOUND_POINTS = 0.5
QUICK_SHAPES = {"fmnist": [1, 28, 28], "cifar10": [3, 32, 32]}
Run = tuple[str, str, str, int]  # (dataset, algorithm, precision, seed)


def run_values(run: Run, *, quick: bool, device: str, rounds: int) -> dict:
    dataset, algorithm, precision, seed = run
    if quick:
        data = common.data_section("synthetic", synthetic={"num_train": 64, "num_test": 32,
                                                           "shape": QUICK_SHAPES[dataset]})
        values = common.experiment_values(data=data, clients=2, per_round=2, epochs=2, rounds=rounds,
                                          model=DATASETS[dataset], algorithm=ALGORITHMS[algorithm], min_size=2)
    else:
        values = common.experiment_values(data=common.data_section(dataset), clients=20, per_round=10, epochs=2,
                                          rounds=rounds, model=DATASETS[dataset], algorithm=ALGORITHMS[algorithm])
    values.update(seed=seed, device=device)
    values["training"].update(precision=precision, channels_last=False)
    return values


def train(run: Run, values: dict, workers: int) -> dict:
    """One run; its per-round test accuracy, final accuracy (mean of the last rounds) and wall time."""
    from gpu import ThreadPoolRounds

    from fedcme_core.config.schema import config_from_dict
    from fedcme_core.rounds import run_experiment

    config = config_from_dict(values, "bench/bf16_accuracy.py")
    executor = ThreadPoolRounds(workers)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fedcme-bench-bf16-") as run_dir:
        try:
            history = run_experiment(config, run_dir, executor)
        finally:
            executor.pool.shutdown()
    accuracy = [float(record["test_accuracy"]) for record in history]
    window = accuracy[-min(FINAL_WINDOW, len(accuracy)):]
    dataset, algorithm, precision, seed = run
    return {"dataset": dataset, "algorithm": algorithm, "precision": precision, "seed": seed,
            "final_accuracy": statistics.fmean(window), "final_window": len(window), "accuracy": accuracy,
            "wall_seconds": round(time.perf_counter() - started, 2)}


def finished_runs(results: os.PathLike, *, device: str, rounds: int, quick: bool) -> dict[Run, dict]:
    """The runs a results file already holds for this device, length and mode, by (dataset, algorithm, precision, seed).

    A line that is not a JSON record raises ValueError naming the file and the line.
    """
    done: dict[Run, dict] = {}
    if not os.path.exists(results):
        return done
    with open(results, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{results}:{number}: not a JSON record ({error.msg}); "
                                 "mend or remove that line, or run without --resume") from None
            if (record.get("bench") == "bf16_accuracy_run" and bool(record.get("quick")) == quick
                    and (record.get("device"), record.get("rounds")) == (device, rounds)):
                done[(record["dataset"], record["algorithm"], record["precision"], record["seed"])] = record
    return done


def verdict(finals: Mapping[Run, float]) -> dict:
    """The rule over {(dataset, algorithm, precision, seed): final accuracy (fraction)}, in points."""
    settings = sorted({(dataset, algorithm) for dataset, algorithm, _, _ in finals})
    rows = []
    for dataset, algorithm in settings:
        seeds = sorted(seed for d, a, p, seed in finals if (d, a, p) == (dataset, algorithm, "fp32")
                       and (dataset, algorithm, "bf16", seed) in finals)
        fp32 = [100 * finals[(dataset, algorithm, "fp32", seed)] for seed in seeds]
        bf16 = [100 * finals[(dataset, algorithm, "bf16", seed)] for seed in seeds]
        difference = statistics.fmean(b - f for b, f in zip(bf16, fp32))
        spread = statistics.stdev(fp32) if len(fp32) >= 2 else 0.0
        rows.append({"dataset": dataset, "algorithm": algorithm, "seeds": seeds, "fp32": fp32, "bf16": bf16,
                     "difference_points": difference, "fp32_seed_std_points": spread,
                     "within_seed_spread": abs(difference) <= spread})
    mean_abs = statistics.fmean(abs(row["difference_points"]) for row in rows)
    return {"settings": rows, "mean_abs_difference_points": mean_abs,
            "bf16_may_be_default": mean_abs <= MEAN_BOUND_POINTS and all(row["within_seed_spread"] for row in rows)}


def markdown(result: Mapping) -> str:
    """The table BENCHMARKS.md carries: per setting fp32 and bf16 mean ± std over seeds and d."""
    def cell(values: Sequence[float]) -> str:
        spread = f" ± {statistics.stdev(values):.2f}" if len(values) >= 2 else ""
        return f"{statistics.fmean(values):.2f}{spread}"

    lines = ["| dataset | algorithm | fp32 (%) | bf16 (%) | d = bf16 - fp32 (points) | fp32 seed std | abs(d) <= std |",
             "|---|---|---:|---:|---:|---:|---|"]
    for row in result["settings"]:
        lines.append(f"| {row['dataset']} | {row['algorithm']} | {cell(row['fp32'])} | {cell(row['bf16'])} | "
                     f"{row['difference_points']:+.2f} | {row['fp32_seed_std_points']:.2f} | "
                     f"{'yes' if row['within_seed_spread'] else 'no'} |")
    decision = "may" if result["bf16_may_be_default"] else "may not"
    lines.append(f"\nMean |d| {result['mean_abs_difference_points']:.2f} points (bound {MEAN_BOUND_POINTS}): "
                 f"bf16 {decision} be a default.")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--jobs", type=int, default=None, help="runs at once, a process each (default: by device)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--datasets", default=",".join(DATASETS), help="of fmnist,cifar10 (one call each, say)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the runs --results already holds (same device, rounds and --quick), train the rest")
    parser.add_argument("--allow-emulated", action="store_true", help="run where bf16 is emulated (slow)")
    arguments = parser.parse_args()
    datasets = [name for name in arguments.datasets.split(",") if name]
    if unknown := sorted(set(datasets) - set(DATASETS)):
        print(f"bench/bf16_accuracy.py: --datasets {','.join(unknown)}: not one of {','.join(DATASETS)}",
              file=sys.stderr)
        return 2
    common.quiet_environment()
    import torch

    from fedcme_core.client.compute import native_bf16

    device = arguments.device if arguments.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("bench/bf16_accuracy.py: --device cuda, but no CUDA device here; nothing measured", file=sys.stderr)
        return 2
    native = native_bf16(torch.device(device))
    if not (native or arguments.quick or arguments.allow_emulated):
        print(f"bench/bf16_accuracy.py: no native bf16 on this {device} (emulated bf16 is 0.13-0.16x of fp32); "
              "nothing measured (--allow-emulated runs it anyway)", file=sys.stderr)
        return 2
    if not arguments.quick and common.data_mirror() is None:
        print("bench/bf16_accuracy.py: no data mirror ($FEDCME_DATA_MIRROR or ../shared/data): an accuracy study "
              "needs the real datasets; nothing measured", file=sys.stderr)
        return 2
    rounds = 2 if arguments.quick else arguments.rounds
    cores = common.cores()
    jobs = 1 if arguments.quick else (arguments.jobs or (max(1, cores // 2) if device == "cuda" else 1))
    workers = 4 if device == "cuda" else max(1, min(2, cores // jobs))  # client threads per run: a core each
    runs = [(dataset, algorithm, precision, seed) for dataset in datasets for algorithm in ALGORITHMS
            for seed in SEEDS for precision in PRECISIONS]
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    try:
        done = (finished_runs(arguments.results, device=name, rounds=rounds, quick=arguments.quick)
                if arguments.resume else {})
    except ValueError as error:
        print(f"bench/bf16_accuracy.py: --resume: {error}", file=sys.stderr)
        return 2
    plans = [(run, run_values(run, quick=arguments.quick, device=device, rounds=rounds))
             for run in runs if run not in done]
    results = list(done.values())

    def record(result: dict) -> None:  # each run as it finishes, so an interrupted study keeps what it did
        results.append(result)
        common.emit("bf16_accuracy_run", {"device": name, "rounds": rounds, **result}, arguments.results,
                    quick=arguments.quick)

    if jobs == 1:
        for run, values in plans:
            record(train(run, values, workers))
    else:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        context = multiprocessing.get_context("spawn")  # CUDA in the children
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            for future in as_completed([pool.submit(train, run, values, workers) for run, values in plans]):
                record(future.result())
    result = verdict({(r["dataset"], r["algorithm"], r["precision"], r["seed"]): r["final_accuracy"]
                      for r in results})
    common.emit("bf16_accuracy", {"device": name, "rounds": rounds, "native_bf16": native,
                                  **result}, arguments.results, quick=arguments.quick)
    print(markdown(result), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
