"""Prepared datasets on disk, read back as numpy arrays (no torch).

The prepare stage writes a dataset's verified arrays (images uint8 or float32 [N, C, H, W], labels
int64) to ``data/prepared/<dataset>``: one byte-reproducible ``.npy`` per array and a ``meta.json``
with their sha256 and, for a source that derives them, the dataset's facts and what it was read from. Training builds tensors
from them (:func:`fedcme_core.data.datasets.load_prepared`); the partition stage needs only the
training labels an experiment keeps (:func:`experiment_train_labels`), so it starts without torch.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np

from fedcme_core.common.atomic import atomic_write_bytes
from fedcme_core.common.seeding import derive_seed, numpy_rng
from fedcme_core.data.catalog import SourceData, declared_facts
from fedcme_core.data.sources import RAW_ARRAYS, DataError


def save_prepared(name: str, arrays: dict[str, np.ndarray], directory: Path,
                  record: dict[str, object] | None = None) -> dict[str, object]:
    """Write a prepared dataset: one .npy per array (byte-reproducible) and meta.json with their sha256,
    plus `record`'s keys (a source that derives its facts records them, ``derived``, and what its arrays
    were read from, ``source``: :func:`prepared_record`).

    Files are written atomically; meta.json last, so a folder with a meta.json is complete.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    for key in RAW_ARRAYS:
        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(arrays[key]), allow_pickle=False)
        payload = buffer.getvalue()
        atomic_write_bytes(directory / f"{key}.npy", payload)
        files[key] = {"sha256": hashlib.sha256(payload).hexdigest(), "shape": list(arrays[key].shape)}
    meta = {"dataset": name, "format": "fedcme-prepared-v1", "arrays": files, **(record or {})}
    atomic_write_bytes(directory / "meta.json", (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    return meta


def read_prepared(directory: Path, expected_name: str | None = None,
                  keys: tuple[str, ...] = RAW_ARRAYS) -> tuple[str, dict[str, np.ndarray]]:
    """The dataset name and the arrays `keys` of a folder written by :func:`save_prepared`, each
    verified against its sha256 (numpy arrays: no tensors are built)."""
    directory = Path(directory)
    meta = prepared_meta(directory)
    name, records = meta["dataset"], meta["arrays"]
    if expected_name is not None and name != expected_name:
        raise DataError(f"{directory}: holds prepared {name!r}, but the config's data.dataset is {expected_name!r}")
    arrays = {}
    for key in keys:
        path = directory / f"{key}.npy"
        try:
            payload = path.read_bytes()
        except OSError as error:
            raise DataError(f"{path}: cannot read prepared array ({error.strerror or error})") from None
        digest = hashlib.sha256(payload).hexdigest()
        if digest != records[key]["sha256"]:
            raise DataError(f"{path}: sha256 {digest} does not match meta.json ({records[key]['sha256']}); re-run prepare")
        arrays[key] = np.load(io.BytesIO(payload), allow_pickle=False)
    return name, arrays


def prepared_meta(directory: Path) -> dict:
    """A prepared folder's meta.json (its dataset, its arrays' records, and a deriving source's
    ``derived`` facts and ``source``); one DataError line when it is missing or not one."""
    meta_path = Path(directory) / "meta.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if not isinstance(meta["dataset"], str) or not isinstance(meta["arrays"], dict):
            raise TypeError("dataset or arrays of the wrong type")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise DataError(f"{meta_path}: not a prepared dataset ({type(error).__name__}: {error})") from None
    return meta


def prepared_record(data: SourceData) -> dict[str, object] | None:
    """What meta.json records beside the arrays of a source that derives its facts: ``derived`` (classes,
    input shape, channel statistics) and ``source`` (the path its arrays were read from and its sha256);
    None for a source that declares them (the official datasets' meta.json is as it always was)."""
    if not data.derived:
        return None
    return {"derived": data.facts.to_json(), **({"source": data.origin} if data.origin is not None else {})}


def prepared_facts(directory: Path) -> dict[str, object]:
    """What training knows of a prepared dataset, as JSON: its classes, input shape and channel
    statistics, recorded beside its arrays (a deriving source) or declared by its source (the
    official datasets)."""
    meta = prepared_meta(directory)
    if "derived" in meta:
        return meta["derived"]
    return declared_facts(meta["dataset"], meta["arrays"]["x_train"]["shape"][1:]).to_json()


def experiment_train_labels(directory: Path, expected_name: str, train: int | None, seed: int) -> np.ndarray:
    """The training labels [N] of an experiment with ``data.train_subset`` = `train`, read from a
    prepared folder without building tensors: the rows that
    :func:`fedcme_core.data.datasets.experiment_subset` keeps, so the partition stage partitions
    exactly what the run trains on."""
    name, arrays = read_prepared(directory, expected_name, keys=("y_train",))
    labels = np.asarray(arrays["y_train"], dtype=np.int64)
    index = subset_rows(name, "train", len(labels), train, subset_seed(seed))
    return labels if index is None else labels[index]


def subset_seed(seed: int) -> int:
    """The seed of an experiment's train/test subsets (``data.train_subset``, ``data.test_subset``)."""
    return derive_seed(seed, "subset")


def subset_rows(name: str, split: str, available: int, size: int | None, seed: int) -> np.ndarray | None:
    """The sorted int64 rows [size] of a seeded subset of `available` rows (None: the whole split)."""
    if size is None:
        return None
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not 0 <= size <= available:
        raise DataError(f"dataset {name}: {split} subset size {size!r} must be an int in [0, {available}]")
    return np.sort(numpy_rng(seed, f"subset-{split}").choice(available, size=int(size), replace=False)).astype(np.int64)
