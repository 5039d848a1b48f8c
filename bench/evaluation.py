"""Evaluation throughput: test-set evaluation of 10,000 Fashion-MNIST-shaped images with
``fedcme_core.client.evaluation.evaluate`` against a bare ``torch.no_grad()`` loop.

Both evaluate `fmnist_cnn` on the same tensors (the real Fashion-MNIST test set when the data
mirror is there, else random images of its shape) in batches of the same size, and compute
the same figures (accuracy and mean cross-entropy; ours also per-class accuracy, with a float64
loss sum), at fmnist_cnn's inference batch size (``MODEL_INFERENCE_BATCH``); ours at the batch size
before commit 3fa08bb, 1024, is timed beside (``ratio_evaluate_vs_before``). Quick mode uses 512 random images (no dataset loading), 1 repeat.
Variants interleaved, medians of repeats. Target: ours / bare >= 0.95.

A second record, ``evaluation_layouts``, is the batch and layout sweep behind the inference batch:
``evaluate`` of fmnist_cnn and cifar_cnn on their test sets (channels_last or not; a channels_last model
fed the NCHW test set, as a round's evaluation does, and fed images already laid out) at batches
64 ... 1024, and per layout the largest batch within 5% of that layout's best (the largest that pays).
It also times the round's own two calls at 128, 256 and the model's ``inference_batch_size``: the
test set on every core (``evaluate_step``: a batch per core on one thread each, "workers", beside each
batch split over every core, "threads", as before 2026-12-05) and SPEC step 7
(``local_statistics``) on 5,000 training images on one thread, both with a channels_last model.

    .venv/bin/python bench/evaluation.py [--samples 10000] [--repeats 9] [--quick] [--sweep-repeats 5]
"""

from __future__ import annotations

import functools

import common
import torch
import torch.nn.functional as F

from fedcme_core.client.compute import Compute
from fedcme_core.client.architectures import MODEL_INFERENCE_BATCH
from fedcme_core.client.evaluation import evaluate
from fedcme_core.client.features import local_statistics
from fedcme_core.client.models import build_model

SWEEP_BATCHES = (64, 128, 256, 512, 1024)
PAYS = 0.95  # a larger batch pays while it keeps 95% of the layout's best throughput
SHAPES = {"fmnist": (1, 28, 28), "cifar10": (3, 32, 32)}
MODELS = {"fmnist": "fmnist_cnn", "cifar10": "cifar_cnn"}


def bare_evaluation(model, inputs, labels, batch_size: int) -> tuple[float, float]:
    model.eval()
    correct, loss_sum = 0, 0.0
    with torch.no_grad():
        for start in range(0, labels.shape[0], batch_size):
            logits = model(inputs[start : start + batch_size])
            batch_labels = labels[start : start + batch_size]
            loss_sum += F.cross_entropy(logits, batch_labels, reduction="sum").item()
            correct += (logits.argmax(dim=1) == batch_labels).sum().item()
    return correct / labels.shape[0], loss_sum / labels.shape[0]


@functools.lru_cache(maxsize=1)
def real_dataset(dataset_name: str):
    """The real dataset from the mirror, loaded once for its test and training images (None without a mirror)."""
    if common.data_mirror() is None:
        return None
    from fedcme_core.data.datasets import load_dataset

    return load_dataset(dataset_name, data_dir=common.DATA_CACHE, mirror=common.data_mirror())


def test_images(samples: int, real: bool, dataset_name: str = "fmnist") -> tuple[torch.Tensor, torch.Tensor, str]:
    dataset = real_dataset(dataset_name) if real else None
    if dataset is not None and samples <= dataset.x_test.shape[0]:
        return dataset.x_test[:samples].contiguous(), dataset.y_test[:samples].contiguous(), f"{dataset_name} test set"
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(samples, *SHAPES[dataset_name], generator=generator)
    return inputs, torch.randint(10, (samples,), generator=generator), "random images"


def training_images(samples: int, real: bool, dataset_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    dataset = real_dataset(dataset_name) if real else None
    if dataset is not None:
        return dataset.x_train[:samples].contiguous(), dataset.y_train[:samples].contiguous()
    generator = torch.Generator().manual_seed(1)
    return torch.randn(samples, *SHAPES[dataset_name], generator=generator), torch.randint(10, (samples,), generator=generator)


def round_calls(model_name: str, test: tuple[torch.Tensor, torch.Tensor], train: tuple[torch.Tensor, torch.Tensor],
                repeats: int) -> dict:
    """Seconds of the round's test-set evaluation (every core, two ways) and step 7 (one thread) at 128, 256 and the model's batch."""
    layout = Compute(True)
    model = layout.model(build_model(model_name, seed=0))
    client_x, client_y = layout.layout(train[0]), train[1]
    positions = torch.arange(0, len(client_y), 10).numpy()

    def on_threads(threads: int, action):
        def run():
            torch.set_num_threads(threads)
            action()
        return run

    variants = {}
    for batch in sorted({128, 256, model.inference_batch_size}):
        variants[f"test set, {common.cores()} threads, batch {batch}"] = on_threads(  # before: one batch split over the cores
            common.cores(), lambda b=batch: evaluate(model, *test, 10, batch_size=b))
        variants[f"test set, {common.cores()} workers, batch {batch}"] = on_threads(  # evaluate_step: a batch per core
            1, lambda b=batch: evaluate(model, *test, 10, batch_size=b, workers=common.cores()))
        variants[f"step 7, {len(client_y)} images, 1 thread, batch {batch}"] = on_threads(
            1, lambda b=batch: local_statistics(model, client_x, client_y, 10, eval_positions=positions, batch_size=b))
    seconds = common.interleaved(variants, repeats)
    torch.set_num_threads(1)
    return {"inference_batch_size": model.inference_batch_size,
            "seconds": {name: round(common.median(values), 4) for name, values in seconds.items()}}


def largest_that_pays(by_batch: dict[int, float]) -> int:
    best = max(by_batch.values())
    return max(batch for batch, rate in by_batch.items() if rate >= PAYS * best)


def layout_sweep(samples: int, repeats: int, real: bool, batches: tuple[int, ...]) -> dict:
    """samples/s of `evaluate` per model, layout and batch, and the largest batch that pays per layout."""
    figures, sources, calls = {}, {}, {}
    for dataset_name, model_name in MODELS.items():
        inputs, labels, sources[model_name] = test_images(samples, real, dataset_name)
        calls[model_name] = round_calls(model_name, (inputs, labels),
                                        training_images(min(samples, 5000), real, dataset_name), repeats)
        layouts = {"nchw": (Compute(False), inputs),
                   "channels_last, NCHW images": (Compute(True), inputs),
                   "channels_last, laid-out images": (Compute(True), Compute(True).layout(inputs))}
        variants = {}
        for layout, (compute, images) in layouts.items():
            model = compute.model(build_model(model_name, seed=0))
            for batch in batches:
                variants[(layout, batch)] = (lambda m=model, x=images, b=batch: evaluate(m, x, labels, 10, batch_size=b))
        seconds = common.interleaved(variants, repeats)
        rates = {key: samples / common.median(values) for key, values in seconds.items()}
        figures[model_name] = {
            layout: {"samples_per_second": {str(batch): round(rates[(layout, batch)], 1) for batch in batches},
                     "largest_batch_that_pays": largest_that_pays({batch: rates[(layout, batch)] for batch in batches})}
            for layout in layouts
        }
    return {"data": sources, "samples": samples, "repeats": repeats, "pays": PAYS, "figures": figures,
            "inference_batch_size": MODEL_INFERENCE_BATCH, "round_calls": calls}


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--samples", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=MODEL_INFERENCE_BATCH["fmnist_cnn"])
    parser.add_argument("--before-batch-size", type=int, default=1024, help="the batch size before commit 3fa08bb, timed beside")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sweep-repeats", type=int, default=None, help="repeats of the batch and layout sweep (default 5)")
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    samples = arguments.samples or (512 if arguments.quick else 10000)
    repeats = arguments.repeats or (1 if arguments.quick else 9)
    inputs, labels, source = test_images(samples, real=not arguments.quick)
    model = build_model("fmnist_cnn", seed=0)
    batch_size = arguments.batch_size
    variants = {
        "bare_no_grad": lambda: bare_evaluation(model, inputs, labels, batch_size),
        "fedcme_evaluate": lambda: evaluate(model, inputs, labels, 10, batch_size=batch_size),
        "fedcme_evaluate_before": lambda: evaluate(model, inputs, labels, 10, batch_size=arguments.before_batch_size),
    }
    seconds = common.interleaved(variants, repeats)
    throughput = {name: samples / common.median(values) for name, values in seconds.items()}
    ours, bare = evaluate(model, inputs, labels, 10, batch_size=batch_size), bare_evaluation(model, inputs, labels, batch_size)
    record = {
        "model": "fmnist_cnn",
        "data": source,
        "samples": samples,
        "batch_size": batch_size,
        "repeats": repeats,
        "samples_per_second": common.rounded(throughput, 1),
        "ratio_evaluate_vs_bare": common.ratio(throughput["fedcme_evaluate"], throughput["bare_no_grad"]),
        "before_batch_size": arguments.before_batch_size,
        "ratio_evaluate_vs_before": common.ratio(throughput["fedcme_evaluate"], throughput["fedcme_evaluate_before"]),
        "same_accuracy": abs(ours.accuracy - bare[0]) < 1e-12,
        "target": "ratio_evaluate_vs_bare >= 0.95",
    }
    common.emit("evaluation", record, arguments.results, quick=arguments.quick)
    sweep = layout_sweep(samples, arguments.sweep_repeats or (1 if arguments.quick else 5), real=not arguments.quick,
                         batches=SWEEP_BATCHES[:2] if arguments.quick else SWEEP_BATCHES)
    common.emit("evaluation_layouts", sweep, arguments.results, quick=arguments.quick)


if __name__ == "__main__":
    main()
