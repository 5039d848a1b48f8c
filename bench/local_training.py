"""Local-training throughput: our client loop against a bare PyTorch loop on the same batches.

Prints one JSON line per measurement and appends it to bench/results.jsonl. Both loops
train `fmnist_cnn` (or `cifar_cnn`) on the same in-memory tensors, batch size, optimizer
and thread count; the ratio is measured side by side in one process (medians of repeats).

    .venv/bin/python bench/local_training.py [--model fmnist_cnn] [--samples 2048] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from fedcme_core.algorithms.fedcme import AlignmentHooks
from fedcme_core.config import TrainingConfig
from fedcme_core.features import GlobalFeatures
from fedcme_core.models import MODEL_INPUT_SHAPES, build_model
from fedcme_core.seeding import torch_generator
from fedcme_core.training import ClientHooks, start_local_run, train_epochs

RESULTS = Path(__file__).with_name("results.jsonl")


def bare_loop(model, inputs, labels, batch_size, config: TrainingConfig) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    order = torch.randperm(labels.shape[0])
    model.train()
    for start in range(0, labels.shape[0], batch_size):
        batch = order[start : start + batch_size]
        loss = F.cross_entropy(model(inputs[batch]), labels[batch])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def ours(model, inputs, labels, batch_size, config: TrainingConfig, hooks: ClientHooks) -> None:
    run = start_local_run(model, config, torch_generator(0, "bench"))
    train_epochs(run, inputs, labels, hooks, 1, batch_size)


def timed(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="fmnist_cnn", choices=sorted(MODEL_INPUT_SHAPES))
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    config = TrainingConfig(batch_size=arguments.batch_size)
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(arguments.samples, *MODEL_INPUT_SHAPES[arguments.model], generator=generator)
    labels = torch.randint(10, (arguments.samples,), generator=generator)
    feature_dim = build_model(arguments.model).feature_dim
    alignment = AlignmentHooks(
        GlobalFeatures(values=torch.randn(10, feature_dim), defined=torch.ones(10, dtype=torch.bool)),
        mu=0.01, reduction="mean", device=torch.device("cpu"),
    )
    variants = {
        "bare_pytorch": lambda model: bare_loop(model, inputs, labels, arguments.batch_size, config),
        "fedavg": lambda model: ours(model, inputs, labels, arguments.batch_size, config, ClientHooks()),
        "fedcme_alignment": lambda model: ours(model, inputs, labels, arguments.batch_size, config, alignment),
    }
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for name, action in variants.items():  # warm-up
        action(build_model(arguments.model, seed=0))
    for _ in range(arguments.repeats):  # interleaved, so machine noise hits every variant alike
        for name, action in variants.items():
            seconds[name].append(timed(lambda: action(build_model(arguments.model, seed=0))))
    throughput = {name: arguments.samples / statistics.median(values) for name, values in seconds.items()}
    record = {
        "bench": "local_training",
        "model": arguments.model,
        "samples": arguments.samples,
        "batch_size": arguments.batch_size,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": f"{platform.machine()} {torch.get_num_threads()}t/{__import__('os').cpu_count()} cores",
        "samples_per_second": {name: round(value, 1) for name, value in throughput.items()},
        "ratio_fedavg_vs_bare": round(throughput["fedavg"] / throughput["bare_pytorch"], 3),
        "ratio_fedcme_vs_bare": round(throughput["fedcme_alignment"] / throughput["bare_pytorch"], 3),
    }
    line = json.dumps(record)
    print(line)
    with RESULTS.open("a", encoding="utf-8") as handle:
        handle.write(line + "\n")


if __name__ == "__main__":
    main()
