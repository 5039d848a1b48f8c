"""The steps of one global round (SPEC.md, "FedCME round t"), each a thin function of
(config, run directory, round, client) that reads and writes through the run store and
returns a small typed result (:mod:`fedcme_core.rounds.state`: frozen dataclasses, picklable),
so any executor can run it on any worker.

    select -> match -> phase 1 (local training; an exchanging algorithm stops at floor(E/2)
           and writes swap checkpoints) -> exchange (barrier) -> phase 2 -> upload (step 7)
           -> aggregate (w^{t+1} and the algorithm's state) -> evaluate -> commit

(an algorithm of one phase has no exchange; one of more phases exchanges at each boundary).

What differs between algorithms is asked of the algorithm's hooks (``fedcme_core.algorithms``).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedcme_core.server.aggregation import select_clients, weighted_average
from fedcme_core.algorithms import ClientContext, Matching, Upload, build_algorithm, round_phases
from fedcme_core.results.records import RoundRecord
from fedcme_core.data.augment import augmentation
from fedcme_core.common.checkpoints import CheckpointError
from fedcme_core.config.schema import ExperimentConfig
from fedcme_core.client.evaluation import evaluate, local_accuracy
from fedcme_core.server.faults import require_enough_clients, update_problem
from fedcme_core.client.device_flags import configure_device
from fedcme_core.common.seeding import torch_generator
from fedcme_core.client.training import load_local_run, save_local_run, start_local_run, train_epochs
from fedcme_core.rounds import run_record, store
from fedcme_core.rounds.device import client_data, worker_stream
from fedcme_core.rounds.run_shares import run_test_shares
from fedcme_core.rounds.setup import available_cores, load_experiment_dataset, new_model, run_compute, run_partition
from fedcme_core.rounds.state import Aggregate, Evaluation, Exchange, PhaseResult, Selection, ServerState
from fedcme_core.rounds.store import RunError, RunPaths


def select_step(config: ExperimentConfig, round_index: int) -> Selection:
    """SPEC step 1: M of K clients, seeded by (seed, round)."""
    federation = config.federation
    return Selection(tuple(int(client) for client in select_clients(
        federation.num_clients, federation.clients_per_round, seed=config.seed, round_index=round_index)))


def match_step(config: ExperimentConfig, run_dir: str | Path, round_index: int, selected: list[int]) -> Matching:
    """SPEC step 2 (Algorithm 1, line 8: MakeMatching): pairs and receiver -> donor."""
    algorithm = build_algorithm(config.algorithm)
    state = store.server_state(run_dir, round_index, algorithm.state_class)
    return algorithm.match(selected, state.algorithm, seed=config.seed, round_index=round_index).plain()


def client_context(config: ExperimentConfig, run_dir: str | Path, state: ServerState, round_index: int,
                   client_id: int, counts: np.ndarray) -> ClientContext:
    """SPEC step 3: what the server sends client k (w^t, the algorithm's state) and what was kept for it."""
    return ClientContext(
        client_id=client_id,
        round_index=round_index,
        class_counts=counts[client_id],
        global_state=state.model,
        server=state.algorithm,
        client_state=store.load_client_state(run_dir, client_id, state.client_state_rounds.get(client_id)),
        seed=config.seed,
        learning_rate=config.training.lr,
    )


def train_phase_step(
    config: ExperimentConfig,
    run_dir: str | Path,
    round_index: int,
    client_id: int,
    phase_index: int,
    start_checkpoint: str | None = None,
) -> PhaseResult:
    """SPEC steps 4, 6, 7: one client's local phase; the last phase also writes the upload.

    Phase 0 starts from the global model w^t; a later phase resumes `start_checkpoint`
    (the swap checkpoint, or its exchanged version).
    """
    paths = RunPaths(run_dir)
    algorithm = build_algorithm(config.algorithm)
    compute = run_compute(run_dir)
    dataset = load_experiment_dataset(config.data, config.seed)
    partition, counts = run_partition(config, run_dir)
    state = store.server_state(run_dir, round_index, algorithm.state_class)
    device = run_record.run_device(config, run_dir)  # the run's, resolved once: a round never mixes devices
    configure_device(device, compute.precision)  # this process's flags (a Dask worker's included)
    # Once per client and phase, so that every batch is gathered in the run's layout.
    inputs, labels = client_data(dataset, torch.tensor(partition.clients[client_id]), device, compute)  # [D_k, ...]

    model = new_model(config, dataset.num_classes, device, compute)
    phases = round_phases(algorithm, config.training.local_epochs)
    first_epoch, last_epoch = phases[phase_index]
    if phase_index == 0:
        model.load_state_dict(state.model)
        run = start_local_run(model, config.training, torch_generator(config.seed, "train", round_index, client_id))
    else:
        if start_checkpoint is None:
            raise RunError(f"phase {phase_index} of client {client_id} needs a start checkpoint")
        run = load_local_run(start_checkpoint, model, config.training)
        if run.epochs_done != first_epoch:
            raise CheckpointError(f"{start_checkpoint}: holds {run.epochs_done} epochs, phase starts at {first_epoch}")
    context = client_context(config, run_dir, state, round_index, client_id, counts)
    hooks = algorithm.client_hooks(model, context)

    started = time.perf_counter()
    with worker_stream(device):
        train_epochs(run, inputs, labels, hooks, last_epoch - first_epoch, config.training.batch_size, compute,
                     augmentation(config.augmentation))
    seconds = time.perf_counter() - started
    result = PhaseResult(client=client_id, phase=phase_index, seconds=seconds, work_seconds=seconds,
                         samples=int(labels.shape[0]) * (last_epoch - first_epoch), loss=run.epoch_losses[-1])
    if phase_index < len(phases) - 1:
        save_local_run(run, paths.swap_checkpoint(round_index, client_id), client=client_id, round=round_index)
        return result

    model_state = {key: value.detach().cpu() for key, value in model.state_dict().items()}
    started = time.perf_counter()
    with worker_stream(device):
        report = algorithm.client_update(model, inputs, labels, context, hooks)
    result = dataclasses.replace(result, work_seconds=seconds + time.perf_counter() - started)
    kept = algorithm.client_state(model_state, report, context)
    if kept is not None:
        store.save_client_state(run_dir, client_id, round_index, kept)
    store.save_upload(run_dir, round_index, client_id, {
        "client": client_id, "round": round_index, "num_samples": int(labels.shape[0]), "model": model_state,
        "epoch_losses": list(run.epoch_losses), "report": report, "keeps_state": kept is not None,
    })
    return result


def exchange_step(config: ExperimentConfig, run_dir: str | Path, round_index: int, donors: dict[int, int]) -> Exchange:
    """SPEC step 5 (barrier): returns each receiver's next-phase start checkpoint."""
    paths = RunPaths(run_dir)
    clients = {*donors, *donors.values()}
    sources = {client: paths.swap_checkpoint(round_index, client) for client in clients}
    destinations = {client: paths.exchanged_checkpoint(round_index, client) for client in donors}
    received = build_algorithm(config.algorithm).exchange(sources, donors, destinations)
    return Exchange({client: str(destinations[client]) for client in received})


def later_phase_start(run_dir: str | Path, round_index: int, client_id: int, exchanged: Exchange) -> str:
    """Where a client's phase after the first starts: the checkpoint the exchange before it wrote for
    the client, else its own swap checkpoint."""
    return exchanged.start(client_id, str(RunPaths(run_dir).swap_checkpoint(round_index, client_id)))


def usable_uploads(config: ExperimentConfig, run_dir: str | Path, round_index: int,
                   clients: list[int]) -> tuple[list[dict[str, Any]], dict[int, str]]:
    """The uploads the server accepts, and client -> why each other upload is rejected."""
    accepted, rejected = [], {}
    for client in sorted(clients):
        try:
            upload = store.load_upload(run_dir, round_index, client)
        except CheckpointError as error:
            rejected[int(client)] = str(error)
            continue
        problem = update_problem(upload, config.federation.max_update_loss)
        if problem is None:
            accepted.append(upload)
        else:
            rejected[int(client)] = problem
    return accepted, rejected


def aggregate_step(config: ExperimentConfig, run_dir: str | Path, round_index: int, clients: list[int],
                   lost: dict[int, str] | None = None, matching: Matching | None = None) -> Aggregate:
    """SPEC step 8: w^{t+1} (weighted by D_k) and the algorithm's server state, held for commit.

    Updates with non-finite values or a diverged loss are rejected first; `lost` (client ->
    reason) names the clients that dropped out or failed, for the error when too few remain.
    `matching` is the round's (:func:`match_step`'s; None: nobody matched), for the algorithm's
    section of the round's record.
    """
    algorithm = build_algorithm(config.algorithm)
    state = store.server_state(run_dir, round_index, algorithm.state_class)  # read-only: server_update makes new state
    files, rejected = usable_uploads(config, run_dir, round_index, clients)
    require_enough_clients(round_index, len(files), config.federation.min_clients, {**(lost or {}), **rejected})
    uploads = [Upload(int(f["client"]), int(f["num_samples"]), f["model"], f["report"]) for f in files]
    weights = [float(upload.num_samples) for upload in uploads]
    client_state_rounds = dict(state.client_state_rounds)
    client_state_rounds.update({int(f["client"]): round_index for f in files if f["keeps_state"]})
    store.hold_aggregate(run_dir, round_index, ServerState(
        round=round_index + 1,
        model=weighted_average([upload.model for upload in uploads], weights),
        algorithm=algorithm.server_update(state.algorithm, uploads, config.federation.num_clients),
        client_state_rounds=client_state_rounds,
        history=state.history,
    ))
    train_loss = float(np.average([f["epoch_losses"][-1] for f in files], weights=weights))
    return Aggregate(train_loss=train_loss, clients=len(uploads), rejected=rejected,
                     record=algorithm.server_record(matching or Matching(), uploads))


def evaluate_step(config: ExperimentConfig, run_dir: str | Path, round_index: int) -> Evaluation:
    """Test-set accuracy and loss of the aggregated global model w^{t+1}, and its local accuracy.

    The round's clients have finished, so the evaluation takes every core of its machine, a batch
    per core on one thread each (`evaluate`), which gives the one-thread figures on any CPU. The same
    pass's per-sample correctness scores w^{t+1} on each client's test share (`run_test_shares`,
    `local_accuracy`): weighted by share size that is the test accuracy again (exactly, when every class
    is trained on by some client); the client mean and the 10th-percentile client are the new figures.
    """
    dataset = load_experiment_dataset(config.data, config.seed)
    compute = run_compute(run_dir)
    device = run_record.run_device(config, run_dir)
    configure_device(device, compute.precision)
    model = new_model(config, dataset.num_classes, device, compute)
    model.load_state_dict(store.held_aggregate(run_dir, round_index).model)
    result = evaluate(model, dataset.x_test, dataset.y_test, dataset.num_classes, workers=available_cores(),
                      per_sample=True)
    local = local_accuracy(result.correct, run_test_shares(config, run_dir))
    return Evaluation(test_accuracy=result.accuracy, test_loss=result.loss,
                      per_class_accuracy=[float(value) for value in result.per_class_accuracy],
                      local_accuracy=None if local is None else local.weighted,
                      local_accuracy_client_mean=None if local is None else local.client_mean,
                      local_accuracy_p10=None if local is None else local.p10)


def commit_round(config: ExperimentConfig, run_dir: str | Path, round_index: int,
                 record: RoundRecord) -> dict[str, Any]:
    """Make round t visible (the atomic rename of the next server state); returns the record as stored."""
    stored = record.to_dict()
    store.commit_server_state(run_dir, round_index, stored, config.runner.keep_round_files)
    return stored
