"""Training-batch augmentation as batched tensor operations (SPEC.md, Data: ``data.augment``).

``crop_flip`` is NIID-Bench's and MOON's CIFAR-10 training transform (``utils.get_dataloader``
in NIID-Bench: ``RandomCrop(32, padding=4, padding_mode="reflect")`` then
``RandomHorizontalFlip()``), done on a whole batch at once:

    x_pad = reflect_pad(x, 4)                      # [B, C, H+8, W+8], never built
    out[b] = x_pad[b, :, dy_b : dy_b+H, dx_b : dx_b+W], mirrored left-right when f_b
    dy_b, dx_b ~ U{0..8},  f_b ~ Bernoulli(0.5)

Its randomness (offsets and flips) comes from the client's batch-order generator, which the local
run saves in its checkpoints, so an augmented run stays bit-reproducible and resumes mid-phase to
the same result. The loop draws a whole epoch's at once on the host (:func:`epoch_draws`: the same
numbers as drawn batch by batch) and moves them to the device once per epoch.
It applies to training batches only, never to evaluation, features or evaluation vectors.
"""

from __future__ import annotations

from typing import Protocol

import torch

PADDING = 4

Draws = tuple[torch.Tensor, ...]  # an augmentation's random draws for a batch, [..., B] each


class Augmentation(Protocol):
    """A training-batch transform in two parts, so that its randomness is drawn on the host, from the
    run's CPU generator, once per epoch (:func:`epoch_draws`), and the step itself only slices and
    computes on the device (no host-to-device copy per step)."""

    def draw(self, size: int, generator: torch.Generator) -> Draws:
        """The random draws for a batch of `size`, on the CPU, from `generator`."""
        ...

    def apply(self, batch: torch.Tensor, draws: Draws) -> torch.Tensor:
        """batch [B, C, H, W] -> [B, C, H, W] under `draws` (on the batch's device)."""
        ...


class CropFlip:
    """``crop_flip`` as draw (offsets [2, B] in 0..2*padding, flips [B] bool) and apply; calling it
    with a batch and a generator draws and applies at once."""

    def __init__(self, padding: int = PADDING) -> None:
        self.padding = padding

    def draw(self, size: int, generator: torch.Generator) -> Draws:
        offsets = torch.randint(0, 2 * self.padding + 1, (2, size), generator=generator)  # [2, B]
        flips = torch.rand(size, generator=generator) < 0.5  # [B]
        return offsets, flips

    def apply(self, batch: torch.Tensor, draws: Draws) -> torch.Tensor:
        return _crop_flip(batch, draws[0], draws[1], self.padding)

    def __call__(self, batch: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """batch [B, C, H, W] -> [B, C, H, W]: a random crop of the reflect-padded images, each
        flipped horizontally with probability 1/2; in the batch's memory layout.

        The padding is never built: each output pixel's source is computed (the reflection folds an
        index outside the image back into it) and read with one gather in the batch's own layout."""
        offsets, flips = self.draw(batch.shape[0], generator)
        return self.apply(batch, (offsets.to(batch.device), flips.to(batch.device)))


crop_flip = CropFlip()


def epoch_draws(augment: Augmentation, num_samples: int, batch_size: int, generator: torch.Generator) -> Draws:
    """An epoch's draws, batch after batch, in the order the loop used to draw them per batch (so a
    CPU run draws the same numbers), joined along the sample dimension: batch i's are [..., i*b:(i+1)*b]."""
    per_batch = [augment.draw(min(batch_size, num_samples - start), generator)
                 for start in range(0, num_samples, batch_size)]
    return tuple(torch.cat(parts, dim=-1) for parts in zip(*per_batch))


def _crop_flip(batch: torch.Tensor, offsets: torch.Tensor, flips: torch.Tensor, padding: int) -> torch.Tensor:
    """crop_flip under offsets [2, B] and flips [B], both on the batch's device."""
    size, channels, height, width = batch.shape
    rows = _reflect(offsets[0, :, None] - padding + torch.arange(height, device=batch.device), height)  # [B, H]
    columns = offsets[1, :, None] - padding + torch.arange(width, device=batch.device)  # [B, W]
    columns = _reflect(torch.where(flips[:, None], columns.flip(1), columns), width)  # flipped: read backwards
    sources = (rows[:, :, None] * width + columns[:, None, :]).reshape(size, height * width)  # [B, H*W]
    if _is_channels_last(batch):
        pixels = batch.permute(0, 2, 3, 1).reshape(size, height * width, channels)  # [B, H*W, C], a view
        cropped = pixels.gather(1, sources[:, :, None].expand(size, height * width, channels))
        return cropped.reshape(size, height, width, channels).permute(0, 3, 1, 2)  # [B, C, H, W], channels_last
    pixels = batch.contiguous().reshape(size, channels, height * width)  # [B, C, H*W]
    cropped = pixels.gather(2, sources[:, None, :].expand(size, channels, height * width))
    return cropped.reshape(size, channels, height, width)  # [B, C, H, W]


def _reflect(index: torch.Tensor, length: int) -> torch.Tensor:
    """Indices in [-length+1, 2*length-1) folded into [0, length) as reflect padding does (no edge repeat)."""
    index = index.abs()
    return torch.where(index >= length, 2 * (length - 1) - index, index)


def _is_channels_last(batch: torch.Tensor) -> bool:
    return batch.shape[1] > 1 and batch.is_contiguous(memory_format=torch.channels_last)


AUGMENTATIONS: dict[str, Augmentation | None] = {"none": None, "crop_flip": crop_flip}


def augmentation(name: str) -> Augmentation | None:
    """The batch transform named by `data.augment` (None: batches as they are)."""
    return AUGMENTATIONS[name]
