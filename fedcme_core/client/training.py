"""The one local-training loop of every algorithm, resumable at epoch boundaries.

Local objective of client k in round t (SPEC.md, "Local training"):

    L = CE(transform_logits(classify(features(x))), y) + extra_loss(x, y, features, logits)

minimised by SGD (lr, momentum, weight decay) over mini-batches of the client's in-memory
tensors. Algorithms never copy this loop: FedProx, MOON and FedCME's feature alignment
supply ``extra_loss``, FedRS ``transform_logits``, SCAFFOLD ``after_step`` (the hooks:
:mod:`fedcme_core.client.hooks`; the algorithms: ``fedcme_core.algorithms``).

A local run can stop after any epoch, be written to a checkpoint (model, optimizer and
the batch-order RNG state) and continue later to exactly the same result as a run
straight through: FedCME stops at floor(E/2) to exchange classifiers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from fedcme_core.data.augment import Augmentation, epoch_draws
from fedcme_core.common.checkpoints import CheckpointError, load_checkpoint, save_checkpoint
from fedcme_core.client.compute import Compute
from fedcme_core.client.device_flags import configure_device
from fedcme_core.client.hooks import ClientHooks
from fedcme_core.client.models import SplitModel, build_model
from fedcme_core.client.transfers import to_device, to_host

FP32 = Compute()


class TrainingSettings(Protocol):
    """What the loop reads of the config's ``training`` section (``TrainingConfig``, whose layer is
    above this one): the local SGD's step size, momentum and weight decay, and the batch size."""

    @property
    def lr(self) -> float: ...

    @property
    def momentum(self) -> float: ...

    @property
    def weight_decay(self) -> float: ...

    @property
    def batch_size(self) -> int: ...


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


def make_optimizer(model: SplitModel, config: TrainingSettings) -> torch.optim.SGD:
    return torch.optim.SGD(
        model.parameters(), lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay
    )


def start_local_run(model: SplitModel, config: TrainingSettings, generator: torch.Generator) -> LocalRun:
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

    `inputs` [D_k, C_in, H, W] and `labels` [D_k] are moved to the model's device once, if they are
    not there. `compute` sets the precision of the forward pass and the loss (bf16 autocast or fp32);
    the layout is the one `inputs` and the model already have (see fedcme_core.client.compute).
    `augment` transforms each training batch, drawing from the run's generator (so a resumed
    run draws the same crops and flips; fedcme_core.data.augment).

    Each epoch's batch order and augmentation draws come from the run's CPU generator, in the same
    sequence as when they were drawn batch by batch, and move to the device once per epoch; hooks
    that plan their batches (``ClientHooks.plans_batches``) get the batches' labels on the host
    then. A step (:func:`_train_step`) only slices and computes on the device: no copy between the
    host and the device, no wait for the device. The epoch's loss is read back once, at its end."""
    model, optimizer = run.model, run.optimizer
    device = next(model.parameters()).device
    inputs, labels = to_device(inputs, device), to_device(labels, device)  # [D_k, ...], once per phase
    host_labels = to_host(labels) if hooks.plans_batches else None  # [D_k]
    num_samples = labels.shape[0]
    starts = range(0, num_samples, batch_size)
    model.train()
    for _ in range(num_epochs):
        host_order = torch.randperm(num_samples, generator=run.generator)  # [D_k]
        host_draws = () if augment is None else epoch_draws(augment, num_samples, batch_size, run.generator)
        if host_labels is not None:
            hooks.plan_epoch([host_labels[host_order[start : start + batch_size]] for start in starts])
        order = to_device(host_order, device)
        draws = tuple(to_device(draw, device) for draw in host_draws)  # [..., D_k]
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        for start in starts:
            end = min(start + batch_size, num_samples)
            batch_draws = tuple(draw[..., start:end] for draw in draws)
            loss = _train_step(run, inputs, labels, order[start:end], hooks, compute, augment, batch_draws)
            loss_sum += loss * (end - start)
        run.epoch_losses.append(float(loss_sum) / num_samples)
        run.epochs_done += 1


def _train_step(run: LocalRun, inputs: torch.Tensor, labels: torch.Tensor, batch: torch.Tensor, hooks: ClientHooks,
                compute: Compute, augment: Augmentation | None, draws: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """One SGD step on the rows `batch` [B] of `inputs` and `labels`, all on the model's device (as
    are `draws`, the batch's augmentation draws); returns the detached loss (a 0-d device tensor)."""
    model, optimizer = run.model, run.optimizer
    batch_inputs = inputs[batch]  # [B, C_in, H, W]
    batch_labels = labels[batch]  # [B]
    if augment is not None:
        batch_inputs = augment.apply(batch_inputs, draws)  # [B, C_in, H, W]
    with compute.autocast(batch_inputs.device):
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
    return loss.detach()


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


def restore_local_run(payload: dict[str, Any], model: SplitModel, config: TrainingSettings, source: str = "checkpoint") -> LocalRun:
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


def load_local_run(path: str | Path, model: SplitModel, config: TrainingSettings) -> LocalRun:
    device = next(model.parameters()).device
    return restore_local_run(load_checkpoint(path, map_location=device), model, config, source=str(path))


def training_step(model_name: str, num_classes: int, projection_dim: int | None, input_shape: tuple[int, int, int],
                  training: TrainingSettings, device: torch.device, seed: int = 0):
    """`step(option)`: one training step of the run's model on a random batch of its shape, in
    `option` (the one local loop, FedAvg's hooks); returns the batch size. Its own seeded tensors
    and generators: the run's random streams are untouched."""
    generator = torch.Generator().manual_seed(seed)
    batch = training.batch_size
    inputs = torch.randn(batch, *input_shape, generator=generator)  # [B, C_in, H, W]
    labels = torch.randint(num_classes, (batch,), generator=generator)  # [B]
    runs: dict[Compute, Any] = {}

    def step(option: Compute) -> int:
        configure_device(device, option.precision)  # before the first CUDA kernel of the calibration
        if option not in runs:
            model = build_model(model_name, num_classes, projection_dim, seed=seed, input_shape=input_shape)
            model = option.model(model.to(device))
            runs[option] = (start_local_run(model, training, torch.Generator().manual_seed(seed)),
                            option.layout(inputs).to(device), labels.to(device))
        run, option_inputs, option_labels = runs[option]
        train_epochs(run, option_inputs, option_labels, ClientHooks(), 1, batch, compute=option)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return batch

    return step
