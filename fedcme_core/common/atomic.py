"""Atomic file writes: a crash leaves the old file or the new one, never half of either.

Every file is written to a temporary name in its own folder, flushed to disk and renamed into
place. Checkpoints (:mod:`fedcme_core.common.checkpoints`), prepared datasets, partitions and
metrics are all written this way; this module needs no torch, so a command that writes only
arrays or JSON (the prepare stage, the report) starts without it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

FILE_MODE = 0o644  # what open() would give under the usual umask (mkstemp makes 0600)


@contextmanager
def atomic_writer(path: str | Path) -> Iterator[BinaryIO]:
    """A binary handle whose content replaces `path` (temp file + fsync + rename) only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(descriptor, FILE_MODE)
        with os.fdopen(descriptor, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | Path, payload: bytes) -> None:
    """Write `payload` to `path` all at once: a crash leaves the old file or the new one."""
    with atomic_writer(path) as handle:
        handle.write(payload)
