"""Local-training throughput: our client loop against a bare PyTorch loop on the same batches.

Prints one JSON line per model and appends it to bench/results.jsonl. The loops train a model
(`--model all`: `fmnist_cnn` and `cifar_cnn`, the targets' models; or any one model) on the same
in-memory tensors, batch size, optimizer, thread count and compute (`--compute`: layout and
precision, as ``training.channels_last`` / ``training.precision`` choose them): a bare PyTorch loop,
our FedAvg client (``training.train_epochs`` with no hooks) and our FedCME client with feature
alignment on. Ratios are measured side by side in one process (variants interleaved, medians of
repeats); `samples_per_second` is each variant's training throughput. Targets: FedAvg/bare >= 0.95,
FedCME/bare >= 0.85.

    .venv/bin/python bench/local_training.py [--model all|NAME] [--compute nchw+fp32|channels_last+bf16|...]
        [--samples N] [--threads 1] [--repeats 9] [--quick]
"""

from __future__ import annotations

import common
import torch
import torch.nn.functional as F

from fedcme_core.algorithms.fedcme import AlignmentHooks, FedCMEConfig
from fedcme_core.client.compute import Compute
from fedcme_core.config.schema import TrainingConfig
from fedcme_core.client.features import GlobalFeatures
from fedcme_core.client.models import MODEL_INPUT_SHAPES, build_model
from fedcme_core.common.seeding import torch_generator
from fedcme_core.client.training import ClientHooks, start_local_run, train_epochs

# Samples per timed epoch (full mode): about one second of training each on one thread (in fp32, NCHW).
DEFAULT_SAMPLES = {"fmnist_cnn": 1536, "cifar_cnn": 4096, "cifar_cnn64": 1024, "resnet18_gn": 64}
TARGET_MODELS = ("cifar_cnn", "fmnist_cnn")  # `--model all`
COMPUTES = {Compute(layout, precision).name: Compute(layout, precision)
            for layout in (False, True) for precision in ("fp32", "bf16")}
CPU = torch.device("cpu")
QUICK_SAMPLES = 128  # quick mode: two batches per timed epoch, 1 repeat (after the untimed warm-up)


def bare_loop(model, inputs, labels, batch_size, config: TrainingConfig, compute: Compute) -> None:
    """One epoch of plain SGD: inputs [N, C_in, H, W] already in `compute`'s layout, labels [N]."""
    model = compute.model(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    order = torch.randperm(labels.shape[0])
    model.train()
    for start in range(0, labels.shape[0], batch_size):
        batch = order[start : start + batch_size]
        with compute.autocast(CPU):
            loss = F.cross_entropy(model(inputs[batch]), labels[batch])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def ours(model, inputs, labels, batch_size, config: TrainingConfig, hooks: ClientHooks, compute: Compute) -> None:
    run = start_local_run(compute.model(model), config, torch_generator(0, "bench"))
    train_epochs(run, inputs, labels, hooks, 1, batch_size, compute=compute)


def measure(model_name: str, samples: int, batch_size: int, repeats: int, compute: Compute) -> dict:
    config = TrainingConfig(batch_size=batch_size)
    generator = torch.Generator().manual_seed(0)
    inputs = compute.layout(torch.randn(samples, *MODEL_INPUT_SHAPES[model_name], generator=generator))
    labels = torch.randint(10, (samples,), generator=generator)
    feature_dim = build_model(model_name).feature_dim
    alignment = AlignmentHooks(
        GlobalFeatures(values=torch.randn(10, feature_dim), defined=torch.ones(10, dtype=torch.bool)),
        FedCMEConfig(mu=0.01), device=torch.device("cpu"),
    )
    variants = {
        "bare_pytorch": lambda: bare_loop(build_model(model_name, seed=0), inputs, labels, batch_size, config, compute),
        "fedavg": lambda: ours(build_model(model_name, seed=0), inputs, labels, batch_size, config, ClientHooks(), compute),
        "fedcme_alignment": lambda: ours(build_model(model_name, seed=0), inputs, labels, batch_size, config, alignment,
                                         compute),
    }
    seconds = common.interleaved(variants, repeats)
    throughput = {name: samples / common.median(values) for name, values in seconds.items()}
    return {
        "model": model_name,
        "samples": samples,
        "batch_size": batch_size,
        "compute": compute.name,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "samples_per_second": common.rounded(throughput, 1),
        "ratio_fedavg_vs_bare": common.ratio(throughput["fedavg"], throughput["bare_pytorch"]),
        "ratio_fedcme_vs_bare": common.ratio(throughput["fedcme_alignment"], throughput["bare_pytorch"]),
        "targets": {"ratio_fedavg_vs_bare": ">= 0.95", "ratio_fedcme_vs_bare": ">= 0.85"},
    }


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--model", default="all", choices=["all", *sorted(MODEL_INPUT_SHAPES)])
    parser.add_argument("--compute", default="nchw+fp32", choices=sorted(COMPUTES), help="layout and precision")
    parser.add_argument("--samples", type=int, default=None, help="samples per timed epoch (default: per model)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    repeats = arguments.repeats or (1 if arguments.quick else 9)
    models = list(TARGET_MODELS) if arguments.model == "all" else [arguments.model]
    for model_name in models:
        samples = arguments.samples or (QUICK_SAMPLES if arguments.quick else DEFAULT_SAMPLES[model_name])
        record = measure(model_name, samples, arguments.batch_size, repeats, COMPUTES[arguments.compute])
        common.emit("local_training", record, arguments.results, quick=arguments.quick)


if __name__ == "__main__":
    main()
