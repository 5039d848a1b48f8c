"""Training-batch augmentation as batched tensor operations (SPEC.md, Data: ``data.augment``).

``crop_flip`` is NIID-Bench's and MOON's CIFAR-10 training transform (``utils.get_dataloader``
in NIID-Bench: ``RandomCrop(32, padding=4, padding_mode="reflect")`` then
``RandomHorizontalFlip()``), done on a whole batch at once:

    x_pad = reflect_pad(x, 4)                      # [B, C, H+8, W+8], never built
    out[b] = x_pad[b, :, dy_b : dy_b+H, dx_b : dx_b+W], mirrored left-right when f_b
    dy_b, dx_b ~ U{0..8},  f_b ~ Bernoulli(0.5)

Its randomness comes from the client's batch-order generator, which the local run saves in its
checkpoints, so an augmented run stays bit-reproducible and resumes mid-phase to the same result.
It applies to training batches only, never to evaluation, features or evaluation vectors.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

PADDING = 4

Augmentation = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


def crop_flip(batch: torch.Tensor, generator: torch.Generator, padding: int = PADDING) -> torch.Tensor:
    """batch [B, C, H, W] -> [B, C, H, W]: a random crop of the reflect-padded images, each
    flipped horizontally with probability 1/2; in the batch's memory layout.

    The padding is never built: each output pixel's source is computed (the reflection folds an
    index outside the image back into it) and read with one gather in the batch's own layout."""
    size, channels, height, width = batch.shape
    offsets = torch.randint(0, 2 * padding + 1, (2, size), generator=generator).to(batch.device)  # [2, B]
    flips = (torch.rand(size, generator=generator) < 0.5).to(batch.device)  # [B]
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
