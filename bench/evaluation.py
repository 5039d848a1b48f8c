"""Evaluation throughput: test-set evaluation of 10,000 Fashion-MNIST-shaped images with
``fedcme_core.evaluation.evaluate`` against a bare ``torch.no_grad()`` loop.

Both evaluate `fmnist_cnn` on the same tensors (the real Fashion-MNIST test set when the data
mirror is there, else random images of its shape) in batches of the same size, and compute
the same figures (accuracy and mean cross-entropy; ours also per-class accuracy, with a float64
loss sum), at the core's inference batch size (128); ours at the earlier batch size of 1024 is
timed beside (``ratio_evaluate_vs_before``). Quick mode uses 512 random images (no dataset loading), 1 repeat.
Variants interleaved, medians of repeats. Target: ours / bare >= 0.95.

    .venv/bin/python bench/evaluation.py [--samples 10000] [--repeats 9] [--quick]
"""

from __future__ import annotations

import common
import torch
import torch.nn.functional as F

from fedcme_core.evaluation import INFERENCE_BATCH_SIZE, evaluate
from fedcme_core.models import build_model


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


def test_images(samples: int, real: bool) -> tuple[torch.Tensor, torch.Tensor, str]:
    if real and common.data_mirror() is not None:
        from fedcme_core.data import load_dataset

        dataset = load_dataset("fmnist", data_dir=common.DATA_CACHE, mirror=common.data_mirror())
        if samples <= dataset.x_test.shape[0]:
            return dataset.x_test[:samples].contiguous(), dataset.y_test[:samples].contiguous(), "fmnist test set"
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(samples, 1, 28, 28, generator=generator)
    return inputs, torch.randint(10, (samples,), generator=generator), "random images"


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--samples", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=INFERENCE_BATCH_SIZE)
    parser.add_argument("--before-batch-size", type=int, default=1024, help="the batch size before commit 3fa08bb, timed beside")
    parser.add_argument("--threads", type=int, default=1)
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


if __name__ == "__main__":
    main()
