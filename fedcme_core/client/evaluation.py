"""Model evaluation: accuracy, mean cross-entropy and per-class accuracy; local accuracy on test shares.

FedCME (Nie et al., arXiv:2307.08574) uses per-class accuracy both for the test metric
and for the evaluation vector of its matching step (Eq. 4):
eps_k[c] = (1 / |D_eval_k,c|) * sum_{(x, y) in D_eval_k,c} g(w_k; x; y), g = 1 if correct.

:func:`local_accuracy` scores one pass's per-sample correctness on the clients' shares of the test set
(:func:`fedcme_core.data.local_shares.local_shares`): no second pass over the test set.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# Batch size of a no-grad pass over a dataset (test set, local features, evaluation vectors) for a
# model that names none: each architecture of fedcme_core.client.models names its own largest batch that
# pays (`inference_batch_size`, BENCHMARKS.md, "test-set evaluation").
INFERENCE_BATCH_SIZE = 128


@dataclass(frozen=True)
class EvalResult:
    """Metrics of one model on one labelled set."""

    accuracy: float
    loss: float  # mean cross-entropy over the samples
    per_class_accuracy: np.ndarray  # [C] float64, 0 for classes absent from the set
    per_class_count: np.ndarray  # [C] int64
    num_samples: int
    correct: np.ndarray | None = None  # [N] bool, sample i classified right; only when asked (`per_sample`)


@dataclass(frozen=True)
class LocalAccuracy:
    """One model's accuracy on the clients' test shares: `weighted` (the mean over clients weighted by
    share size), `client_mean` (each client once) and `p10` (the 10th-percentile client), over the
    clients whose share is not empty."""

    weighted: float
    client_mean: float
    p10: float


def local_accuracy(correct: np.ndarray, shares: Sequence[np.ndarray]) -> LocalAccuracy | None:
    """The accuracy of one model on each client's test share, summarised; None when every share is empty.

    `correct` [N] bool: test sample i classified right; `shares`: client k's test indices S_k (disjoint).
    a_k = |{i in S_k: correct_i}| / |S_k| for each non-empty share; weighted = sum_k |S_k| a_k / sum_k |S_k|,
    client_mean = mean_k a_k, p10 = the 10th percentile of the a_k (numpy's linear interpolation).
    For one global model, `weighted` is the accuracy on the union of the shares: when the shares cover
    the test set (every class is trained on by some client) it equals the test accuracy exactly, so it
    is no new information; `client_mean` and `p10` are, as they weigh each client once.
    """
    correct = np.asarray(correct, dtype=bool)
    sizes = np.array([len(share) for share in shares], dtype=np.int64)
    hits = np.array([int(correct[np.asarray(share, dtype=np.int64)].sum()) for share in shares], dtype=np.int64)
    present = sizes > 0
    if not present.any():
        return None
    accuracies = hits[present] / sizes[present]
    return LocalAccuracy(weighted=float(hits.sum() / sizes.sum()), client_mean=float(accuracies.mean()),
                         p10=float(np.percentile(accuracies, 10)))


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (or buffer); CPU for a stateless model."""
    for tensor in model.parameters():
        return tensor.device
    for tensor in model.buffers():
        return tensor.device
    return torch.device("cpu")


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block with `count` torch intra-op threads, then restore the previous count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Put every submodule in eval mode, restoring each one's previous mode on exit."""
    previous_modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, was_training in previous_modes:
            module.training = was_training


def inference_batch_size(model: nn.Module, batch_size: int | None = None) -> int:
    """`batch_size` when given, else the model's own no-grad batch, else INFERENCE_BATCH_SIZE."""
    if batch_size is not None:
        return batch_size
    return getattr(model, "inference_batch_size", None) or INFERENCE_BATCH_SIZE


def check_inputs(x: torch.Tensor, y: torch.Tensor, batch_size: int, purpose: str = "evaluate on") -> None:
    """Raises ValueError in one line when x [N, ...] and y [N] cannot be `purpose`d in batches of `batch_size`."""
    if len(x) == 0:
        raise ValueError(f"cannot {purpose} an empty set")
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} samples but y has {len(y)}")
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")


def _batch_figures(model: nn.Module, x: torch.Tensor, y: torch.Tensor, start: int, stop: int, num_classes: int,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(summed cross-entropy in float64, per-class count, per-class correct, per-sample correct [B]) of one batch."""
    with torch.inference_mode():  # thread-local: entered on the thread that runs the batch
        inputs = x[start:stop].to(device, non_blocking=True)
        labels = y[start:stop].to(device, non_blocking=True).long()
        logits = model(inputs)  # [B, C]
        loss_sum = F.cross_entropy(logits.double(), labels, reduction="sum")
        is_correct = logits.argmax(dim=1) == labels  # [B]
        return (loss_sum, torch.bincount(labels, minlength=num_classes),
                torch.bincount(labels[is_correct], minlength=num_classes), is_correct)


def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    batch_size: int | None = None,
    device: torch.device | str | None = None,
    workers: int = 1,
    per_sample: bool = False,
) -> EvalResult:
    """Accuracy, mean cross-entropy and per-class accuracy of `model` on (x, y).

    Batches (default: the model's inference batch) are index slices of the in-memory tensors,
    moved to `device` (default: the model's device). The model is evaluated in eval mode and its
    previous modes restored. With `workers` > 1 on a CPU, that many batches run at once, each on
    one torch thread, and their figures are summed in batch order: the result is the one-thread
    result bit for bit on every CPU (one GEMM split over several threads may round differently,
    as MKL's does on AVX-512). With `per_sample`, the result also holds each sample's correctness
    (`correct`, from the same pass: what :func:`local_accuracy` scores).
    """
    batch_size = inference_batch_size(model, batch_size)
    check_inputs(x, y, batch_size)
    target_device = torch.device(device) if device is not None else model_device(model)
    num_samples = len(x)
    starts = range(0, num_samples, batch_size)

    def figures(start: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return _batch_figures(model, x, y, start, start + batch_size, num_classes, target_device)

    with eval_mode(model):
        if workers > 1 and target_device.type == "cpu" and len(starts) > 1:
            with torch_threads(1), ThreadPoolExecutor(min(workers, len(starts))) as pool:
                batches = list(pool.map(figures, starts))
        else:
            batches = [figures(start) for start in starts]
    loss_sum = torch.zeros((), dtype=torch.float64, device=target_device)
    count_per_class = torch.zeros(num_classes, dtype=torch.int64, device=target_device)
    correct_per_class = torch.zeros(num_classes, dtype=torch.int64, device=target_device)
    for batch_loss, batch_count, batch_correct, _ in batches:  # batch order, as one thread adds them
        loss_sum += batch_loss
        count_per_class += batch_count
        correct_per_class += batch_correct
    counts = count_per_class.cpu().numpy().astype(np.int64)
    corrects = correct_per_class.cpu().numpy().astype(np.int64)
    per_class_accuracy = np.zeros(num_classes, dtype=np.float64)
    present = counts > 0
    per_class_accuracy[present] = corrects[present] / counts[present]
    return EvalResult(
        accuracy=float(corrects.sum() / num_samples),
        loss=float(loss_sum.item() / num_samples),
        per_class_accuracy=per_class_accuracy,
        per_class_count=counts,
        num_samples=num_samples,
        correct=torch.cat([batch[3] for batch in batches]).cpu().numpy() if per_sample else None,
    )
