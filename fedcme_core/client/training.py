"""The one local-training loop of every algorithm, resumable at epoch boundaries.

Local objective of client k in round t (SPEC.md, "Local training"):

    L = CE(transform_logits(classify(features(x))), y) + extra_loss(x, y, features, logits)

minimised by SGD (lr, momentum, weight decay) over mini-batches of the client's in-memory
tensors. Algorithms never copy this loop: FedProx, MOON and FedCME's feature alignment
supply ``extra_loss``, FedRS ``transform_logits``, SCAFFOLD ``after_step`` (see
``fedcme_core.algorithms``).

A local run can stop after any epoch, be written to a checkpoint (model, optimizer and
the batch-order RNG state) and continue later to exactly the same result as a run
straight through: FedCME stops at floor(E/2) to exchange classifiers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from .augment import Augmentation
from .checkpoints import CheckpointError, load_checkpoint, save_checkpoint
from .compute import Compute
from .models import SplitModel

if TYPE_CHECKING:  # config imports the algorithms, which import this loop
    from .config import TrainingConfig

FP32 = Compute()


class ClientHooks:
    """An algorithm's per-client, per-round hooks into the local loop; these defaults are FedAvg's."""

    def transform_logits(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """logits [B, C] -> logits [B, C] used by the cross-entropy (FedRS: restricted softmax)."""
        return logits

    def extra_loss(
        self, inputs: torch.Tensor, labels: torch.Tensor, features: torch.Tensor, logits: torch.Tensor
    ) -> torch.Tensor | None:
        """A term added to the cross-entropy (features [B, d], logits [B, C]); None adds nothing."""
        return None

    def after_step(self) -> None:
        """Called after each optimizer step (SCAFFOLD: the control-variate correction)."""


@dataclass
class LocalRun:
    """A client's local training in progress: everything needed to resume it exactly."""

    model: SplitModel
    optimizer: torch.optim.SGD
    generator: torch.Generator
    epochs_done: int = 0
    epoch_losses: list[float] = field(default_factory=list)

    @property
    def parameter_names(self) -> list[str]:
        return [name for name, _ in self.model.named_parameters()]


def make_optimizer(model: SplitModel, config: TrainingConfig) -> torch.optim.SGD:
    return torch.optim.SGD(
        model.parameters(), lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay
    )


def start_local_run(model: SplitModel, config: TrainingConfig, generator: torch.Generator) -> LocalRun:
    """A fresh local run from `model` (already holding the global weights)."""
    return LocalRun(model=model, optimizer=make_optimizer(model, config), generator=generator)


def train_epochs(
    run: LocalRun,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    hooks: ClientHooks,
    num_epochs: int,
    batch_size: int,
    compute: Compute = FP32,
    augment: Augmentation | None = None,
) -> None:
    """Train `num_epochs` more epochs in place (Algorithm 2: ClientUpdate's local SGD).

    `compute` sets the precision of the forward pass and the loss (bf16 autocast or fp32);
    the layout is the one `inputs` and the model already have (see fedcme_core.compute).
    `augment` transforms each training batch, drawing from the run's generator (so a resumed
    run draws the same crops and flips; fedcme_core.augment)."""
    model, optimizer = run.model, run.optimizer
    device = next(model.parameters()).device
    num_samples = labels.shape[0]
    model.train()
    for _ in range(num_epochs):
        order = torch.randperm(num_samples, generator=run.generator)
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        for start in range(0, num_samples, batch_size):
            batch = order[start : start + batch_size]
            batch_inputs = inputs[batch].to(device, non_blocking=True)  # [B, C_in, H, W]
            batch_labels = labels[batch].to(device, non_blocking=True)  # [B]
            if augment is not None:
                batch_inputs = augment(batch_inputs, run.generator)  # [B, C_in, H, W]
            with compute.autocast(device):
                features = model.features(batch_inputs)  # [B, d]
                logits = hooks.transform_logits(model.classify(features), batch_labels)  # [B, C]
                loss = F.cross_entropy(logits, batch_labels)
                extra = hooks.extra_loss(batch_inputs, batch_labels, features, logits)
                if extra is not None:
                    loss = loss + extra
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            hooks.after_step()
            loss_sum += loss.detach() * batch.shape[0]
        run.epoch_losses.append(float(loss_sum) / num_samples)
        run.epochs_done += 1


def local_run_payload(run: LocalRun, **metadata: Any) -> dict[str, Any]:
    """The checkpoint contents of a local run (tensors and plain containers only)."""
    return {
        "model": {key: value.detach().cpu() for key, value in run.model.state_dict().items()},
        "optimizer": run.optimizer.state_dict(),
        "parameter_names": run.parameter_names,
        "generator": run.generator.get_state(),
        "epochs_done": run.epochs_done,
        "epoch_losses": list(run.epoch_losses),
        **metadata,
    }


def save_local_run(run: LocalRun, path: str | Path, **metadata: Any) -> None:
    save_checkpoint(local_run_payload(run, **metadata), path)


def restore_local_run(payload: dict[str, Any], model: SplitModel, config: TrainingConfig, source: str = "checkpoint") -> LocalRun:
    """Rebuild a LocalRun from a checkpoint payload into `model` (an architecture-matching instance)."""
    missing = {"model", "optimizer", "parameter_names", "generator", "epochs_done", "epoch_losses"} - payload.keys()
    if missing:
        raise CheckpointError(f"{source}: not a local-run checkpoint (missing {', '.join(sorted(missing))})")
    names = [name for name, _ in model.named_parameters()]
    if payload["parameter_names"] != names:
        raise CheckpointError(f"{source}: the checkpoint's parameters do not match the configured model")
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError as error:
        raise CheckpointError(f"{source}: model weights do not fit the configured model ({str(error).splitlines()[0]})") from None
    optimizer = make_optimizer(model, config)
    optimizer.load_state_dict(payload["optimizer"])
    generator = torch.Generator()
    generator.set_state(payload["generator"])
    return LocalRun(
        model=model,
        optimizer=optimizer,
        generator=generator,
        epochs_done=int(payload["epochs_done"]),
        epoch_losses=[float(loss) for loss in payload["epoch_losses"]],
    )


def load_local_run(path: str | Path, model: SplitModel, config: TrainingConfig) -> LocalRun:
    device = next(model.parameters()).device
    return restore_local_run(load_checkpoint(path, map_location=device), model, config, source=str(path))
