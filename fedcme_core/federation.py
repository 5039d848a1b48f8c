"""The round of every algorithm, as steps over files in a run directory.

One global round t (SPEC.md, "FedCME round t"; FedAvg and the baselines skip what they
do not use):

    select -> match -> phase 1 (local training; FedCME: floor(E/2) epochs, swap checkpoint)
           -> exchange (barrier) -> phase 2 (the remaining epochs) -> upload
           -> aggregate (model, global features, evaluation vectors) -> evaluate -> commit

Each step is a pure function of (config, run directory, round, client) that reads and
writes checkpoint files and returns small plain data, so an orchestrator (the Prefect
flow in ``flows/``, or the in-process :class:`SerialExecutor`) can run the clients of a
phase in parallel on any worker without live objects crossing. :func:`run_round` is the
only round loop; an executor only decides where the steps run. A round becomes visible
when :func:`commit_round` renames the next server state into place, so a run killed
mid-round resumes from the last committed round with identical results. The server state
before it is kept too, so a run whose latest state file is found corrupted resumes from the
last intact round. Clients that drop out, fail or send unusable updates are left out of
the round (``faults.py``) as long as ``federation.min_clients`` remain.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from . import compute as compute_module
from . import data as data_module
from .aggregation import select_clients, weighted_average
from .algorithms import Algorithm, ClientContext, build_algorithm
from .augment import augmentation
from .checkpoints import CheckpointError, atomic_write_bytes, load_checkpoint, save_checkpoint
from .compute import Compute, ComputeChoice
from .config import ExperimentConfig
from .evaluation import evaluate
from .exchange import exchange_checkpoints
from .faults import StepFailure, dropped_clients, require_enough_clients, surviving_donors, update_problem
from .features import GlobalFeatures, aggregate_global_features, local_statistics
from .matching import eval_subset, evaluation_vector
from .models import SplitModel, build_model, resolve_device
from .partition import Partition, class_counts, load_partition, save_partition
from .seeding import derive_seed, torch_generator
from .training import FP32, load_local_run, save_local_run, start_local_run, train_epochs


class RunError(ValueError):
    """A run directory cannot be used for this config; the message says why."""


class RecoveryWarning(UserWarning):
    """A run directory held a corrupted file; the run resumes from the last intact round."""


# ----------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class RunPaths:
    """Where a run keeps its files (everything under one directory)."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def partition(self) -> Path:
        return self.root / "partition.npz"

    @property
    def compute(self) -> Path:
        """The run's memory layout and precision, resolved once (fedcme_core.compute)."""
        return self.root / "compute.json"

    def server_state(self, round_index: int) -> Path:
        """The server state at the start of round `round_index` (after `round_index` rounds)."""
        return self.root / "server" / f"round-{round_index:04d}.pt"

    def round_dir(self, round_index: int) -> Path:
        return self.root / "rounds" / f"{round_index:04d}"

    def swap_checkpoint(self, round_index: int, client_id: int) -> Path:
        return self.round_dir(round_index) / f"client-{client_id:04d}-swap.pt"

    def exchanged_checkpoint(self, round_index: int, client_id: int) -> Path:
        return self.round_dir(round_index) / f"client-{client_id:04d}-exchanged.pt"

    def upload(self, round_index: int, client_id: int) -> Path:
        return self.round_dir(round_index) / f"client-{client_id:04d}-upload.pt"

    def aggregate(self, round_index: int) -> Path:
        return self.round_dir(round_index) / "aggregate.pt"

    def client_state(self, client_id: int, round_index: int) -> Path:
        return self.root / "clients" / f"client-{client_id:04d}-round-{round_index:04d}.pt"


EXPERIMENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def check_experiment_name(name: str) -> str:
    """An experiment name is one path component: letters, digits, '.', '_', '-' (no '/', no '..')."""
    if not EXPERIMENT_NAME.match(name) or ".." in name:
        raise RunError(f"experiment name {name!r}: use letters, digits, '.', '_' and '-' only (no '/' or '..')")
    return name


def experiment_run_dir(runs_dir: str | Path, experiment: str) -> Path:
    """runs_dir/experiment, for a name that cannot escape `runs_dir`."""
    return Path(runs_dir) / check_experiment_name(experiment)


def completed_rounds(run_dir: str | Path) -> int:
    """How many rounds the run has committed (0 for a new run)."""
    server_dir = RunPaths(run_dir).root / "server"
    rounds = [int(path.stem.removeprefix("round-")) for path in server_dir.glob("round-*.pt")]
    return max(rounds, default=0)


# ------------------------------------------------------------------------------- data
@functools.lru_cache(maxsize=2)
def load_experiment_dataset(data_config, seed: int) -> data_module.Dataset:
    """The configured dataset (and subsets), loaded once per process, in PyTorch's default layout:
    a client's rows are put in the run's layout when it trains (a copy of the whole dataset in
    another layout would raise the peak memory by that much: 1.19x for CIFAR-10, bench/round.py)."""
    synthetic = data_config.synthetic
    if data_config.prepared_dir is not None:
        dataset = data_module.load_prepared(Path(data_config.prepared_dir), expected_name=data_config.dataset)
    else:
        dataset = data_module.load_dataset(
            data_config.dataset,
            data_dir=Path(data_config.data_dir),
            mirror=data_module.resolve_mirror(data_config.mirror),
            synthetic=data_module.SyntheticSpec(
                num_train=synthetic.num_train,
                num_test=synthetic.num_test,
                shape=tuple(synthetic.shape),
                noise=synthetic.noise,
                seed=seed,
            ),
        )
    if data_config.train_subset is not None or data_config.test_subset is not None:
        dataset = data_module.subset(
            dataset, train=data_config.train_subset, test=data_config.test_subset, seed=derive_seed(seed, "subset")
        )
    return dataset


@functools.lru_cache(maxsize=4)
def _load_run_partition(path: str, modified_ns: int) -> Partition:
    return load_partition(Path(path))


def _run_partition_file(run_dir: str | Path) -> Partition:
    """The run's saved partition (cached per process while the file is unchanged)."""
    path = RunPaths(run_dir).partition
    return _load_run_partition(str(path), path.stat().st_mtime_ns)


def run_partition(config: ExperimentConfig, run_dir: Path) -> tuple[Partition, np.ndarray]:
    """The run's partition and its class counts [K, C] (cached per process)."""
    dataset = load_experiment_dataset(config.data, config.seed)
    partition = _run_partition_file(run_dir)
    return partition, class_counts(dataset.y_train.numpy(), partition.clients, dataset.num_classes)


def make_partition(config: ExperimentConfig, labels: np.ndarray) -> Partition:
    return Partition.create(
        labels,
        method=config.partition.method,
        num_clients=config.federation.num_clients,
        alpha=config.partition.alpha,
        seed=config.seed,
        min_size=config.partition.min_size,
        sigma=config.partition.sigma,
    )


# ---------------------------------------------------------------------- run set-up
def new_model(config: ExperimentConfig, num_classes: int, device: torch.device | None = None,
              compute: Compute = FP32) -> SplitModel:
    model = build_model(config.model.name, num_classes, config.projection_dim, seed=derive_seed(config.seed, "init"))
    return compute.model(model.to(device if device is not None else resolve_device(config.device)))


def resolve_run_compute(config: ExperimentConfig, num_classes: int) -> ComputeChoice:
    """Layout and precision for a new run: fixed by the config, or calibrated on its model and
    batch shape (on one thread, whatever the runner, so every runner chooses alike)."""
    device = resolve_device(config.device)
    training = config.training
    key = f"{config.model.name}|{config.projection_dim}|{config.input_shape}|batch {training.batch_size}"
    step = compute_module.training_step(config.model.name, num_classes, config.projection_dim, config.input_shape,
                                        training, device)
    with torch_threads(1):
        return compute_module.resolve(training.channels_last, training.precision, device, key, step)


def run_compute(run_dir: str | Path) -> Compute:
    """The run's layout and precision, as `prepare_run` recorded them (read once per process)."""
    return run_compute_choice(run_dir).compute


def run_compute_choice(run_dir: str | Path) -> ComputeChoice:
    """The run's recorded choice with how it was made (calibration figures included)."""
    path = RunPaths(run_dir).compute
    try:
        return _cached_compute(str(path), path.stat().st_mtime_ns)
    except FileNotFoundError:
        raise RunError(f"{path}: missing; the run directory was not prepared (prepare_run)") from None


@functools.lru_cache(maxsize=4)
def _cached_compute(path: str, modified_ns: int) -> ComputeChoice:
    try:
        return ComputeChoice.from_json(json.loads(Path(path).read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError) as error:
        raise RunError(f"{path}: not a valid compute record ({error})") from None


def _config_json(config: ExperimentConfig) -> str:
    """The config that defines a run's results: without `federation.rounds` (a run can be
    extended) and `runner` (any runner gives the same results)."""
    values = config.model_dump(mode="json", exclude={"runner": True, "federation": {"rounds"}})
    return json.dumps(values, indent=2, sort_keys=True) + "\n"


def run_directory_matches(config: ExperimentConfig, run_dir: str | Path) -> bool:
    """True when `run_dir` is new or holds a run of this config (so it can be resumed or extended)."""
    path = RunPaths(run_dir).config
    return not path.exists() or path.read_text(encoding="utf-8") == _config_json(config)


def prepare_run(config: ExperimentConfig, run_dir: str | Path, partition_file: str | Path | None = None) -> int:
    """Create (or reopen) a run directory: config, partition, the round-0 server state.

    Reopening with a different config is refused, so a resumed run is the same experiment.
    Returns the number of rounds already completed.
    """
    paths = RunPaths(run_dir)
    wanted = _config_json(config)
    if paths.config.exists():
        if paths.config.read_text(encoding="utf-8") != wanted:
            raise RunError(f"{paths.root}: holds a run of a different config; use a new experiment name or directory")
    dataset = load_experiment_dataset(config.data, config.seed)
    labels = dataset.y_train.numpy()
    last_intact_round(paths.root)
    if not paths.partition.exists():
        if partition_file is not None:
            partition = load_partition(Path(partition_file), labels=labels)
            if partition.params["num_clients"] != config.federation.num_clients:
                raise RunError(
                    f"{partition_file}: has {partition.params['num_clients']} clients, "
                    f"the config's federation.num_clients is {config.federation.num_clients}"
                )
        else:
            partition = make_partition(config, labels)
        save_partition(partition, paths.partition)
    else:
        load_partition(paths.partition, labels=labels)
    if not paths.compute.exists():  # a resumed run keeps the layout and precision it chose
        choice = resolve_run_compute(config, dataset.num_classes)
        atomic_write_bytes(paths.compute, (json.dumps(choice.to_json(), indent=2, sort_keys=True) + "\n").encode("utf-8"))
    if not paths.config.exists():
        atomic_write_bytes(paths.config, wanted.encode("utf-8"))
    if completed_rounds(paths.root) == 0 and not paths.server_state(0).exists():
        model = new_model(config, dataset.num_classes, torch.device("cpu"))
        save_checkpoint(
            {
                "round": 0,
                "model": model.state_dict(),
                "global_features": None,
                "evaluation_vectors": {},
                "client_state_rounds": {},
                "history": [],
            },
            paths.server_state(0),
        )
    return completed_rounds(paths.root)


def last_intact_round(run_dir: str | Path) -> int:
    """The latest committed round whose server state loads; corrupted later states are moved
    aside (``round-XXXX.pt.corrupt``, never deleted) with a :class:`RecoveryWarning`."""
    paths = RunPaths(run_dir)
    while True:
        latest = completed_rounds(paths.root)
        path = paths.server_state(latest)
        if not path.exists():
            return latest
        try:
            load_checkpoint(path)
            return latest
        except CheckpointError as error:
            if not paths.server_state(latest - 1).exists():
                raise CheckpointError(f"{error}; no earlier intact round to resume from") from None
            quarantine = path.with_name(path.name + ".corrupt")
            os.replace(path, quarantine)
            warnings.warn(
                f"{error}; moved to {quarantine.name}, resuming from round {latest - 1}", RecoveryWarning, stacklevel=2
            )


def load_server_state(run_dir: str | Path, round_index: int) -> dict[str, Any]:
    return load_checkpoint(RunPaths(run_dir).server_state(round_index))


def shared_server_state(run_dir: str | Path, round_index: int) -> dict[str, Any]:
    """The server state of round t, read once per process for all its clients' tasks (read-only:
    the same dict is handed to every caller until the file changes)."""
    path = RunPaths(run_dir).server_state(round_index)
    file_status = path.stat()
    return _cached_server_state(str(path), file_status.st_mtime_ns, file_status.st_size)


@functools.lru_cache(maxsize=1)
def _cached_server_state(path: str, modified_ns: int, size: int) -> dict[str, Any]:
    return load_checkpoint(Path(path))


def phase_epochs(config: ExperimentConfig, algorithm: Algorithm) -> list[tuple[int, int]]:
    """(first, last) epoch of each local phase: split at floor(E/2) when clients exchange."""
    epochs = config.training.local_epochs
    if algorithm.exchanges:
        return [(0, epochs // 2), (epochs // 2, epochs)]
    return [(0, epochs)]


# --------------------------------------------------------------------------- steps
def select_step(config: ExperimentConfig, round_index: int) -> list[int]:
    """SPEC step 1: M of K clients, seeded by (seed, round)."""
    federation = config.federation
    return select_clients(federation.num_clients, federation.clients_per_round, seed=config.seed, round_index=round_index)


def match_step(config: ExperimentConfig, run_dir: str | Path, round_index: int, selected: list[int]) -> dict[str, Any]:
    """SPEC step 2 (Algorithm 1, line 8: MakeMatching): pairs and receiver -> donor."""
    algorithm = build_algorithm(config.algorithm)
    state = load_server_state(run_dir, round_index)
    vectors = {int(client): vector.numpy() for client, vector in state["evaluation_vectors"].items()}
    matching = algorithm.match(selected, vectors, seed=config.seed, round_index=round_index)
    return {
        "pairs": [[int(a), int(b)] for a, b in matching.pairs],
        "donors": {int(receiver): int(donor) for receiver, donor in matching.donors.items()},
    }


def _client_context(state, round_index, client_id, counts, run_dir) -> ClientContext:
    features = state["global_features"]
    previous = None
    state_round = state["client_state_rounds"].get(client_id)
    if state_round is not None:
        previous = load_checkpoint(RunPaths(run_dir).client_state(client_id, state_round))["model"]
    return ClientContext(
        client_id=client_id,
        round_index=round_index,
        class_counts=counts[client_id],
        global_state=state["model"],
        global_features=GlobalFeatures.from_dict(features) if features is not None else None,
        previous_state=previous,
    )


def train_phase_step(
    config: ExperimentConfig,
    run_dir: str | Path,
    round_index: int,
    client_id: int,
    phase_index: int,
    start_checkpoint: str | None = None,
) -> dict[str, Any]:
    """SPEC steps 4, 6, 7: one client's local phase; the last phase also writes the upload.

    Phase 0 starts from the global model w^t; a later phase resumes `start_checkpoint`
    (the swap checkpoint, or its exchanged version). Returns small plain data.
    """
    run_dir = Path(run_dir)
    paths = RunPaths(run_dir)
    algorithm = build_algorithm(config.algorithm)
    compute = run_compute(run_dir)
    dataset = load_experiment_dataset(config.data, config.seed)
    partition, counts = run_partition(config, run_dir)
    state = shared_server_state(run_dir, round_index)
    device = resolve_device(config.device)
    indices = torch.tensor(partition.clients[client_id])
    # Once per client and phase, so that every batch is gathered in the run's layout.
    inputs = compute.layout(dataset.x_train[indices].to(device))  # [D_k, C_in, H, W]
    labels = dataset.y_train[indices].to(device)  # [D_k]

    model = new_model(config, dataset.num_classes, device, compute)
    phases = phase_epochs(config, algorithm)
    first_epoch, last_epoch = phases[phase_index]
    if phase_index == 0:
        model.load_state_dict(state["model"])
        run = start_local_run(model, config.training, torch_generator(config.seed, "train", round_index, client_id))
    else:
        if start_checkpoint is None:
            raise RunError(f"phase {phase_index} of client {client_id} needs a start checkpoint")
        run = load_local_run(start_checkpoint, model, config.training)
        if run.epochs_done != first_epoch:
            raise CheckpointError(f"{start_checkpoint}: holds {run.epochs_done} epochs, phase starts at {first_epoch}")
    context = _client_context(state, round_index, client_id, counts, run_dir)
    hooks = algorithm.client_hooks(model, context)

    started = time.perf_counter()
    train_epochs(run, inputs, labels, hooks, last_epoch - first_epoch, config.training.batch_size, compute,
                 augmentation(config.augmentation))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    summary = {
        "client": client_id,
        "phase": phase_index,
        "seconds": seconds,
        "work_seconds": seconds,
        "samples": int(labels.shape[0]) * (last_epoch - first_epoch),
        "loss": run.epoch_losses[-1],
    }
    if phase_index < len(phases) - 1:
        save_local_run(run, paths.swap_checkpoint(round_index, client_id), client=client_id, round=round_index)
        return summary

    upload: dict[str, Any] = {
        "client": client_id,
        "round": round_index,
        "num_samples": int(labels.shape[0]),
        "model": {key: value.detach().cpu() for key, value in model.state_dict().items()},
        "epoch_losses": list(run.epoch_losses),
    }
    started = time.perf_counter()
    upload.update(_client_report(config, algorithm, model, inputs, labels, dataset.num_classes, round_index, client_id))
    summary["work_seconds"] += time.perf_counter() - started
    if algorithm.keeps_client_state:
        save_checkpoint({"model": upload["model"]}, paths.client_state(client_id, round_index))
    save_checkpoint(upload, paths.upload(round_index, client_id))
    return summary


def _client_report(
    config: ExperimentConfig,
    algorithm: Algorithm,
    model: SplitModel,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    round_index: int,
    client_id: int,
) -> dict[str, Any]:
    """SPEC step 7: eps_k^t on a random subset D_eval_k of D_k and the local features zeta_k^t,
    in one pass over D_k when the algorithm uses both."""
    report: dict[str, Any] = {}
    subset = None
    if algorithm.uses_evaluation_vectors:
        subset = eval_subset(
            labels.cpu().numpy(), config.algorithm.eval_fraction, seed=config.seed, round_index=round_index, client_id=client_id
        )
    if algorithm.uses_global_features:
        statistics = local_statistics(model, inputs, labels, num_classes, eval_positions=subset)
        report["local_features"], report["feature_counts"] = statistics.feature_means, statistics.feature_counts
        if subset is not None:
            report["evaluation_vector"] = torch.from_numpy(statistics.evaluation_vector)
    elif subset is not None:
        report["evaluation_vector"] = torch.from_numpy(evaluation_vector(model, inputs[subset], labels[subset], num_classes))
    return report


def exchange_step(
    config: ExperimentConfig, run_dir: str | Path, round_index: int, donors: dict[int, int]
) -> dict[int, str]:
    """SPEC step 5 (barrier): returns each client's phase-2 start checkpoint."""
    paths = RunPaths(run_dir)
    algorithm = build_algorithm(config.algorithm)
    clients = {*donors, *donors.values()}
    sources = {client: paths.swap_checkpoint(round_index, client) for client in clients}
    destinations = {client: paths.exchanged_checkpoint(round_index, client) for client in donors}
    received = exchange_checkpoints(sources, donors, algorithm.exchange_part, destinations) if donors else []
    return {client: str(destinations[client]) for client in received}


def phase_two_start(run_dir: str | Path, round_index: int, client_id: int, exchanged: dict[int, str]) -> str:
    return exchanged.get(client_id, str(RunPaths(run_dir).swap_checkpoint(round_index, client_id)))


def usable_uploads(
    config: ExperimentConfig, run_dir: str | Path, round_index: int, clients: list[int]
) -> tuple[list[dict[str, Any]], dict[int, str]]:
    """The uploads the server accepts, and client -> why each other upload is rejected."""
    paths = RunPaths(run_dir)
    accepted, rejected = [], {}
    for client in sorted(clients):
        try:
            upload = load_checkpoint(paths.upload(round_index, client))
        except CheckpointError as error:
            rejected[int(client)] = str(error)
            continue
        problem = update_problem(upload, config.federation.max_update_loss)
        if problem is None:
            accepted.append(upload)
        else:
            rejected[int(client)] = problem
    return accepted, rejected


def aggregate_step(
    config: ExperimentConfig, run_dir: str | Path, round_index: int, clients: list[int], lost: dict[int, str] | None = None
) -> dict[str, Any]:
    """SPEC step 8: w^{t+1}, zeta^{t+1} and the evaluation-vector table, to a pending file.

    Updates with non-finite values or a diverged loss are rejected first; `lost` (client ->
    reason) names the clients that dropped out or failed, for the error when too few remain.
    """
    algorithm = build_algorithm(config.algorithm)
    state = load_server_state(run_dir, round_index)
    uploads, rejected = usable_uploads(config, run_dir, round_index, clients)
    require_enough_clients(round_index, len(uploads), config.federation.min_clients, {**(lost or {}), **rejected})
    weights = [float(upload["num_samples"]) for upload in uploads]
    model = weighted_average([upload["model"] for upload in uploads], weights)

    features = state["global_features"]
    if algorithm.uses_global_features:
        previous = GlobalFeatures.from_dict(features) if features is not None else None
        aggregated = aggregate_global_features(
            [(u["local_features"], u["feature_counts"], w) for u, w in zip(uploads, weights)], previous
        )
        features = aggregated.to_dict()
    vectors = dict(state["evaluation_vectors"])
    client_state_rounds = dict(state["client_state_rounds"])
    for upload in uploads:
        if algorithm.uses_evaluation_vectors:
            vectors[upload["client"]] = upload["evaluation_vector"]
        if algorithm.keeps_client_state:
            client_state_rounds[upload["client"]] = round_index
    train_loss = float(np.average([upload["epoch_losses"][-1] for upload in uploads], weights=weights))
    save_checkpoint(
        {
            "model": model,
            "global_features": features,
            "evaluation_vectors": vectors,
            "client_state_rounds": client_state_rounds,
            "train_loss": train_loss,
        },
        RunPaths(run_dir).aggregate(round_index),
    )
    uploaded_vectors = {
        int(upload["client"]): [float(value) for value in upload["evaluation_vector"]]
        for upload in uploads
        if algorithm.uses_evaluation_vectors
    }
    return {
        "train_loss": train_loss,
        "clients": len(uploads),
        "evaluation_vectors": uploaded_vectors,
        "rejected": rejected,
    }


def available_cores() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block with `count` torch intra-op threads, then restore the previous count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def evaluate_step(config: ExperimentConfig, run_dir: str | Path, round_index: int) -> dict[str, Any]:
    """Test-set accuracy and loss of the aggregated global model w^{t+1}.

    The round's clients have finished, so the evaluation takes every core of its machine
    (same figures as on one thread: the batches' per-sample results do not depend on it).
    """
    compute = run_compute(run_dir)
    dataset = load_experiment_dataset(config.data, config.seed)
    model = new_model(config, dataset.num_classes, compute=compute)
    model.load_state_dict(load_checkpoint(RunPaths(run_dir).aggregate(round_index))["model"])
    with torch_threads(available_cores()):
        result = evaluate(model, dataset.x_test, dataset.y_test, dataset.num_classes)
    return {
        "test_accuracy": result.accuracy,
        "test_loss": result.loss,
        "per_class_accuracy": [float(value) for value in result.per_class_accuracy],
    }


def commit_round(config: ExperimentConfig, run_dir: str | Path, round_index: int, record: dict[str, Any]) -> dict[str, Any]:
    """Make round t visible: write the server state of round t+1, then drop round t's scratch files."""
    paths = RunPaths(run_dir)
    previous = load_server_state(run_dir, round_index)
    pending = load_checkpoint(paths.aggregate(round_index))
    history = [*previous["history"], record]
    save_checkpoint(
        {
            "round": round_index + 1,
            "model": pending["model"],
            "global_features": pending["global_features"],
            "evaluation_vectors": pending["evaluation_vectors"],
            "client_state_rounds": pending["client_state_rounds"],
            "history": history,
        },
        paths.server_state(round_index + 1),
    )
    # Keep the states of rounds t and t+1 (the fallback if t+1 is found corrupted) and the
    # client states they refer to; older ones are superseded.
    for stale in paths.server_state(round_index).parent.glob("round-*.pt"):
        if stale.name < paths.server_state(round_index).name:
            stale.unlink(missing_ok=True)
    if not config.runner.keep_round_files:
        shutil.rmtree(paths.round_dir(round_index), ignore_errors=True)
    referenced = {
        paths.client_state(client, state_round)
        for state in (previous, pending)
        for client, state_round in state["client_state_rounds"].items()
    }
    for stored in paths.client_state(0, 0).parent.glob("client-*-round-*.pt"):
        if stored not in referenced:
            stored.unlink(missing_ok=True)
    return record


# ------------------------------------------------------------------------ the round
class Executor(Protocol):
    """Where the steps of a round run: in-process, or as orchestrator tasks."""

    def call(self, step: str, function: Callable[..., Any], *args: Any) -> Any: ...

    def map(
        self,
        step: str,
        function: Callable[..., Any],
        arguments: Sequence[tuple],
        retries: int = 0,
        costs: Sequence[float] | None = None,
    ) -> list[Any | StepFailure]:
        """function(*args) for each args (in parallel where it can), each run up to
        1 + `retries` times; one that still raises gives a :class:`StepFailure` in its place.
        `costs` (one per args, e.g. the client's samples) may guide how the calls are grouped."""
        ...


class SerialExecutor:
    """Runs every step in this process, clients one after another."""

    def call(self, step: str, function: Callable[..., Any], *args: Any) -> Any:
        return function(*args)

    def map(
        self,
        step: str,
        function: Callable[..., Any],
        arguments: Sequence[tuple],
        retries: int = 0,
        costs: Sequence[float] | None = None,
    ) -> list[Any | StepFailure]:
        return [with_retries(function, args, retries) for args in arguments]


def balanced_groups(costs: Sequence[float], num_groups: int) -> list[list[int]]:
    """Positions of `costs` split into at most `num_groups` groups of near-equal total cost:
    longest first, each to the group with the least cost so far (LPT; ties go to the lower
    group, then the lower position). Groups keep their positions in descending cost; empty
    groups are left out."""
    if num_groups < 1:
        raise ValueError(f"num_groups must be at least 1, got {num_groups}")
    loads = [0.0] * num_groups
    groups: list[list[int]] = [[] for _ in range(num_groups)]
    for position in sorted(range(len(costs)), key=lambda index: (-costs[index], index)):
        lightest = min(range(num_groups), key=lambda group: (loads[group], group))
        groups[lightest].append(position)
        loads[lightest] += costs[position]
    return [group for group in groups if group]


def largest_first(clients: Sequence[int], sizes: Sequence[int] | dict[int, int]) -> list[int]:
    """`clients` by descending size (`sizes[client]`, e.g. its samples), ties by client id: the
    order in which a round hands a phase's clients to the workers."""
    return sorted(clients, key=lambda client: (-sizes[client], client))


def with_retries(function: Callable[..., Any], args: tuple, retries: int) -> Any | StepFailure:
    """function(*args), run up to 1 + `retries` times; a :class:`StepFailure` if it still raises."""
    for attempt in range(retries + 1):
        try:
            return function(*args)
        except Exception as error:  # a client's failure is data for the round, not the run's end
            if attempt == retries:
                return StepFailure.from_exception(error)
    raise AssertionError("unreachable")


def run_round(config: ExperimentConfig, run_dir: str | Path, round_index: int, executor: Executor) -> dict[str, Any]:
    """One global round of any algorithm (the only round loop body); returns its record."""
    run_dir = str(run_dir)
    algorithm = build_algorithm(config.algorithm)
    round_started = time.perf_counter()
    timings: dict[str, float] = {}

    def timed(name: str, action: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        result = action()
        timings[f"{name}_seconds"] = time.perf_counter() - started
        return result

    selected = executor.call("select", select_step, config, round_index)
    matching = executor.call("match", match_step, config, run_dir, round_index, selected)
    # Simulated availability: the server matched them, but they never train this round.
    dropped = dropped_clients(selected, config.federation.dropout, seed=config.seed, round_index=round_index)
    training = [client for client in selected if client not in dropped]
    failed: dict[int, str] = {}

    # Largest client first: a phase ends when its slowest worker does, and longest-first
    # submission to the workers' FIFO queue keeps the last tasks short (LPT scheduling).
    client_sizes = {client: len(indices) for client, indices in enumerate(_run_partition_file(run_dir).clients)}

    def train_phase(phase_index: int, starts: dict[int, str]) -> list[dict[str, Any]]:
        """Train `training` for one phase; clients whose task still fails after retries leave the round."""
        order = largest_first(training, client_sizes)
        arguments = [(config, run_dir, round_index, client, phase_index, starts.get(client)) for client in order]
        costs = [float(client_sizes[client]) for client in order]
        results = executor.map("train_phase", train_phase_step, arguments, config.runner.retries, costs)
        results = dict(zip(order, results, strict=True))
        finished = []
        for client in list(training):
            if isinstance(results[client], StepFailure):
                failed[client] = f"local training (phase {phase_index + 1}) failed: {results[client].reason}"
                training.remove(client)
            else:
                finished.append(results[client])
        return finished

    phases = phase_epochs(config, algorithm)
    summaries = timed("phase1", lambda: train_phase(0, {}))
    phase_summaries = [summaries]
    if len(phases) == 2:
        # SPEC step 5: counterparts exchange; one whose partner is lost trains on with its own model.
        donors = surviving_donors({int(r): int(d) for r, d in matching["donors"].items()}, training)
        exchanged = timed("exchange", lambda: executor.call("exchange", exchange_step, config, run_dir, round_index, donors))
        starts = {client: phase_two_start(run_dir, round_index, client, exchanged) for client in training}
        phase_summaries.append(timed("phase2", lambda: train_phase(1, starts)))
        summaries = summaries + phase_summaries[-1]
    lost = {**{client: "dropped out (simulated availability)" for client in dropped}, **failed}
    aggregate = timed(
        "aggregate", lambda: executor.call("aggregate", aggregate_step, config, run_dir, round_index, training, lost)
    )
    metrics = timed("evaluate", lambda: executor.call("evaluate", evaluate_step, config, run_dir, round_index))
    record = {
        "round": round_index,
        "selected": [int(client) for client in selected],
        "pairs": matching["pairs"],
        "evaluation_vectors": aggregate["evaluation_vectors"],
        "train_loss": aggregate["train_loss"],
        **metrics,
        "client_train_seconds": float(sum(summary["seconds"] for summary in summaries)),
        # Local training plus the client's step-7 report (features, evaluation vector).
        "client_work_seconds": float(sum(summary["work_seconds"] for summary in summaries)),
        # The longest client's work in each phase, summed: no layout finishes a round's phases sooner.
        "critical_client_seconds": float(
            sum(max((summary["work_seconds"] for summary in phase), default=0.0) for phase in phase_summaries)
        ),
        "samples_trained": int(sum(summary["samples"] for summary in summaries)),
        "aggregated_clients": aggregate["clients"],
        "dropped_clients": len(dropped),
        "failed_clients": len(failed),
        "rejected_clients": len(aggregate["rejected"]),
        "failures": {**failed, **aggregate["rejected"]},
        **timings,
    }
    record["round_seconds"] = time.perf_counter() - round_started
    return executor.call("commit", commit_round, config, run_dir, round_index, record)


def run_experiment(
    config: ExperimentConfig,
    run_dir: str | Path,
    executor: Executor | None = None,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    partition_file: str | Path | None = None,
    on_start: Callable[[list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Train for config.federation.rounds rounds, resuming a partial run; returns the history.

    `on_start` receives the history of the rounds already committed (a resumed run),
    `on_round` each new round's record after its commit.
    """
    executor = executor or SerialExecutor()
    run_dir = str(run_dir)
    executor.call("prepare", prepare_run, config, run_dir, None if partition_file is None else str(partition_file))
    if on_start is not None:
        on_start(load_server_state(run_dir, completed_rounds(run_dir))["history"])
    for round_index in range(completed_rounds(run_dir), config.federation.rounds):
        record = run_round(config, run_dir, round_index, executor)
        if on_round is not None:
            on_round(record)
    return load_server_state(run_dir, completed_rounds(run_dir))["history"]


def final_model(config: ExperimentConfig, run_dir: str | Path) -> SplitModel:
    """The global model after the last committed round."""
    dataset = load_experiment_dataset(config.data, config.seed)
    model = new_model(config, dataset.num_classes, torch.device("cpu"))
    model.load_state_dict(load_server_state(run_dir, completed_rounds(run_dir))["model"])
    return model
