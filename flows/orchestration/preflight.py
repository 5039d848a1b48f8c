"""What a run can check before it trains, checked at its entry point, before a Prefect flow or an
MLflow run is opened (:func:`check_run`, called with the run directory held).

- The run directory's state: a different config is refused; a damaged latest server state is moved
  aside (``round-XXXX.pt.corrupt-<UTC time>``) with a warning, and when no kept state is intact the
  run stops, naming the files (``fedcme_core.rounds.store.last_intact_round``); a damaged
  ``compute.json`` is named, and so is a resume on another device than the run trained on
  (``fedcme_core.rounds.run_record.device_change``), unless the change is allowed.
- The partition the run will use (the run directory's, else ``--partition``): readable, its
  content hash intact, made for this dataset and this number of clients.
- Writable folders: a read-only or refused runs folder is one line naming it and the errno.
- Free disk against the run's estimated footprint (:func:`footprint`): below it, one warning line;
  the run still starts, and a disk that fills stops it at its first failed write, in one line.

Each failure is one line naming the file and what is wrong (a ``fedcme_core`` error that
``flows.common.command.report_errors`` prints), and a run stopped here leaves no MLflow run behind and no
earlier run's status changed: nothing has opened one yet.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from fedcme_core.client.models import resolve_device
from fedcme_core.common.errors import StorageError, storage_message
from fedcme_core.config.schema import ExperimentConfig
from fedcme_core.rounds import RunError, RunPaths, last_intact_round, load_experiment_dataset, new_model
from fedcme_core.rounds.run_record import device_change, run_compute_choice, run_directory_matches
from fedcme_core.rounds.setup import checked_partition

MEGABYTE = 1024 * 1024


def check_run(config: ExperimentConfig, run_dir: str | Path, partition_file: str | Path | None,
              allow_device_change: bool = False) -> str | None:
    """Check everything `run_dir` and `partition_file` can tell before training (the module's list);
    raises the one-line error of the first problem found. Returns the line naming a device change that
    `allow_device_change` lets through (the caller then records the new device's layout and precision,
    :func:`fedcme_core.rounds.prepare_run`), else None."""
    paths = RunPaths(run_dir)
    change = None
    check_writable(paths.root if paths.root.is_dir() else nearest_folder(paths.root))
    if paths.root.is_dir():
        if not run_directory_matches(config, paths.root):
            raise RunError(f"{paths.root}: holds a run of a different config; use a new experiment name or directory")
        last_intact_round(paths.root)
        if (paths.root / "server").is_dir():
            check_writable(paths.root / "server")
        if paths.compute.exists():
            run_compute_choice(paths.root)
            change = device_change(paths.root, resolve_device(config.device), allow_device_change)
    dataset = load_experiment_dataset(config.data, config.seed)
    checked_partition(config, paths.root, partition_file, dataset.y_train.numpy())
    warn_if_short_of_space(paths.root, footprint(config, dataset.num_classes, len(dataset.y_train)))
    return change


def nearest_folder(path: Path) -> Path:
    """The deepest existing folder on the way to `path` (where its files will be created)."""
    for folder in (path.parent, *path.parent.parents):
        if folder.is_dir():
            return folder
    return Path.cwd()


def check_writable(folder: Path) -> None:
    """A StorageError naming `folder` and the errno when a file cannot be created in it (read-only,
    refused, full); the probe file is removed again."""
    try:
        descriptor, probe = tempfile.mkstemp(prefix=".fedcme-write-probe-", dir=folder)
    except OSError as error:
        raise StorageError(storage_message(folder, error, "cannot create files in this folder")) from None
    os.close(descriptor)
    os.unlink(probe)


def footprint(config: ExperimentConfig, num_classes: int, num_samples: int) -> int:
    """The run directory's estimated peak size in bytes, from its model's size P (parameters and
    buffers): two server states (model and algorithm state, 2P each), a round's checkpoints (swap,
    exchanged and upload: 5P per selected client; every round's with ``runner.keep_round_files``),
    a kept state per client (P each: MOON, SCAFFOLD) and the partition."""
    model = new_model(config, num_classes, torch.device("cpu"))
    size = sum(tensor.numel() * tensor.element_size() for tensor in model.state_dict().values())
    federation = config.federation
    kept_rounds = federation.rounds if config.runner.keep_round_files else 1
    return size * (4 + 5 * federation.clients_per_round * kept_rounds + federation.num_clients) + 8 * num_samples


def warn_if_short_of_space(run_dir: Path, needed: int) -> None:
    """One warning line when the disk under `run_dir` has less free space than `needed` bytes."""
    folder = run_dir if run_dir.is_dir() else nearest_folder(run_dir)
    free = shutil.disk_usage(folder).free
    if free < needed:
        print(f"fedcme: warning: {folder}: {free / MEGABYTE:.1f} MB free, less than this run's estimated "
              f"{needed / MEGABYTE:.1f} MB (server states and a round's checkpoints); a full disk stops the run "
              "at its first failed write, and it resumes once space is freed", file=sys.stderr, flush=True)
