"""Atomic, hashed, safe checkpoint files.

Every file is written atomically (:mod:`fedcme_core.common.atomic`), so a crash never leaves a
half-written file under the final name. A checkpoint is a header
(``FEDCME-CHECKPOINT-1`` and the SHA-256 of the body) followed by a ``torch.save`` body, so
a truncated or bit-flipped file is detected on load (torch's zip reader loads a flipped
tensor byte silently). Every tensor is written from the CPU, whatever device it trained on (CUDA
optimizer buffers included), so a plain load works on a machine without a GPU. Every load uses ``torch.load(..., weights_only=True)``: only tensors
and plain containers, never pickled code.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import torch

from fedcme_core.common.atomic import atomic_write_bytes

MAGIC = b"FEDCME-CHECKPOINT-1\n"
DIGEST_SIZE = hashlib.sha256().digest_size


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated or not a checkpoint; the message names it."""


def on_cpu(value: Any) -> Any:
    """`value` with every tensor not on the CPU (a CUDA optimizer buffer, say) replaced by a detached
    CPU copy, through dicts, lists and tuples; a container with nothing to move is returned as it is,
    so a CPU payload is saved byte for byte as before."""
    if isinstance(value, torch.Tensor):
        return value if value.device.type == "cpu" else value.detach().to("cpu")
    if isinstance(value, dict):
        moved = {key: on_cpu(item) for key, item in value.items()}
        changed = any(moved[key] is not item for key, item in value.items())
        return type(value)(moved) if changed else value
    if type(value) in (list, tuple):
        moved_items = [on_cpu(item) for item in value]
        changed = any(new is not old for new, old in zip(moved_items, value))
        return type(value)(moved_items) if changed else value
    return value


def checkpoint_bytes(payload: dict[str, Any]) -> bytes:
    """The bytes of a checkpoint file: header, SHA-256 of the body, torch.save body. Every tensor is
    saved from the CPU (:func:`on_cpu`), so any machine loads any checkpoint."""
    buffer = io.BytesIO()
    torch.save(on_cpu(payload), buffer)
    body = buffer.getvalue()
    return MAGIC + hashlib.sha256(body).digest() + body


def save_checkpoint(payload: dict[str, Any], path: str | Path) -> None:
    """Write `payload` (tensors and plain containers) atomically to `path`, with its hash."""
    atomic_write_bytes(path, checkpoint_bytes(payload))


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint`, verifying its hash; errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    content = path.read_bytes()
    if not content.startswith(MAGIC):
        raise CheckpointError(f"{path}: not a fedcme checkpoint (header missing; truncated or another format?)")
    digest, body = content[len(MAGIC) : len(MAGIC) + DIGEST_SIZE], content[len(MAGIC) + DIGEST_SIZE :]
    if hashlib.sha256(body).digest() != digest:
        raise CheckpointError(f"{path}: content hash mismatch (truncated or corrupted; {len(content)} bytes)")
    try:
        payload = torch.load(io.BytesIO(body), map_location=map_location, weights_only=True)
    except Exception as error:  # torch raises RuntimeError/UnpicklingError/EOFError/zipfile errors
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise CheckpointError(f"{path}: not a readable checkpoint: {reason}") from None
    if not isinstance(payload, dict):
        raise CheckpointError(f"{path}: not a checkpoint written by fedcme (top level is {type(payload).__name__})")
    return payload

