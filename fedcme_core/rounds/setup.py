"""Set-up and recovery of a run: its dataset, partition, layout and precision, and round 0.

The DVC stages (``flows/pipeline/stages.py``) call the same functions for the subset and the
partition, so a stage's partition file is the one a run would make itself.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedcme_core.client import compute as compute_module
from fedcme_core.data import datasets as data_module
from fedcme_core.algorithms import build_algorithm
from fedcme_core.client.compute import Compute, ComputeChoice
from fedcme_core.config.schema import ExperimentConfig
from fedcme_core.data.sources import resolve_mirror
from fedcme_core.client.evaluation import torch_threads
from fedcme_core.client.models import SplitModel, build_model, parameter_split, resolve_device
from fedcme_core.data.partition import class_counts
from fedcme_core.data.partition_file import Partition, load_partition, make_partition, save_partition
from fedcme_core.common.seeding import derive_seed
from fedcme_core.client.training import FP32, training_step
from fedcme_core.rounds import run_record, store
from fedcme_core.rounds.state import ServerState
from fedcme_core.rounds.store import RunError, RunPaths


@functools.lru_cache(maxsize=2)
def load_experiment_dataset(data_config, seed: int) -> data_module.Dataset:
    """The configured dataset (and subsets), loaded once per process, in PyTorch's default layout:
    a client's rows are put in the run's layout when it trains (a copy of the whole dataset in
    another layout would raise the peak memory by that much: 1.19x for CIFAR-10, bench/round.py)."""
    synthetic = data_config.synthetic
    normalise = data_config.normalise == "channel"
    if data_config.prepared_dir is not None:
        dataset = data_module.load_prepared(Path(data_config.prepared_dir), expected_name=data_config.dataset,
                                            normalise=normalise)
    else:
        dataset = data_module.load_dataset(
            data_config.dataset,
            data_dir=Path(data_config.data_dir),
            path=data_config.path,
            mirror=resolve_mirror(data_config.mirror),
            synthetic=data_module.SyntheticSpec(
                num_train=synthetic.num_train,
                num_test=synthetic.num_test,
                shape=tuple(synthetic.shape),
                noise=synthetic.noise,
                seed=seed,
            ),
            normalise=normalise,
        )
    return data_module.experiment_subset(dataset, data_config.train_subset, data_config.test_subset, seed,
                                         data_config.validation_fraction, data_config.evaluate_on)


def run_partition(config: ExperimentConfig, run_dir: str | Path) -> tuple[Partition, np.ndarray]:
    """The run's partition and its class counts [K, C] (read once per process)."""
    dataset = load_experiment_dataset(config.data, config.seed)
    partition = run_record.run_partition_file(run_dir)
    return partition, class_counts(dataset.y_train.numpy(), partition.clients, dataset.num_classes)


def new_model(config: ExperimentConfig, num_classes: int, device: torch.device | None = None,
              compute: Compute = FP32) -> SplitModel:
    model = build_model(config.model.name, num_classes, config.projection_dim, seed=derive_seed(config.seed, "init"),
                        classifier_layers=config.model.classifier_layers, input_shape=config.input_shape)
    return compute.model(model.to(device if device is not None else resolve_device(config.device)))


def split_line(config: ExperimentConfig, num_classes: int = 10) -> str:
    """"model cifar_cnn: extractor 61,156 + classifier 850 parameters (1 layer), feature 84-d": what an
    exchange of the classifier moves and which feature is aligned (printed at run start)."""
    model = new_model(config, num_classes, torch.device("cpu"))
    extractor, classifier = parameter_split(model)
    layers = config.model.classifier_layers
    return (f"model {config.model.name}: extractor {extractor:,} + classifier {classifier:,} parameters "
            f"({layers} layer{'s' if layers > 1 else ''}), feature {model.feature_dim}-d")


def available_cores() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def resolve_run_compute(config: ExperimentConfig, num_classes: int) -> ComputeChoice:
    """Layout and precision for a new run: fixed by the config, or calibrated on its model and
    batch shape (on one thread, whatever the runner, so every runner chooses alike)."""
    device = resolve_device(config.device)
    training = config.training
    key = f"{config.model.name}|{config.projection_dim}|{config.input_shape}|batch {training.batch_size}"
    step = training_step(config.model.name, num_classes, config.projection_dim, config.input_shape,
                                        training, device)
    with torch_threads(1):
        return compute_module.resolve(training.channels_last, training.precision, device, key, step)


def run_compute(run_dir: str | Path) -> Compute:
    """The run's layout and precision, as `prepare_run` recorded them (read once per process)."""
    return run_record.run_compute_choice(run_dir).compute


def checked_partition(config: ExperimentConfig, run_dir: str | Path, partition_file: str | Path | None,
                      labels: np.ndarray) -> Partition | None:
    """The partition the run will use, verified against `labels` (the run directory's own, else
    `partition_file`); None when the run is to draw its own. A damaged file, or one made for other
    data or another number of clients, is a one-line PartitionError or RunError naming the file."""
    paths = RunPaths(run_dir)
    if paths.partition.exists():
        return load_partition(paths.partition, labels=labels)
    if partition_file is None:
        return None
    partition = load_partition(Path(partition_file), labels=labels)
    if partition.params["num_clients"] != config.federation.num_clients:
        raise RunError(f"{partition_file}: has {partition.params['num_clients']} clients, "
                       f"the config's federation.num_clients is {config.federation.num_clients}")
    return partition


@dataclass(frozen=True)
class PreparedRun:
    """What :func:`prepare_run` made ready, as plain data (the step may run on another worker):
    the rounds already committed, the run's layout, precision and device with how they were chosen
    (``compute.json``'s record), and the partition's identity."""

    completed_rounds: int
    compute: ComputeChoice
    partition_hash: str  # Partition.content_hash
    partition_method: str  # Partition.params["method"]


def prepare_run(config: ExperimentConfig, run_dir: str | Path, partition_file: str | Path | None = None,
                allow_device_change: bool = False) -> PreparedRun:
    """Create (or reopen) a run directory: config, partition, the round-0 server state.

    Reopening with a different config is refused, so a resumed run is the same experiment; so is
    reopening it on another device than it trained on (one line naming both,
    :func:`fedcme_core.rounds.run_record.device_change`), unless `allow_device_change`, which prints
    that line and calibrates the layout and precision anew for the new device.
    Returns the run as prepared (:class:`PreparedRun`): its caller needs read nothing back.
    """
    paths = RunPaths(run_dir)
    if paths.config.exists():
        run_record.write_config(config, run_dir)  # refuses another config before anything is touched
    dataset = load_experiment_dataset(config.data, config.seed)
    labels = dataset.y_train.numpy()
    store.last_intact_round(paths.root)
    partition = checked_partition(config, run_dir, partition_file, labels)
    if not paths.partition.exists():
        if partition is None:
            partition = make_partition(labels, config.partition, config.federation.num_clients, config.seed)
        save_partition(partition, paths.partition)
    run_record.remember_partition(run_dir, partition)
    choice = None
    if paths.compute.exists():  # a resumed run keeps the layout and precision it chose, on its device
        change = run_record.device_change(run_dir, resolve_device(config.device), allow_device_change)
        if change is None:
            choice = run_record.run_compute_choice(run_dir)  # an earlier process's record
        else:
            print(f"{change}; calibrating the layout and precision again", flush=True)
    if choice is None:
        choice = resolve_run_compute(config, dataset.num_classes)
        run_record.write_compute_choice(run_dir, choice)
    run_record.write_config(config, run_dir)
    if store.completed_rounds(paths.root) == 0 and not paths.server_state(0).exists():
        model_state = new_model(config, dataset.num_classes, torch.device("cpu")).state_dict()
        algorithm = build_algorithm(config.algorithm)
        store.write_initial_server_state(run_dir, ServerState(round=0, model=model_state, client_state_rounds={},
                                                              algorithm=algorithm.server_init(model_state), history=()))
    return PreparedRun(completed_rounds=store.completed_rounds(paths.root), compute=choice,
                       partition_hash=partition.content_hash, partition_method=str(partition.params["method"]))


def final_model(config: ExperimentConfig, run_dir: str | Path) -> SplitModel:
    """The global model after the last committed round."""
    dataset = load_experiment_dataset(config.data, config.seed)
    model = new_model(config, dataset.num_classes, torch.device("cpu"))
    model.load_state_dict(store.load_server_state(run_dir, store.completed_rounds(run_dir))["model"])
    return model
