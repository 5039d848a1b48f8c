"""Faults injected for real into the core: failing and dropped clients, poisoned updates,
corrupted and half-written files. Each run either continues correctly or stops with a
message naming the fault, and the files from before the fault stay intact."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from fedcme_core import rounds
from fedcme_core.common.checkpoints import CheckpointError, load_checkpoint, save_checkpoint
from fedcme_core.server.exchange import exchange_checkpoints
from fedcme_core.server.faults import RoundError, dropped_clients, state_problem, surviving_donors, update_problem
from fedcme_core.rounds import RecoveryWarning, RunPaths, completed_rounds, load_server_state, run_experiment

from .helpers import same_state
from .test_federation import without_timings

RECORD_FAULT_KEYS = {"aggregated_clients", "dropped_clients", "failed_clients", "rejected_clients", "failures"}


# ------------------------------------------------------------------------------- files
def test_a_flipped_byte_is_detected_and_named(tmp_path):
    path = tmp_path / "state.pt"
    save_checkpoint({"weights": torch.arange(10_000, dtype=torch.float32)}, path)
    content = bytearray(path.read_bytes())
    content[len(content) // 2] ^= 0xFF
    path.write_bytes(bytes(content))

    with pytest.raises(CheckpointError, match=r"state\.pt: content hash mismatch"):
        load_checkpoint(path)


def test_a_truncated_checkpoint_is_detected_and_named(tmp_path):
    path = tmp_path / "state.pt"
    save_checkpoint({"weights": torch.zeros(1000)}, path)
    path.write_bytes(path.read_bytes()[:-100])

    with pytest.raises(CheckpointError, match=r"state\.pt: content hash mismatch \(truncated or corrupted"):
        load_checkpoint(path)


def test_a_file_the_run_did_not_write_is_never_unpickled(tmp_path):
    path = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(3)}, path)

    with pytest.raises(CheckpointError, match=r"foreign\.pt: not a fedcme checkpoint"):
        load_checkpoint(path)


WRITER = """
import sys, torch
from fedcme_core.common.checkpoints import save_checkpoint
path = sys.argv[1]
version = 0
while True:
    version += 1
    save_checkpoint({"version": version, "weights": torch.full((400_000,), float(version))}, path)
    print(version, flush=True)
"""


@pytest.mark.slow
def test_sigkill_during_checkpoint_writes_leaves_an_intact_file(tmp_path):
    path = tmp_path / "state.pt"
    save_checkpoint({"version": 0, "weights": torch.zeros(400_000)}, path)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    for _ in range(5):  # let it complete a few writes, then kill it mid-way through another
        writer.stdout.readline()
    time.sleep(0.013)
    writer.send_signal(signal.SIGKILL)
    writer.wait()

    payload = load_checkpoint(path)
    assert payload["version"] >= 4
    assert torch.equal(payload["weights"], torch.full((400_000,), float(payload["version"])))


# --------------------------------------------------------------------------- pure checks
def test_dropouts_are_seeded_per_client_not_by_order():
    first = dropped_clients([1, 2, 3, 4, 5, 6, 7, 8], 0.5, seed=0, round_index=3)
    again = dropped_clients([8, 7, 6, 5, 4, 3, 2, 1], 0.5, seed=0, round_index=3)
    assert sorted(first) == sorted(again)
    assert dropped_clients(list(range(100)), 0.0, seed=0, round_index=3) == []
    share = len(dropped_clients(list(range(2000)), 0.3, seed=1, round_index=0)) / 2000
    assert 0.25 < share < 0.35


def test_update_problems_are_named():
    good = {"epoch_losses": [1.0, 0.5], "model": {"w": torch.ones(3)}, "report": {"local_features": torch.zeros(2, 4)}}
    assert update_problem(good) is None
    assert update_problem({**good, "model": {"w": torch.tensor([1.0, math.nan])}}) == "non-finite values in w"
    assert "non-finite training loss" in update_problem({**good, "epoch_losses": [math.inf]})
    assert "above federation.max_update_loss" in update_problem({**good, "epoch_losses": [50.0]}, max_loss=10.0)
    assert update_problem({**good, "report": {"local_features": torch.full((2, 4), math.inf)}}) == "non-finite local features"
    # A report entry of parameter name -> tensor (SCAFFOLD's control-variate delta) is checked tensor by tensor.
    delta = {"a": torch.zeros(2), "b": torch.tensor([0.0, math.nan])}
    assert update_problem({**good, "report": {"control_delta": delta}}) == "non-finite control delta"
    assert state_problem({"steps": torch.tensor(3), "w": torch.ones(2)}) is None


def test_a_pair_with_a_lost_client_does_not_exchange():
    donors = {1: 2, 2: 1, 3: 4, 4: 3}
    assert surviving_donors(donors, [1, 2, 3]) == {1: 2, 2: 1}


def test_a_non_finite_donor_gives_nothing(tmp_path):
    from .helpers import fresh_run
    from fedcme_core.client.training import save_local_run

    sources = {client: tmp_path / f"swap-{client}.pt" for client in (0, 1)}
    for client, path in sources.items():
        run = fresh_run()
        if client == 1:
            with torch.no_grad():
                run.model.classifier.weight.fill_(math.nan)
        save_local_run(run, path)
    destinations = {client: tmp_path / f"exchanged-{client}.pt" for client in (0, 1)}

    received = exchange_checkpoints(sources, {0: 1, 1: 0}, "classifier", destinations)

    assert received == [1]
    assert not destinations[0].exists()
    assert state_problem(load_checkpoint(destinations[1])["model"]) is None


# ------------------------------------------------------------------------------ rounds
class FlakyTraining:
    """Wraps the real local-training step: `client` raises on its first `failures` calls."""

    def __init__(self, client: int, failures: int, phase: int = 0) -> None:
        self.real = rounds.train_phase_step
        self.client, self.failures, self.phase = client, failures, phase
        self.calls = 0

    def __call__(self, config, run_dir, round_index, client_id, phase_index, start_checkpoint=None):
        if client_id == self.client and phase_index == self.phase and round_index == 0:
            self.calls += 1
            if self.calls <= self.failures:
                raise OSError(f"injected failure {self.calls} of client {client_id}")
        return self.real(config, run_dir, round_index, client_id, phase_index, start_checkpoint)


def first_client_of_round_zero(config) -> int:
    return rounds.select_step(config, 0).clients[0]


def test_a_client_that_fails_once_is_retried_and_changes_nothing(tmp_path, synthetic_config, monkeypatch):
    config = synthetic_config({"runner.retries": 1})
    straight = run_experiment(config, tmp_path / "straight")
    flaky = FlakyTraining(first_client_of_round_zero(config), failures=1)
    monkeypatch.setattr(rounds.loop, "train_phase_step", flaky)

    retried = run_experiment(config, tmp_path / "retried")

    assert flaky.calls == 2
    assert without_timings(retried) == without_timings(straight)
    assert retried[0]["failed_clients"] == 0


def test_a_client_that_keeps_failing_leaves_the_round_and_its_partner_trains_alone(tmp_path, synthetic_config, monkeypatch):
    config = synthetic_config({"runner.retries": 1, "runner.keep_round_files": True, "federation.rounds": 1})
    failing = first_client_of_round_zero(config)
    monkeypatch.setattr(rounds.loop, "train_phase_step", FlakyTraining(failing, failures=10))

    history = run_experiment(config, tmp_path / "run")

    record = history[0]
    assert record["failed_clients"] == 1 and record["aggregated_clients"] == 3
    assert record["failures"] == {failing: f"local training (phase 1) failed: OSError: injected failure 2 of client {failing}"}
    partner = next(b if a == failing else a for a, b in record["algorithm"]["pairs"] if failing in (a, b))
    paths = RunPaths(tmp_path / "run")
    assert not paths.exchanged_checkpoint(0, partner).exists()
    assert not paths.upload(0, failing).exists()
    others = [client for client in record["selected"] if client not in (failing, partner)]
    assert all(paths.exchanged_checkpoint(0, client).exists() for client in others)
    assert state_problem(load_server_state(tmp_path / "run", 1)["model"]) is None


def test_too_few_clients_stops_the_round_and_keeps_the_committed_state(tmp_path, synthetic_config, monkeypatch):
    config = synthetic_config({"runner.retries": 0, "federation.min_clients": 4, "federation.rounds": 1})
    failing = first_client_of_round_zero(config)
    monkeypatch.setattr(rounds.loop, "train_phase_step", FlakyTraining(failing, failures=10))

    with pytest.raises(RoundError, match=rf"round 0: only 3 clients .*min_clients is 4; client {failing}: local training"):
        run_experiment(config, tmp_path / "run")

    assert completed_rounds(tmp_path / "run") == 0
    assert load_server_state(tmp_path / "run", 0)["history"] == []


class PoisonedUpload:
    """Runs the real step, then overwrites `client`'s upload with NaN weights (a poisoned update)."""

    def __init__(self, client: int) -> None:
        self.real = rounds.train_phase_step
        self.client = client

    def __call__(self, config, run_dir, round_index, client_id, phase_index, start_checkpoint=None):
        summary = self.real(config, run_dir, round_index, client_id, phase_index, start_checkpoint)
        path = RunPaths(run_dir).upload(round_index, client_id)
        if client_id == self.client and path.exists():
            upload = load_checkpoint(path)
            name = next(iter(upload["model"]))
            upload["model"][name] = torch.full_like(upload["model"][name], math.nan)
            save_checkpoint(upload, path)
        return summary


def test_a_poisoned_update_is_rejected_before_aggregation(tmp_path, synthetic_config, monkeypatch):
    config = synthetic_config({"federation.rounds": 1})
    poisoned = first_client_of_round_zero(config)
    monkeypatch.setattr(rounds.loop, "train_phase_step", PoisonedUpload(poisoned))

    history = run_experiment(config, tmp_path / "run")

    record = history[0]
    assert record["rejected_clients"] == 1 and record["aggregated_clients"] == 3
    assert record["failures"][poisoned].startswith("non-finite values in ")
    state = load_server_state(tmp_path / "run", 1)
    assert state_problem(state["model"]) is None
    assert poisoned not in state["algorithm"]["evaluation_vectors"]
    assert math.isfinite(record["test_loss"])


def test_a_diverging_run_stops_with_the_reason(tmp_path, synthetic_config):
    config = synthetic_config({"training.lr": 1.0e6, "federation.rounds": 1})

    with pytest.raises(RoundError, match=r"round 0: only 0 clients returned a usable update.*non-finite"):
        run_experiment(config, tmp_path / "run")
    assert completed_rounds(tmp_path / "run") == 0


def test_simulated_dropouts_are_reproducible_and_logged(tmp_path, synthetic_config):
    config = synthetic_config({"federation.dropout": 0.4, "federation.rounds": 3})

    first = run_experiment(config, tmp_path / "a")
    second = run_experiment(config, tmp_path / "b")

    assert without_timings(first) == without_timings(second)
    expected = [len(dropped_clients(r["selected"], 0.4, seed=config.seed, round_index=r["round"])) for r in first]
    assert [record["dropped_clients"] for record in first] == expected
    assert sum(expected) > 0
    assert all(r["aggregated_clients"] == len(r["selected"]) - r["dropped_clients"] for r in first)


def test_a_corrupted_latest_state_resumes_from_the_last_intact_round(tmp_path, synthetic_config, finished_run):
    straight, straight_dir = finished_run({"federation.rounds": 3})
    run_dir = tmp_path / "damaged"
    run_experiment(synthetic_config({"federation.rounds": 2}), run_dir)
    latest = RunPaths(run_dir).server_state(2)
    latest.write_bytes(latest.read_bytes()[:1000])

    with pytest.warns(RecoveryWarning, match=r"round-0002\.pt: content hash mismatch.*resuming from round 1"):
        resumed = run_experiment(synthetic_config({"federation.rounds": 3}), run_dir)

    assert without_timings(resumed) == without_timings(straight)
    assert [path.name.split("-")[1] for path in latest.parent.glob("round-0002.pt.corrupt-*")] == ["0002.pt.corrupt"]
    assert same_state(
        rounds.final_model(synthetic_config(), run_dir), rounds.final_model(synthetic_config(), straight_dir)
    )


def test_a_corrupted_only_state_is_named(tmp_path, synthetic_config):
    run_dir = tmp_path / "run"
    run_experiment(synthetic_config({"federation.rounds": 1}), run_dir)
    RunPaths(run_dir).server_state(0).unlink()
    RunPaths(run_dir).server_state(1).write_bytes(b"garbage")

    with pytest.raises(CheckpointError, match=r"round-0001\.pt: not a fedcme checkpoint.*no earlier intact round"):
        run_experiment(synthetic_config({"federation.rounds": 2}), run_dir)
    assert os.path.getsize(RunPaths(run_dir).server_state(1)) == len(b"garbage")
