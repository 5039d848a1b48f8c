"""Local features, global features with memory, and the feature-alignment loss of FedCME.

Nie et al., "FedCME", arXiv:2307.08574, Eqs. 5-9 (SPEC steps 7, 8, 9):
zeta_k[c] = mean_{x in D_k,c} theta_k(x);  zeta[c] = sum_k (D_k / sum_j D_j) zeta_k[c];
L = CE(w(x), y) + mu * mean_{c in B, d} (mean_{i in B_c} theta(x_i) - zeta[c])^2.

The text leaves two of these open (SPEC.md, "Open readings"): the loss may compare each sample's
feature rather than each class's batch mean (``align_loss: sample``,
L2 = mean_{i in B} reduce_d (theta(x_i) - zeta[y_i])^2), the squared differences may be averaged or
summed (``align_reduction``: mean, sum_dims, sum_all), and zeta may weigh client k by its count of
class c rather than by D_k (``feature_weights: class_counts``, whose memory then stands in only for a
class that no uploading client holds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedcme_core.client.evaluation import check_inputs, eval_mode, inference_batch_size, model_device
from fedcme_core.client.transfers import to_device


@dataclass(frozen=True)
class LocalStatistics:
    """What a client reports after local training (SPEC step 7), from one pass over D_k."""

    feature_means: torch.Tensor  # [C, d] float32 on the CPU, zeros for absent classes
    feature_counts: torch.Tensor  # [C] int64
    evaluation_vector: np.ndarray | None  # [C] float64 per-class accuracy on D_eval_k (Eq. 4), if asked


def local_statistics(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    eval_positions: np.ndarray | None = None,
    batch_size: int | None = None,
) -> LocalStatistics:
    """SPEC step 7 in one eval-mode pass: class means of `model.features(x)` and, for the
    positions `eval_positions` of x (D_eval_k), the per-class accuracy of `model.classify` on them.

    The features of the pass feed both, so the evaluation vector costs one linear layer on
    |D_eval_k| rows instead of a second pass through the backbone. Batches: `batch_size`, else the
    model's inference batch.
    """
    batch_size = inference_batch_size(model, batch_size)
    check_inputs(x, y, batch_size, purpose="compute local features of")
    device = model_device(model)
    in_eval_set = None
    if eval_positions is not None:
        in_eval_set = torch.zeros(len(x), dtype=torch.bool)  # [D_k]
        in_eval_set[torch.as_tensor(eval_positions, dtype=torch.long)] = True
        in_eval_set = in_eval_set.to(device)
    feature_sums: torch.Tensor | None = None  # [C, d] float64
    counts = torch.zeros(num_classes, dtype=torch.int64, device=device)  # [C]
    eval_correct = torch.zeros(num_classes, dtype=torch.int64, device=device)  # [C]
    eval_counts = torch.zeros(num_classes, dtype=torch.int64, device=device)  # [C]
    with eval_mode(model), torch.inference_mode():
        for start in range(0, len(x), batch_size):
            inputs = x[start : start + batch_size].to(device, non_blocking=True)
            labels = y[start : start + batch_size].to(device, non_blocking=True).long()  # [B]
            features = model.features(inputs)  # [B, d]
            if feature_sums is None:
                feature_sums = torch.zeros(num_classes, features.shape[1], dtype=torch.float64, device=device)
            feature_sums.index_add_(0, labels, features.double())
            counts += torch.bincount(labels, minlength=num_classes)
            if in_eval_set is not None:
                chosen = in_eval_set[start : start + batch_size]  # [B]
                eval_labels = labels[chosen]  # [B_eval]
                predictions = model.classify(features[chosen]).argmax(dim=1)  # [B_eval]
                eval_counts += torch.bincount(eval_labels, minlength=num_classes)
                eval_correct += torch.bincount(eval_labels[predictions == eval_labels], minlength=num_classes)
    assert feature_sums is not None
    means = feature_sums / counts.clamp(min=1).unsqueeze(1).double()  # [C, d]
    vector = None
    if in_eval_set is not None:
        present = eval_counts > 0
        vector = torch.where(present, eval_correct.double() / eval_counts.clamp(min=1).double(), 0.0).cpu().numpy()
    return LocalStatistics(feature_means=means.float().cpu(), feature_counts=counts.cpu(), evaluation_vector=vector)


def local_features(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    batch_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SPEC step 7: class means of `model.features(x)` (eval mode) and class counts.

    Returns (means float32 [C, d] on the CPU, zeros for absent classes; counts int64 [C]).
    """
    statistics = local_statistics(model, x, y, num_classes, batch_size=batch_size)
    return statistics.feature_means, statistics.feature_counts


@dataclass(frozen=True)
class GlobalFeatures:
    """The server's global features zeta: one vector per class, where defined."""

    values: torch.Tensor  # [C, d] float32, zeros where undefined
    defined: torch.Tensor  # [C] bool

    @classmethod
    def empty(cls, num_classes: int, dim: int) -> GlobalFeatures:
        """No class defined (round 0)."""
        return cls(
            values=torch.zeros(num_classes, dim, dtype=torch.float32),
            defined=torch.zeros(num_classes, dtype=torch.bool),
        )

    @property
    def any_defined(self) -> bool:
        return bool(self.defined.any())

    def to(self, device: torch.device | str) -> GlobalFeatures:
        """A copy on `device` (move once per round, not once per training step)."""
        return GlobalFeatures(values=self.values.to(device), defined=self.defined.to(device))

    def to_dict(self) -> dict[str, torch.Tensor]:
        """Plain CPU tensors, loadable with `torch.load(..., weights_only=True)`."""
        return {"values": self.values.detach().cpu(), "defined": self.defined.detach().cpu()}

    @classmethod
    def from_dict(cls, state: dict[str, torch.Tensor]) -> GlobalFeatures:
        return cls(values=state["values"].float(), defined=state["defined"].bool())


def aggregate_global_features(
    uploads: Sequence[tuple[torch.Tensor, torch.Tensor, float]],
    previous: GlobalFeatures | None,
    weights: Literal["samples", "class_counts"] = "samples",
) -> GlobalFeatures:
    """SPEC step 8: the weighted mean of the clients' class features, with memory.

    `uploads` holds (means [C, d], counts [C], D_k) per client. With `weights="samples"`, client
    k weighs D_k for every class, and a client lacking class c (count 0) contributes the previous
    global value zeta^t[c] when that is defined, and nothing otherwise; weights are renormalised
    over the clients with a value for c. With `weights="class_counts"`, client k weighs n_k[c],
    so a client lacking c has no weight for it, and the memory zeta^t[c] stands in only for a
    class that no uploading client holds **(choice)**.
    """
    if weights not in ("samples", "class_counts"):
        raise ValueError(f"feature weights must be 'samples' or 'class_counts', got {weights!r}")
    if not uploads:
        raise ValueError("no uploads to aggregate")
    num_classes, dim = uploads[0][0].shape
    if previous is not None:
        previous_values = previous.values.detach().cpu().double()  # [C, d]
        previous_defined = previous.defined.detach().cpu().bool()  # [C]
        if previous_values.shape != (num_classes, dim):
            raise ValueError(
                f"previous global features have shape {tuple(previous_values.shape)}, "
                f"uploads have {(num_classes, dim)}"
            )
    else:
        previous_values = torch.zeros(num_classes, dim, dtype=torch.float64)
        previous_defined = torch.zeros(num_classes, dtype=torch.bool)

    weighted_sum = torch.zeros(num_classes, dim, dtype=torch.float64)  # [C, d]
    weight_sum = torch.zeros(num_classes, dtype=torch.float64)  # [C]
    for means, counts, weight in uploads:
        if means.shape != (num_classes, dim) or counts.shape != (num_classes,):
            raise ValueError(
                f"upload shapes {tuple(means.shape)}, {tuple(counts.shape)} differ from "
                f"{(num_classes, dim)}, {(num_classes,)}"
            )
        if not weight > 0:
            raise ValueError(f"client weights must be positive, got {weight}")
        counts = counts.detach().cpu()
        holds_class = counts > 0  # [C]
        if weights == "class_counts":
            class_weights = counts.double()  # [C]: n_k[c]
            client_values = means.detach().cpu().double()  # [C, d]
        else:
            # Memory mechanism: the previous global feature stands in for a missing class.
            client_values = torch.where(
                holds_class.unsqueeze(1), means.detach().cpu().double(), previous_values
            )  # [C, d]
            class_weights = (holds_class | previous_defined).double() * float(weight)  # [C]: D_k
        weighted_sum += class_weights.unsqueeze(1) * client_values
        weight_sum += class_weights
    values = weighted_sum / weight_sum.clamp(min=torch.finfo(torch.float64).tiny).unsqueeze(1)  # [C, d]
    # A class with no weight this round keeps its memory (with D_k weights it already has it).
    kept = (weight_sum == 0) & previous_defined  # [C]
    values = torch.where(kept.unsqueeze(1), previous_values, values)
    return GlobalFeatures(values=values.float(), defined=(weight_sum > 0) | previous_defined)


AlignReduction = Literal["mean", "sum_dims", "sum_all"]
ALIGN_REDUCTIONS: tuple[str, ...] = ("mean", "sum_dims", "sum_all")


def alignment_loss(
    features: torch.Tensor,
    labels: torch.Tensor,
    global_features: GlobalFeatures,
    reduction: AlignReduction = "mean",
    loss: Literal["class_mean", "sample"] = "class_mean",
    selected: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """SPEC step 9: L2 between `features` [B, d] and the global features, None when no sample's
    class has a global feature. Gradients flow into `features` only.

    The compared vectors are, with `loss="class_mean"`, the Q batch class means whose class has a
    global feature (mean_{i in B_c} theta(x_i) against zeta[c]), and with `loss="sample"`, the Q
    samples whose class has one (theta(x_i) against zeta[y_i]). Of their squared differences [Q, d],
    `reduction` takes

    - ``mean``: the mean over the Q vectors and the d dimensions (`F.mse_loss`);
    - ``sum_dims``: the sum over the d dimensions (the squared norm), then the mean over the Q vectors,
      d times ``mean``;
    - ``sum_all``: the sum over the Q vectors and the d dimensions, Q x d times ``mean``.

    `selected`: which Q are compared, planned on the host (:func:`alignment_plan`): the classes [Q]
    (class_mean) or the batch positions [Q] (sample), int64 on the features' device, where `labels`
    and `global_features` are too; the call then neither moves nor reads back a tensor. None: found
    here, from the labels on the device (a GPU waits for the host).
    """
    if reduction not in ALIGN_REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(ALIGN_REDUCTIONS)}, got {reduction!r}")
    if loss not in ("class_mean", "sample"):
        raise ValueError(f"align_loss must be 'class_mean' or 'sample', got {loss!r}")
    if selected is not None:
        if selected.shape[0] == 0:
            return None
        if loss == "sample":
            return _sample_loss(features, labels.long(), global_features.values, selected, reduction)
        return _class_mean_loss(features, labels.long(), global_features.values, selected, reduction)
    labels = labels.to(features.device).long()  # [B]
    defined = global_features.defined.to(features.device)  # [C]
    values = global_features.values.to(features.device)  # [C, d]
    if loss == "sample":
        qualifies = defined[labels]  # [B]
        if not bool(qualifies.any()):
            return None
        return _sample_loss(features, labels, values, qualifies.nonzero().squeeze(1), reduction)
    qualifies = (_one_hot(labels, values.shape[0], features.dtype).sum(dim=0) > 0) & defined  # [C]
    if not bool(qualifies.any()):
        return None
    return _class_mean_loss(features, labels, values, qualifies.nonzero().squeeze(1), reduction)


def alignment_plan(batch_labels: Sequence[torch.Tensor], defined: torch.Tensor,
                   loss: Literal["class_mean", "sample"], device: torch.device) -> list[torch.Tensor]:
    """Each batch's `selected` for :func:`alignment_loss`, from its labels [B_i] and zeta's defined
    classes [C], both on the CPU: the classes present in the batch with a global feature
    (class_mean) or the positions whose class has one (sample), ascending, int64 [Q_i]; moved to
    `device` together, once (an epoch's plan)."""
    defined = defined.cpu().bool()
    per_batch = []
    for labels in batch_labels:
        labels = labels.long()
        if loss == "sample":
            per_batch.append(defined[labels].nonzero().squeeze(1))
        else:
            present = torch.bincount(labels, minlength=defined.shape[0]) > 0
            per_batch.append((present & defined).nonzero().squeeze(1))
    if not per_batch:
        return []
    packed = to_device(torch.cat(per_batch), device)
    return list(torch.split(packed, [len(selected) for selected in per_batch]))


def _one_hot(labels: torch.Tensor, num_classes: int, dtype: torch.dtype) -> torch.Tensor:
    """[B] -> [B, C] in `dtype`, as F.one_hot, without its bounds check (a read-back on the CPU)."""
    return (labels[:, None] == torch.arange(num_classes, device=labels.device)).to(dtype)


def _class_mean_loss(features: torch.Tensor, labels: torch.Tensor, values: torch.Tensor, classes: torch.Tensor,
                     reduction: AlignReduction) -> torch.Tensor:
    """The class-mean L2 over `classes` [Q] (present in the batch, with a global feature)."""
    one_hot = _one_hot(labels, values.shape[0], features.dtype)  # [B, C]
    class_counts = one_hot.sum(dim=0)  # [C]
    class_sums = one_hot[:, classes].T @ features  # [Q, d]
    batch_class_means = class_sums / class_counts[classes].unsqueeze(1)  # [Q, d]
    targets = values.to(dtype=features.dtype)[classes].detach()  # [Q, d]
    if reduction == "sum_dims":
        return F.mse_loss(batch_class_means, targets, reduction="none").sum(dim=1).mean()
    return F.mse_loss(batch_class_means, targets, reduction="mean" if reduction == "mean" else "sum")


def _sample_loss(features: torch.Tensor, labels: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
                 reduction: AlignReduction) -> torch.Tensor:
    """`align_loss: sample`: reduce_{i in positions, d} (theta(x_i) - zeta[y_i])^2 over the positions [Q]
    whose class has a global feature (``mean`` and ``sum_dims`` average over them, ``sum_all`` sums)."""
    targets = values.to(dtype=features.dtype)[labels[positions]].detach()  # [Q, d]
    squared = (features[positions] - targets).square()  # [Q, d]
    if reduction == "sum_all":
        return squared.sum()
    per_sample = squared.mean(dim=1) if reduction == "mean" else squared.sum(dim=1)  # [Q]
    return per_sample.mean()
