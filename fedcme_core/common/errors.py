"""The errors every layer raises about the run directory and the machine under it.

:class:`RunError`: a run directory cannot be used (a bad name, another config, another holder).
:class:`StorageError`: the machine refused a write or a read of the run's files (a full disk, a
read-only folder, an I/O error). Both are the run's end, reported as one line; neither is a
client's fault: a client whose local training meets a full disk has not failed, the machine has
(:func:`machine_error`, which the executors ask before counting a client out of a round).
Plain one-argument exceptions: they cross a process (a Dask worker) by pickling unchanged.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

# What a write or read meets when the fault is the machine's, not the data's or the code's.
MACHINE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO,
                            errno.EFBIG})


class RunError(ValueError):
    """A run directory cannot be used for this config; the message says why."""


class StorageError(RuntimeError):
    """The machine refused a file operation of the run; the message names the path and the errno."""


def storage_message(path: str | Path | None, error: OSError, doing: str = "cannot write") -> str:
    """`runs/x/server/round-0003.pt: cannot write: [Errno 28] No space left on device; ...`: one line
    naming the path, the errno and what to do."""
    path = path if path is not None else (error.filename or "a file of the run")
    code = error.errno if error.errno is not None else 0
    reason = f"[Errno {code}] {os.strerror(code)}" if code else (str(error) or type(error).__name__)
    remedy = {errno.ENOSPC: "free space on that disk", errno.EDQUOT: "free space within the disk quota",
              errno.EROFS: "make that folder writable (or use another --runs-dir)",
              errno.EACCES: "make that folder writable (or use another --runs-dir)",
              errno.EPERM: "make that folder writable (or use another --runs-dir)"}.get(code, "fix the disk")
    return f"{path}: {doing}: {reason}; {remedy}, then run the same command again to resume"


def machine_error(error: BaseException) -> StorageError | None:
    """`error` as the machine's fault (a :class:`StorageError`, or an OSError whose errno is the
    disk's: full, read-only, refused, failing), else None: a client's own failure."""
    if isinstance(error, StorageError):
        return error
    if isinstance(error, OSError) and error.errno in MACHINE_ERRNOS:
        return StorageError(storage_message(error.filename, error))
    return None
