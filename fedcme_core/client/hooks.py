"""An algorithm's hooks into the one local loop (:mod:`fedcme_core.client.training`); the defaults
are FedAvg's.

Without torch at import (tensors only pass through), so that the algorithm modules, which subclass
these hooks, import without torch: a config, whose algorithm union comes from their registry, is
validated before torch is imported (:mod:`fedcme_core.common.lazy`).
"""

from __future__ import annotations

from fedcme_core.common.lazy import lazy_module

torch = lazy_module("torch")  # named by the annotations only


class ClientHooks:
    """An algorithm's per-client, per-round hooks into the local loop; these defaults are FedAvg's.

    The hooks run inside the training step, which must not wait for the device: tensors they hold
    are put on the model's device when they are built, and nothing is read back (no ``bool``,
    ``item`` or boolean-mask indexing of a device tensor). What depends on a batch's labels is
    planned on the host once per epoch (:meth:`plan_epoch`)."""

    plans_batches: bool = False  # True: the loop calls plan_epoch with each epoch's batch labels

    def transform_logits(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """logits [B, C] -> logits [B, C] used by the cross-entropy (FedRS: restricted softmax)."""
        return logits

    def extra_loss(
        self, inputs: torch.Tensor, labels: torch.Tensor, features: torch.Tensor, logits: torch.Tensor
    ) -> torch.Tensor | None:
        """A term added to the cross-entropy (features [B, d], logits [B, C]); None adds nothing."""
        return None

    def plan_epoch(self, batch_labels: list[torch.Tensor]) -> None:
        """Called at the start of each epoch when `plans_batches`, with the labels of each of its
        batches in order ([B_i] int64 each, on the CPU); the steps' extra_loss calls follow in that order."""

    def after_step(self) -> None:
        """Called after each optimizer step (SCAFFOLD: the control-variate correction)."""
