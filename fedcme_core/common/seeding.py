"""Seed derivation: every random choice is a pure function of (seed, tags...).

Tags are ints (round, client id) or short strings naming the purpose ("select",
"train", "eval-subset"). Results therefore never depend on execution order, runner or
worker count.
"""

from __future__ import annotations

import zlib

import numpy as np

from fedcme_core.common.lazy import lazy_module

torch = lazy_module("torch")  # torch_generator only: numpy seeds (partitions, subsets) need no torch

Tag = int | str


def _tag_to_int(tag: Tag) -> int:
    if isinstance(tag, bool) or not isinstance(tag, (int, str, np.integer)):
        raise TypeError(f"seed tags must be int or str, got {type(tag).__name__}")
    if isinstance(tag, str):
        return zlib.crc32(tag.encode("utf-8"))
    if tag < 0:
        raise ValueError(f"seed tags must be non-negative, got {tag}")
    return int(tag)


def derive_seed(seed: int, *tags: Tag) -> int:
    """A 63-bit seed derived from `seed` and `tags` (stable across processes and runs)."""
    sequence = np.random.SeedSequence([_tag_to_int(seed), *(_tag_to_int(t) for t in tags)])
    high, low = (int(word) for word in sequence.generate_state(2, dtype=np.uint32))
    return ((high << 32) | low) >> 1


def numpy_rng(seed: int, *tags: Tag) -> np.random.Generator:
    """A numpy Generator for the random choice named by `tags`."""
    return np.random.default_rng(derive_seed(seed, *tags))


def torch_generator(seed: int, *tags: Tag) -> torch.Generator:
    """A CPU torch Generator for the random choice named by `tags`."""
    generator = torch.Generator()
    generator.manual_seed(derive_seed(seed, *tags))
    return generator
