"""Model evaluation: accuracy, mean cross-entropy and per-class accuracy.

FedCME (Nie et al., arXiv:2307.08574) uses per-class accuracy both for the test metric
and for the evaluation vector of its matching step (Eq. 4):
eps_k[c] = (1 / |D_eval_k,c|) * sum_{(x, y) in D_eval_k,c} g(w_k; x; y), g = 1 if correct.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# Batch size of a no-grad pass over a dataset (test set, local features, evaluation vectors) for a
# model that names none: each architecture of fedcme_core.models names its own largest batch that
# pays (`inference_batch_size`, BENCHMARKS.md "Evaluation").
INFERENCE_BATCH_SIZE = 128


@dataclass(frozen=True)
class EvalResult:
    """Metrics of one model on one labelled set."""

    accuracy: float
    loss: float  # mean cross-entropy over the samples
    per_class_accuracy: np.ndarray  # [C] float64, 0 for classes absent from the set
    per_class_count: np.ndarray  # [C] int64
    num_samples: int


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (or buffer); CPU for a stateless model."""
    for tensor in model.parameters():
        return tensor.device
    for tensor in model.buffers():
        return tensor.device
    return torch.device("cpu")


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


def _check_inputs(x: torch.Tensor, y: torch.Tensor, batch_size: int) -> None:
    if len(x) == 0:
        raise ValueError("cannot evaluate on an empty set")
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} samples but y has {len(y)}")
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")


def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    batch_size: int | None = None,
    device: torch.device | str | None = None,
) -> EvalResult:
    """Accuracy, mean cross-entropy and per-class accuracy of `model` on (x, y).

    Batches (default: the model's inference batch) are index slices of the in-memory tensors,
    moved to `device` (default: the model's device). The model is evaluated in eval mode and its
    previous modes restored.
    """
    batch_size = inference_batch_size(model, batch_size)
    _check_inputs(x, y, batch_size)
    target_device = torch.device(device) if device is not None else model_device(model)
    num_samples = len(x)
    correct_per_class = torch.zeros(num_classes, dtype=torch.int64, device=target_device)
    count_per_class = torch.zeros(num_classes, dtype=torch.int64, device=target_device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=target_device)
    with eval_mode(model), torch.inference_mode():
        for start in range(0, num_samples, batch_size):
            inputs = x[start : start + batch_size].to(target_device, non_blocking=True)
            labels = y[start : start + batch_size].to(target_device, non_blocking=True).long()
            logits = model(inputs)  # [B, C]
            loss_sum += F.cross_entropy(logits.double(), labels, reduction="sum")
            is_correct = logits.argmax(dim=1) == labels  # [B]
            count_per_class += torch.bincount(labels, minlength=num_classes)
            correct_per_class += torch.bincount(labels[is_correct], minlength=num_classes)
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
    )
