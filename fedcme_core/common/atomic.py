"""Atomic file writes: a crash leaves the old file or the new one, never half of either.

Every file is written to a temporary name in its own folder, flushed to disk and renamed into
place. Checkpoints (:mod:`fedcme_core.common.checkpoints`), prepared datasets, partitions and
metrics are all written this way, and a write the machine refuses is one
:class:`~fedcme_core.common.errors.StorageError` naming the file and the errno. This module needs
no torch, so a command that writes only arrays or JSON (the prepare stage, the report) starts
without it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

from fedcme_core.common.errors import StorageError, machine_error, storage_message

FILE_MODE = 0o644  # what open() would give under the usual umask (mkstemp makes 0600)


@contextmanager
def atomic_writer(path: str | Path) -> Iterator[BinaryIO]:
    """A binary handle whose content replaces `path` (temp file + fsync + rename) only if the block succeeds.

    A write the machine refuses (a full disk, a read-only folder: :func:`machine_error`) is a
    :class:`StorageError` naming `path` and the errno; `path` keeps its old content and the
    temporary file is removed."""
    path = Path(path)
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.fchmod(descriptor, FILE_MODE)
        with os.fdopen(descriptor, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        if temporary is not None:
            with suppress(OSError):
                Path(temporary).unlink(missing_ok=True)
        fault = machine_error(error)
        if fault is not None and not isinstance(error, StorageError):
            raise StorageError(storage_message(path, error)) from None
        raise


def atomic_write_bytes(path: str | Path, payload: bytes) -> None:
    """Write `payload` to `path` all at once: a crash leaves the old file or the new one."""
    with atomic_writer(path) as handle:
        handle.write(payload)
