"""The run store: the paths of a run directory, and every read, write, atomic commit and
garbage collection of its states (what defines the run, config, compute and partition, is
:mod:`fedcme_core.rounds.run_record`).

    <run>/config.json                   the config that defines the results (no rounds, no runner)
    <run>/partition.npz                 the clients' sample indices
    <run>/compute.json                  the layout and precision chosen at the start
    <run>/server/round-XXXX.pt          the server state after XXXX rounds (this and the one before)
    <run>/rounds/XXXX/client-*-*.pt     a round's swap, exchanged and upload checkpoints
    <run>/clients/client-K-round-R.pt   what the algorithm keeps for client K since round R

A server state is a :class:`~fedcme_core.rounds.state.ServerState` in the round (read by
:func:`server_state`), stored as {round, model (w^t), algorithm (the algorithm's own state),
client_state_rounds (client -> the round of its kept state), history (the round records)}, the plain
form that :func:`load_server_state` returns to readers outside the round (sync, the report). A round
becomes visible when :func:`commit_server_state` renames the next server state into place; the
pending aggregate between the aggregate and commit steps lives in this process's memory only (a
crash before the rename redoes the round from its uploads).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fedcme_core.common.checkpoints import CheckpointError, load_checkpoint, save_checkpoint
from fedcme_core.common.errors import RunError as RunError  # the run's errors and names: the ground floor's
from fedcme_core.common.errors import StorageError, storage_message
from fedcme_core.common.run_lock import check_experiment_name as check_experiment_name
from fedcme_core.common.run_lock import experiment_run_dir as experiment_run_dir
from fedcme_core.algorithms import AlgorithmState
from fedcme_core.rounds.state import ServerState


class RecoveryWarning(UserWarning):
    """A run directory held a corrupted file; the run resumes from the last intact round."""


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
        """The run's memory layout and precision, resolved once (fedcme_core.client.compute)."""
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

    def client_state(self, client_id: int, round_index: int) -> Path:
        return self.root / "clients" / f"client-{client_id:04d}-round-{round_index:04d}.pt"


# ------------------------------------------------------------------------ server state
def completed_rounds(run_dir: str | Path) -> int:
    """How many rounds the run has committed (0 for a new run)."""
    server_dir = RunPaths(run_dir).root / "server"
    rounds = [int(path.stem.removeprefix("round-")) for path in server_dir.glob("round-*.pt")]
    return max(rounds, default=0)


def last_intact_round(run_dir: str | Path) -> int:
    """The latest committed round whose server state loads. Damaged states above it are moved aside
    (:func:`quarantine`: ``round-XXXX.pt.corrupt-<UTC time>``, never deleted, never over an earlier
    one), each with a :class:`RecoveryWarning`. When no kept state loads, nothing is moved and a
    CheckpointError names every damaged file."""
    paths = RunPaths(run_dir)
    latest = completed_rounds(paths.root)
    damaged: list[tuple[Path, CheckpointError]] = []
    intact = None
    for round_index in range(latest, -1, -1):
        path = paths.server_state(round_index)
        if not path.exists():
            break
        try:
            load_checkpoint(path)
        except CheckpointError as error:
            damaged.append((path, error))
            continue
        intact = round_index
        break
    if not damaged:
        return latest
    if intact is None:
        reasons = "; ".join(str(error) for _, error in damaged)
        raise CheckpointError(f"{reasons}; no earlier intact round to resume from")
    for path, error in damaged:
        moved = quarantine(path)
        warnings.warn(f"{error}; moved to {moved.name}, resuming from round {intact}", RecoveryWarning, stacklevel=2)
    return intact


def quarantine(path: Path) -> Path:
    """Move the damaged file `path` aside as ``<name>.corrupt-<UTC time>`` (``-2``, ``-3``... after a
    name already taken) and return where it went. The new name is made by a hard link, which never
    replaces a file, so no earlier quarantine is ever overwritten; then `path` is removed."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    attempt = 1
    while True:
        target = path.with_name(f"{path.name}.corrupt-{stamp}" + (f"-{attempt}" if attempt > 1 else ""))
        try:
            os.link(path, target)
        except FileExistsError:
            attempt += 1
            continue
        except OSError as error:
            raise StorageError(storage_message(target, error, "cannot move a damaged file aside")) from None
        os.unlink(path)
        return target


def load_server_state(run_dir: str | Path, round_index: int) -> dict[str, Any]:
    """The server state of round t as stored (plain data), for a reader outside the round."""
    return load_checkpoint(RunPaths(run_dir).server_state(round_index))


def shared_server_state(run_dir: str | Path, round_index: int) -> dict[str, Any]:
    """The server state of round t as stored, read once per process for all its clients' tasks
    (read-only: the same dict is handed to every caller until the file changes)."""
    path = RunPaths(run_dir).server_state(round_index)
    file_status = path.stat()
    return _cached_server_state(str(path), file_status.st_mtime_ns, file_status.st_size)


@functools.lru_cache(maxsize=1)
def _cached_server_state(path: str, modified_ns: int, size: int) -> dict[str, Any]:
    return load_checkpoint(Path(path))


def server_state(run_dir: str | Path, round_index: int, state_class: type[AlgorithmState]) -> ServerState:
    """The server state of round t, typed (its algorithm part read as `state_class`), from the
    process's shared copy (:func:`shared_server_state`)."""
    return ServerState.from_dict(shared_server_state(run_dir, round_index), state_class)


def write_initial_server_state(run_dir: str | Path, state: ServerState) -> None:
    save_checkpoint(state.to_dict(), RunPaths(run_dir).server_state(0))


# ----------------------------------------------------------------- the pending aggregate
_PENDING: dict[tuple[str, int], ServerState] = {}


def hold_aggregate(run_dir: str | Path, round_index: int, pending: ServerState) -> None:
    """Keep round t's aggregate (the server state of round t+1 without round t's record) for
    evaluate and commit."""
    _PENDING[(str(Path(run_dir)), round_index)] = pending


def held_aggregate(run_dir: str | Path, round_index: int) -> ServerState:
    try:
        return _PENDING[(str(Path(run_dir)), round_index)]
    except KeyError:
        raise RunError(f"{run_dir}: round {round_index} has no aggregate in this process (run the aggregate step)") from None


def commit_server_state(run_dir: str | Path, round_index: int, record: Mapping[str, Any],
                        keep_round_files: bool) -> None:
    """Make round t visible: write the server state of round t+1, its history ending with `record`
    (the round's record as stored), atomically; then drop what it supersedes."""
    paths = RunPaths(run_dir)
    previous = shared_server_state(run_dir, round_index)  # read once per process and round (its clients read it)
    pending = held_aggregate(run_dir, round_index)
    committed = dataclasses.replace(pending, history=(*pending.history, record))
    save_checkpoint(committed.to_dict(), paths.server_state(round_index + 1))
    _PENDING.pop((str(Path(run_dir)), round_index), None)
    # Keep the states of rounds t and t+1 (the fallback if t+1 is found corrupted) and the
    # client states they refer to; older ones are superseded.
    for stale in paths.server_state(round_index).parent.glob("round-*.pt"):
        if stale.name < paths.server_state(round_index).name:
            stale.unlink(missing_ok=True)
    if not keep_round_files:
        shutil.rmtree(paths.round_dir(round_index), ignore_errors=True)
    referenced = {
        paths.client_state(client, state_round)
        for rounds in (previous["client_state_rounds"], pending.client_state_rounds)
        for client, state_round in rounds.items()
    }
    for stored in paths.client_state(0, 0).parent.glob("client-*-round-*.pt"):
        if stored not in referenced:
            stored.unlink(missing_ok=True)


# --------------------------------------------------------------------- client files
def load_client_state(run_dir: str | Path, client_id: int, state_round: int | None) -> dict[str, Any] | None:
    """What the algorithm kept for the client at round `state_round` (None: nothing kept)."""
    if state_round is None:
        return None
    return load_checkpoint(RunPaths(run_dir).client_state(client_id, state_round))


def save_client_state(run_dir: str | Path, client_id: int, round_index: int, state: dict[str, Any]) -> None:
    save_checkpoint(state, RunPaths(run_dir).client_state(client_id, round_index))


def save_upload(run_dir: str | Path, round_index: int, client_id: int, upload: dict[str, Any]) -> None:
    save_checkpoint(upload, RunPaths(run_dir).upload(round_index, client_id))


def load_upload(run_dir: str | Path, round_index: int, client_id: int) -> dict[str, Any]:
    return load_checkpoint(RunPaths(run_dir).upload(round_index, client_id))
