"""No host sync in the training step, for every algorithm, counted on the CPU.

A CUDA kernel queue stalls whenever the host reads a device value back (``item``, ``bool``, a
boolean-mask index, ``nonzero``, ``bincount``) or copies between the host and the device. The CPU
cannot stall, so the step is watched instead: a dispatch mode sees every ATen operation the step
runs (its backward and the optimizer's included) and a function mode every ``Tensor.to``, ``cpu``,
``cuda``, ``pin_memory`` and ``copy_`` call that names a device, and every tensor made from host
data; the loop's own moves (``fedcme_core.client.transfers``) are counted as they are called, even
where, on the CPU, they move nothing. A step must count 0 of each; its epoch's moves are counted
separately, once per epoch.
"""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from fedcme_core.algorithms import ClientContext, build_algorithm
from fedcme_core.client import features as features_module
from fedcme_core.client import training
from fedcme_core.client.compute import Compute
from fedcme_core.client.features import GlobalFeatures, alignment_loss
from fedcme_core.client.models import build_model
from fedcme_core.config.schema import TrainingConfig
from fedcme_core.data.augment import crop_flip
from fedcme_core.data.partition import class_counts

SYNC_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "is_nonzero", "equal", "unique", "_unique",
            "_unique2", "unique_dim", "unique_consecutive", "bincount", "repeat_interleave", "allclose", "item"}
MOVES = {"to", "cpu", "cuda", "pin_memory", "copy_", "tensor", "as_tensor", "from_numpy"}
READS = {"item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__"}


class SyncCounter(TorchDispatchMode):
    """ATen operations that make a GPU wait for the host, or copy between devices."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        tensors = [value for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor)]
        indices = [index for value in args if isinstance(value, (list, tuple)) for index in value
                   if isinstance(index, torch.Tensor)]
        if name in SYNC_OPS or (name in ("index", "index_put", "index_put_")
                                and any(index.dtype == torch.bool for index in indices)):
            self.seen.append(name)
        elif name in ("_to_copy", "copy_") and len({tensor.device for tensor in tensors} | (
                {torch.device(kwargs["device"])} if kwargs.get("device") is not None else set())) > 1:
            self.seen.append(name)
        return func(*args, **kwargs)


class MoveCounter(TorchFunctionMode):
    """Calls that move a tensor to a named device, or read one back to Python."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        names_a_device = any(isinstance(value, (torch.device, str)) for value in (*args[1:], *kwargs.values())) \
            or "device" in kwargs
        if (name in MOVES and (names_a_device or name in ("cpu", "cuda", "pin_memory", "from_numpy"))) \
                or name in READS:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


@pytest.fixture
def counted(monkeypatch):
    """Per-step counts of training._train_step's syncs and moves, and the loop's own moves."""
    steps: list[list[str]] = []
    moves: list[str] = []
    real_step, real_move = training._train_step, training.to_device

    def counted_step(*args, **kwargs):
        syncs, calls = SyncCounter(), MoveCounter()
        with syncs, calls:
            result = real_step(*args, **kwargs)
        steps.append(syncs.seen + calls.seen)
        return result

    def counted_move(tensor, device):
        moves.append(tuple(tensor.shape))
        return real_move(tensor, device)

    monkeypatch.setattr(training, "_train_step", counted_step)
    monkeypatch.setattr(training, "to_device", counted_move)
    monkeypatch.setattr(features_module, "to_device", counted_move)
    return steps, moves


ALGORITHMS = {
    "fedavg": {"name": "fedavg"},
    "fedprox": {"name": "fedprox", "mu": 0.01},
    "moon": {"name": "moon", "mu": 1.0},
    "fedrs": {"name": "fedrs", "alpha": 0.5},
    "scaffold": {"name": "scaffold"},
    "fedcme": {"name": "fedcme", "mu": 0.1},
    "fedcme-sample": {"name": "fedcme", "mu": 0.1, "align_loss": "sample", "align_reduction": "sum_dims"},
}
SAMPLES, BATCH, EPOCHS, CLASSES = 40, 8, 2, 10


def client(label: str):
    """A client of `label`'s algorithm in its second round: model, hooks, data (3x32x32, classes 0-4)."""
    from fedcme_core.config.schema import config_from_dict

    config = config_from_dict({"algorithm": ALGORITHMS[label]}).algorithm
    algorithm = build_algorithm(config)
    model = build_model("cifar_cnn", CLASSES, projection_dim=16 if label == "moon" else None, seed=0)
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(SAMPLES, 3, 32, 32, generator=generator)  # [N, 3, 32, 32]
    labels = torch.randint(0, 5, (SAMPLES,), generator=generator)  # [N]
    dim = model.feature_dim
    zeta = GlobalFeatures(torch.randn(CLASSES, dim, generator=generator), torch.arange(CLASSES) % 2 == 0)
    # The algorithm's server state, read from a stored form with zeta^t (FedCME) and c unset (SCAFFOLD).
    server = algorithm.state_class.from_dict({"global_features": zeta.to_dict(), "control": None})
    context = ClientContext(client_id=0, round_index=1, class_counts=class_counts(labels.numpy(), [range(SAMPLES)], CLASSES)[0],
                            global_state=model.state_dict(), seed=0, learning_rate=0.01, server=server)
    return model, algorithm.client_hooks(model, context), inputs, labels


@pytest.mark.parametrize("label", list(ALGORITHMS))
def test_no_training_step_syncs_or_moves_for_any_algorithm(counted, label):
    steps, moves = counted
    model, hooks, inputs, labels = client(label)
    run = training.start_local_run(model, TrainingConfig(batch_size=BATCH), torch.Generator().manual_seed(0))

    training.train_epochs(run, inputs, labels, hooks, EPOCHS, BATCH, Compute(), crop_flip)

    assert len(steps) == EPOCHS * SAMPLES // BATCH
    assert steps == [[] for _ in steps], f"{label}: syncs or moves in a step: {steps[0]}"
    planned = 1 if hooks.plans_batches else 0  # FedCME's alignment plan
    assert len(moves) == 2 + EPOCHS * (1 + 2 + planned)  # data once; per epoch the order, 2 draws, the plan


def test_the_counter_sees_a_step_that_reads_back(counted):
    """The unplanned alignment (found per batch from device labels) reads back: the counter must say so."""
    steps, _ = counted
    model, hooks, inputs, labels = client("fedcme")
    hooks.plan_epoch = lambda batch_labels: None  # no plan: alignment_loss finds its classes per batch
    run = training.start_local_run(model, TrainingConfig(batch_size=BATCH), torch.Generator().manual_seed(0))

    training.train_epochs(run, inputs, labels, hooks, 1, BATCH, Compute())

    assert all("is_nonzero" in seen or "_local_scalar_dense" in seen for seen in steps)
    assert all("nonzero" in seen for seen in steps)


@pytest.mark.parametrize("loss", ["class_mean", "sample"])
@pytest.mark.parametrize("reduction", ["mean", "sum_dims", "sum_all"])
def test_the_planned_alignment_equals_the_unplanned_one_bit_for_bit(loss, reduction):
    generator = torch.Generator().manual_seed(3)
    features = torch.randn(12, 6, generator=generator, requires_grad=True)  # [B, d]
    labels = torch.randint(0, 5, (12,), generator=generator)  # [B]
    zeta = GlobalFeatures(torch.randn(5, 6, generator=generator), torch.tensor([True, False, True, True, False]))
    (selected,) = features_module.alignment_plan([labels], zeta.defined, loss, torch.device("cpu"))

    planned = alignment_loss(features, labels, zeta, reduction, loss, selected=selected)
    (planned_grad,) = torch.autograd.grad(planned, features)
    unplanned = alignment_loss(features, labels, zeta, reduction, loss)
    (unplanned_grad,) = torch.autograd.grad(unplanned, features)

    assert torch.equal(planned, unplanned) and torch.equal(planned_grad, unplanned_grad)
    nothing = features_module.alignment_plan([torch.tensor([1, 4, 1])], zeta.defined, loss, torch.device("cpu"))[0]
    assert alignment_loss(features[:3], torch.tensor([1, 4, 1]), zeta, reduction, loss, selected=nothing) is None
