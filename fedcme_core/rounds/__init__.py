"""The round of every algorithm, as steps over files in a run directory (SPEC.md, "FedCME round t").

Rooms: ``store`` (the run directory's paths and states: every read, write, commit and garbage
collection), ``state`` (the typed server state and the steps' results), ``run_record`` (what defines a run: config, layout and precision, partition),
``setup`` (dataset, partition, layout and precision, round 0, recovery), ``steps`` (the
round's steps, thin), ``executors`` (where steps run) and ``loop`` (the one round loop).
The names below are the package's public face.
"""

from __future__ import annotations

from fedcme_core.client.evaluation import torch_threads
from fedcme_core.data.datasets import experiment_subset
from fedcme_core.data.partition_file import make_partition
from fedcme_core.rounds.executors import Executor, SerialExecutor, balanced_groups, largest_first, with_retries
from fedcme_core.rounds.loop import run_experiment, run_round
from fedcme_core.rounds.run_record import run_compute_choice, run_directory_matches
from fedcme_core.rounds.setup import (
    available_cores,
    final_model,
    load_experiment_dataset,
    new_model,
    PreparedRun,
    prepare_run,
    resolve_run_compute,
    run_compute,
    run_partition,
    split_line,
)
from fedcme_core.rounds.state import Aggregate, Evaluation, Exchange, PhaseResult, Selection, ServerState
from fedcme_core.rounds.steps import (
    aggregate_step,
    commit_round,
    evaluate_step,
    exchange_step,
    match_step,
    select_step,
    train_phase_step,
)
from fedcme_core.rounds.store import (
    RecoveryWarning,
    RunError,
    RunPaths,
    check_experiment_name,
    completed_rounds,
    experiment_run_dir,
    last_intact_round,
    load_server_state,
    server_state,
    shared_server_state,
)

__all__ = [
    "Aggregate", "Evaluation", "Exchange", "Executor", "PhaseResult", "PreparedRun", "Selection", "RecoveryWarning", "ServerState", "RunError", "RunPaths", "SerialExecutor", "aggregate_step", "available_cores",
    "balanced_groups", "check_experiment_name", "commit_round", "completed_rounds", "evaluate_step",
    "exchange_step", "experiment_run_dir", "experiment_subset", "final_model", "largest_first",
    "last_intact_round", "load_experiment_dataset", "load_server_state", "make_partition", "match_step",
    "new_model", "prepare_run", "resolve_run_compute", "run_compute", "run_compute_choice",
    "run_directory_matches", "run_experiment", "run_partition", "run_round", "select_step", "server_state",
    "shared_server_state", "split_line",
    "torch_threads", "train_phase_step", "with_retries",
]
