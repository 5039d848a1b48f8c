"""``npz``: a researcher's own arrays in one ``.npz`` file at ``data.path`` (``numpy.savez`` or
``savez_compressed``): x_train, y_train, x_test, y_test. Images uint8 (0..255) or float, grey or RGB,
[N, H, W], [N, H, W, C] or [N, C, H, W]; labels integer class indices 0..C-1, C = max(y_train) + 1
(:mod:`fedcme_core.data.catalog.checks` says what it accepts)."""

from __future__ import annotations

import functools
import hashlib
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from fedcme_core.data.catalog.base import InputShape, Source, SourceSettings
from fedcme_core.data.catalog.checks import CHANNELS
from fedcme_core.data.sources import RAW_ARRAYS, DataError

_CHUNK_BYTES = 1 << 22


class Npz(Source):
    name = "npz"
    label = "npz"
    needs_path = True

    def arrays(self, settings: SourceSettings) -> dict[str, np.ndarray]:
        path = existing_file(self.data_path(settings))
        try:
            with np.load(path, allow_pickle=False) as archive:
                missing = [key for key in RAW_ARRAYS if key not in archive.files]
                if missing:
                    raise DataError(f"{path}: lacks the array{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                                    f"(an npz dataset needs {', '.join(RAW_ARRAYS)})")
                return {key: archive[key] for key in RAW_ARRAYS}
        except DataError:
            raise
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, AttributeError) as error:
            raise DataError(f"{path}: cannot read as an .npz archive ({type(error).__name__}: {error})") from None

    def shape(self, settings: SourceSettings) -> InputShape | None:
        if settings.path is None or not Path(settings.path).is_file():
            return None
        status = Path(settings.path).stat()
        return _header_shape(str(settings.path), status.st_size, status.st_mtime_ns)

    def peek_classes(self, settings: SourceSettings) -> int | None:
        if settings.path is None or not Path(settings.path).is_file():
            return None
        status = Path(settings.path).stat()
        return _label_classes(str(settings.path), status.st_size, status.st_mtime_ns)

    def origin(self, settings: SourceSettings) -> dict[str, Any]:
        path = existing_file(self.data_path(settings))
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(_CHUNK_BYTES), b""):
                digest.update(chunk)
        return {"path": str(path), "sha256": digest.hexdigest()}


def existing_file(path: Path) -> Path:
    if not path.is_file():
        raise DataError(f"data.path {path}: no such file")
    return path


@functools.lru_cache(maxsize=8)
def _header_shape(path: str, size: int, modified_ns: int) -> InputShape | None:
    """(C, H, W) of x_train from its .npy header alone (None where the file cannot say: the prepare
    stage then names the problem); cached while the file's size and mtime hold."""
    try:
        with zipfile.ZipFile(path) as archive, archive.open("x_train.npy") as member:
            version = np.lib.format.read_magic(member)
            if version not in ((1, 0), (2, 0)):
                return None
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, _ = read_header(member)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return None
    if len(shape) == 3:
        return 1, int(shape[1]), int(shape[2])
    if len(shape) == 4 and shape[3] in CHANNELS:
        return int(shape[3]), int(shape[1]), int(shape[2])
    if len(shape) == 4 and shape[1] in CHANNELS:
        return int(shape[1]), int(shape[2]), int(shape[3])
    return None


@functools.lru_cache(maxsize=8)
def _label_classes(path: str, size: int, modified_ns: int) -> int | None:
    """max(y_train) + 1 read from the file (None where it cannot say: the prepare stage then names the
    problem); cached while the file's size and mtime hold."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            labels = archive["y_train"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    if labels.size == 0 or not np.issubdtype(labels.dtype, np.integer) or labels.dtype == np.bool_:
        return None
    return int(labels.max()) + 1
