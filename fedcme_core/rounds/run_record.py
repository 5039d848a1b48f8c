"""What defines a run directory, recorded once at its start: the config (``config.json``), the
memory layout and precision (``compute.json``) and the partition (``partition.npz``); the
paths and the states are :mod:`fedcme_core.rounds.store`'s."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import torch

from fedcme_core.client.compute import ComputeChoice
from fedcme_core.client.models import resolve_device
from fedcme_core.common.atomic import atomic_write_bytes
from fedcme_core.config.schema import ExperimentConfig, config_from_dict
from fedcme_core.data.partition_file import Partition, load_partition
from fedcme_core.rounds.store import RunError, RunPaths


def config_json(config) -> str:
    """The config that defines a run's results: without `federation.rounds` (a run can be
    extended) and `runner` (any runner gives the same results)."""
    values = config.model_dump(mode="json", exclude={"runner": True, "federation": {"rounds"}})
    return json.dumps(values, indent=2, sort_keys=True) + "\n"


# The config.json texts this process wrote: today's form, so compared as text and never parsed back.
_WRITTEN_HERE: set[str] = set()


def recorded_config_json(text: str, path: Path) -> str | None:
    """A recorded config.json's text as this code writes it: a config recorded before an option was
    added reads with that option's default (the results it defines are the same); None when it no
    longer validates. Parses `text`: only for a record another process wrote (:func:`recorded_matches`)."""
    try:
        return config_json(config_from_dict(json.loads(text), source=str(path)))
    except ValueError:  # not JSON, or a config this code refuses (ConfigError)
        return None


def recorded_matches(text: str, wanted: str, path: Path) -> bool:
    """Whether the config.json `text` at `path` records the config whose :func:`config_json` is `wanted`.

    The serialised forms are compared: a run recorded by this code (every resumed run, and any
    written by this process) matches as text, and nothing is parsed. Only a text in another form,
    written by another process (possibly an older code version), is parsed back to be compared."""
    if text == wanted or text in _WRITTEN_HERE:
        return text == wanted
    return recorded_config_json(text, path) == wanted


def run_directory_matches(config, run_dir: str | Path) -> bool:
    """True when `run_dir` is new or holds a run of this config (so it can be resumed or extended)."""
    path, wanted = RunPaths(run_dir).config, config_json(config)
    if not path.exists():
        return True
    return recorded_matches(path.read_text(encoding="utf-8"), wanted, path)


def write_config(config, run_dir: str | Path) -> None:
    """Record the run's config; reopening with a different config is refused (the same experiment).
    A config recorded before an option was added is rewritten in today's form."""
    paths, wanted = RunPaths(run_dir), config_json(config)
    text = paths.config.read_text(encoding="utf-8") if paths.config.exists() else None
    if text == wanted:
        return
    if text is not None and not recorded_matches(text, wanted, paths.config):
        raise RunError(f"{paths.root}: holds a run of a different config; use a new experiment name or directory")
    atomic_write_bytes(paths.config, wanted.encode("utf-8"))
    _WRITTEN_HERE.add(wanted)


def recorded_config(run_dir: str | Path, rounds: int) -> ExperimentConfig:
    """The config a run directory records, validated, with `rounds` as its `federation.rounds` (which
    config.json leaves out): for a process that did not train the run (``fedcme sync``) and so has
    no config object of its own; a process that trains passes its validated config down instead."""
    path = RunPaths(run_dir).config
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
        values["federation"]["rounds"] = rounds
    except (ValueError, KeyError, TypeError) as error:
        raise RunError(f"{path}: not a recorded config ({type(error).__name__}: {error})") from None
    return config_from_dict(values, source=str(path))


class RecordCache:
    """A run record's value per file, kept while the file is unchanged (its path and modification
    time), for the last `size` files: each process reads a record once, and the process that wrote
    it (:meth:`remember`) never reads it back."""

    def __init__(self, load, size: int = 4) -> None:
        self.load, self.size = load, size
        self.values: dict[str, tuple[int, object]] = {}
        self._lock = threading.Lock()  # a runner's client threads share the process's records

    def get(self, path: Path):
        modified = path.stat().st_mtime_ns  # FileNotFoundError: the caller's to name
        kept = self.values.get(str(path))
        if kept is not None and kept[0] == modified:
            return kept[1]
        return self.remember(path, self.load(path), modified)

    def remember(self, path: Path, value, modified: int | None = None):
        """Keep `value` as the content of `path` (just written by this process); returns it."""
        modified = path.stat().st_mtime_ns if modified is None else modified
        with self._lock:
            self.values.pop(str(path), None)
            self.values[str(path)] = (modified, value)
            while len(self.values) > self.size:
                del self.values[next(iter(self.values))]
        return value


def _read_compute(path: Path) -> ComputeChoice:
    try:
        return ComputeChoice.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError) as error:
        raise RunError(f"{path}: not a valid compute record ({error})") from None


_COMPUTE = RecordCache(_read_compute)
_PARTITION = RecordCache(load_partition)


def write_compute_choice(run_dir: str | Path, choice: ComputeChoice) -> None:
    path = RunPaths(run_dir).compute
    atomic_write_bytes(path, (json.dumps(choice.to_json(), indent=2, sort_keys=True) + "\n").encode("utf-8"))
    _COMPUTE.remember(path, choice)


def run_compute_choice(run_dir: str | Path) -> ComputeChoice:
    """The run's recorded layout and precision with how they were chosen (read once per process, and
    never by the process that wrote it)."""
    path = RunPaths(run_dir).compute
    try:
        return _COMPUTE.get(path)
    except FileNotFoundError:
        raise RunError(f"{path}: missing; the run directory was not prepared (prepare_run)") from None


def remember_partition(run_dir: str | Path, partition: Partition) -> None:
    """Keep `partition` as the run's saved partition (just saved or verified by this process)."""
    _PARTITION.remember(RunPaths(run_dir).partition, partition)


def run_partition_file(run_dir: str | Path) -> Partition:
    """The run's saved partition (read once per process while the file is unchanged, and never by the
    process that saved it)."""
    return _PARTITION.get(RunPaths(run_dir).partition)


def run_device(config, run_dir: str | Path) -> torch.device:
    """The device every step of the run trains on: the one ``compute.json`` recorded when the run was
    prepared (``device: auto`` resolved once, so a round never mixes a CPU and a GPU); a record made
    before devices were recorded resolves `config.device` here. A worker without the recorded GPU
    raises RunError in one line."""
    recorded = run_compute_choice(run_dir).device.get("type")
    if recorded is None:
        return resolve_device(config.device)
    if recorded == "cuda" and not torch.cuda.is_available():
        raise RunError(f"{RunPaths(run_dir).compute}: the run trains on cuda, and this process sees no CUDA device")
    return torch.device(recorded)


def device_change(run_dir: str | Path, device: torch.device, allow_change: bool = False) -> str | None:
    """On resuming: None when the run's recorded device is `device`'s type (or none is recorded), else
    the change in one line ("trained on cpu, this machine resolves cuda (NVIDIA H100 ...)"). Without
    `allow_change` that line is a RunError; with it the caller must resolve and record the layout and
    precision anew (the calibration was the old device's)."""
    recorded = run_compute_choice(run_dir).device
    if not recorded or recorded.get("type") == device.type:
        return None
    before = recorded.get("type") if recorded.get("type") != "cuda" else f"cuda ({recorded.get('name')})"
    now = device.type if device.type != "cuda" else f"cuda ({torch.cuda.get_device_name(device)})"
    line = f"{RunPaths(run_dir).root}: trained on {before}, this machine resolves device to {now}"
    if not allow_change:
        raise RunError(f"{line}; resume it where it trained, or pass --allow-device-change (the layout and "
                       "precision are then calibrated again)")
    return line
