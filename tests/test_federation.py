"""Whole rounds in-process: FedCME end to end, degeneracies, exchange barrier, resume."""

from __future__ import annotations

import json

import pytest
import torch

from fedcme_core.common.checkpoints import load_checkpoint
from fedcme_core.rounds import (
    RunError,
    RunPaths,
    SerialExecutor,
    completed_rounds,
    exchange_step,
    final_model,
    load_experiment_dataset,
    load_server_state,
    run_experiment,
)

from .helpers import same_state

def without_timings(history):
    return [{key: value for key, value in record.items() if not key.endswith("_seconds")} for record in history]


def test_fedcme_two_rounds_end_to_end(finished_run):
    history, run_dir = finished_run()  # synthetic_config()'s run

    assert [record["round"] for record in history] == [0, 1]
    assert all(len(record["selected"]) == 4 and len(record["algorithm"]["pairs"]) == 2 for record in history)
    assert all(0.0 <= record["test_accuracy"] <= 1.0 and record["test_loss"] > 0 for record in history)
    state = load_server_state(run_dir, 2)
    assert state["algorithm"]["global_features"]["defined"].any()
    assert set(state["algorithm"]["evaluation_vectors"]) >= set(history[-1]["selected"])
    assert not (run_dir / "rounds").exists() or not any((run_dir / "rounds").iterdir())


def test_same_seed_same_result_and_other_seed_differs(tmp_path, synthetic_config, finished_run):
    _, first = finished_run()  # the session's run of synthetic_config(), seed 3
    run_experiment(synthetic_config(), tmp_path / "b")
    run_experiment(synthetic_config({"seed": 4}), tmp_path / "c")

    a, b, c = (final_model(synthetic_config({"seed": s}), d) for s, d in ((3, first), (3, tmp_path / "b"), (4, tmp_path / "c")))
    assert same_state(a, b)
    assert not same_state(a, c)


DEGENERATE = [
    ({"name": "fedprox", "mu": 0.0}, {}),
    ({"name": "fedrs", "alpha": 1.0}, {}),
    ({"name": "moon", "mu": 0.0}, {"model.projection_dim": 256}),
    ({"name": "fedcme", "exchange": "none", "mu": 0.0}, {}),
]


@pytest.mark.parametrize("algorithm, backbone", DEGENERATE, ids=lambda v: v.get("name", "") if isinstance(v, dict) else "")
def test_degenerate_settings_equal_fedavg_exactly(tmp_path, synthetic_config, finished_run, algorithm, backbone):
    fedavg = synthetic_config(backbone, algorithm={"name": "fedavg"})
    degenerate = synthetic_config(backbone, algorithm=algorithm)

    fedavg_history, fedavg_dir = finished_run(backbone, algorithm={"name": "fedavg"})  # one FedAvg run for all
    degenerate_history = run_experiment(degenerate, tmp_path / "degenerate")

    assert same_state(final_model(fedavg, fedavg_dir), final_model(degenerate, tmp_path / "degenerate"))
    assert [r["test_loss"] for r in fedavg_history] == [r["test_loss"] for r in degenerate_history]


def test_exchange_without_alignment_changes_the_result(tmp_path, synthetic_config, finished_run):
    fedavg = synthetic_config(algorithm={"name": "fedavg"})
    exchanging = synthetic_config(algorithm={"name": "fedcme", "mu": 0.0, "exchange": "classifier"})

    _, fedavg_dir = finished_run(algorithm={"name": "fedavg"})
    run_experiment(exchanging, tmp_path / "exchange")

    assert not same_state(final_model(fedavg, fedavg_dir), final_model(exchanging, tmp_path / "exchange"))


class InspectingExecutor(SerialExecutor):
    """Checks, right after each exchange barrier, that receivers hold their donor's classifier."""

    def __init__(self):
        self.checked_pairs = 0

    def call(self, step, function, *args):
        result = function(*args)
        if function is exchange_step:
            config, run_dir, round_index, donors = args
            paths = RunPaths(run_dir)
            for receiver, donor in donors.items():
                phase_two = load_checkpoint(result.starts[receiver])["model"]
                donor_swap = load_checkpoint(paths.swap_checkpoint(round_index, donor))["model"]
                own_swap = load_checkpoint(paths.swap_checkpoint(round_index, receiver))["model"]
                assert torch.equal(phase_two["classifier.weight"], donor_swap["classifier.weight"])
                assert torch.equal(phase_two["backbone.0.weight"], own_swap["backbone.0.weight"])
                self.checked_pairs += 1
        return result


def test_phase_two_starts_from_the_counterparts_classifier(tmp_path, synthetic_config):
    executor = InspectingExecutor()

    run_experiment(synthetic_config(), tmp_path / "run", executor)

    assert executor.checked_pairs == 8  # 2 rounds x 2 pairs x both directions


class CrashingExecutor(SerialExecutor):
    """Dies like a killed process at the first `step` call of round `round_index`."""

    def __init__(self, step, round_index):
        self.step, self.round_index = step, round_index

    def _maybe_crash(self, step, args):
        if step == self.step and args[2] == self.round_index:
            raise KeyboardInterrupt("simulated kill")

    def call(self, step, function, *args):
        self._maybe_crash(step, args)
        return function(*args)

    def map(self, step, function, arguments, retries=0, costs=None):
        results = []
        for args in arguments:
            if len(results) == 1:
                self._maybe_crash(step, args)
            results.append(function(*args))
        return results


# The quick tier (-m "not slow") resumes after a crash at FedCME's exchange barrier; the full suite at every step.
@pytest.mark.parametrize("step", ["exchange", pytest.param("train_phase", marks=pytest.mark.slow),
                                  pytest.param("commit", marks=pytest.mark.slow)])
def test_resume_after_a_crash_mid_round_equals_an_uninterrupted_run(tmp_path, synthetic_config, finished_run, step):
    config = synthetic_config({"algorithm.name": "fedcme", "federation.rounds": 3})
    straight, straight_dir = finished_run({"algorithm.name": "fedcme", "federation.rounds": 3})

    with pytest.raises(KeyboardInterrupt):
        run_experiment(config, tmp_path / "crashed", CrashingExecutor(step, round_index=1))
    assert completed_rounds(tmp_path / "crashed") == 1
    resumed = run_experiment(config, tmp_path / "crashed")

    assert without_timings(resumed) == without_timings(straight)
    assert same_state(final_model(config, straight_dir), final_model(config, tmp_path / "crashed"))


@pytest.mark.slow  # 3 runs of 3 rounds with 5 clients a round
@pytest.mark.parametrize("algorithm", [{"name": "moon", "mu": 1.0}, {"name": "scaffold"}], ids=["moon", "scaffold"])
def test_client_state_resumes_with_the_right_rounds(tmp_path, synthetic_config, algorithm):
    # MOON's previous local models and SCAFFOLD's control variates c_i are kept per client across rounds.
    config = synthetic_config({"federation.rounds": 3, "federation.clients_per_round": 5}, algorithm=algorithm)
    straight = run_experiment(config, tmp_path / "straight")

    with pytest.raises(KeyboardInterrupt):
        run_experiment(config, tmp_path / "crashed", CrashingExecutor("commit", round_index=2))
    resumed = run_experiment(config, tmp_path / "crashed")

    assert without_timings(resumed) == without_timings(straight)
    run_dir = tmp_path / "crashed"
    kept = {path.name for path in (run_dir / "clients").iterdir()}
    states = [load_server_state(run_dir, round_index) for round_index in (2, 3)]  # the latest and its fallback
    referenced = {
        RunPaths(run_dir).client_state(client, state_round).name
        for state in states
        for client, state_round in state["client_state_rounds"].items()
    }
    assert kept == referenced
    assert sorted(path.name for path in (run_dir / "server").iterdir()) == ["round-0002.pt", "round-0003.pt"]


def test_extending_a_run_continues_from_its_last_round(tmp_path, synthetic_config, finished_run):
    straight, _ = finished_run({"federation.rounds": 3})

    run_experiment(synthetic_config({"federation.rounds": 1}), tmp_path / "extended")
    extended = run_experiment(synthetic_config({"federation.rounds": 3}), tmp_path / "extended")

    assert without_timings(extended) == without_timings(straight)


def test_a_run_directory_refuses_another_config(tmp_path, synthetic_config):
    run_experiment(synthetic_config({"federation.rounds": 1}), tmp_path / "run")

    with pytest.raises(RunError, match="holds a run of a different config"):
        run_experiment(synthetic_config({"federation.rounds": 1, "training.lr": 0.05}), tmp_path / "run")


def test_a_run_recorded_before_an_option_existed_is_extended_and_recorded_anew(tmp_path, synthetic_config):
    run_experiment(synthetic_config({"federation.rounds": 1}), tmp_path / "run")
    path = RunPaths(tmp_path / "run").config
    values = json.loads(path.read_text(encoding="utf-8"))
    del values["data"]["normalise"]  # a config.json written before data.normalise was added
    path.write_text(json.dumps(values), encoding="utf-8")

    with pytest.raises(RunError, match="holds a run of a different config"):
        run_experiment(synthetic_config({"federation.rounds": 2, "data.normalise": "none"}), tmp_path / "run")
    history = run_experiment(synthetic_config({"federation.rounds": 2}), tmp_path / "run")

    assert [record["round"] for record in history] == [0, 1]
    assert json.loads(path.read_text(encoding="utf-8"))["data"]["normalise"] == "channel"


def test_unnormalised_inputs_train_another_model(tmp_path, synthetic_config):
    channel = synthetic_config({"federation.rounds": 1})
    plain = synthetic_config({"federation.rounds": 1, "data.normalise": "none"})
    run_experiment(channel, tmp_path / "channel")
    run_experiment(plain, tmp_path / "plain")

    dataset = load_experiment_dataset(plain.data, plain.seed)
    assert dataset.mean == (0.0,) and dataset.std == (1.0,)
    assert not same_state(final_model(channel, tmp_path / "channel"), final_model(plain, tmp_path / "plain"))


CHANNELS_LAST_TOLERANCE = 1e-4  # absolute, per parameter, after 3 rounds (measured here: at most 6e-6)


@pytest.mark.slow  # 2 runs of 3 rounds each
@pytest.mark.parametrize("algorithm", [{"name": "fedavg"}, {"name": "fedcme", "mu": 0.1}])
def test_channels_last_equals_the_default_format_within_its_tolerance(tmp_path, synthetic_config, algorithm):
    runs = {}
    for channels_last in (False, True):
        config = synthetic_config({"training.channels_last": channels_last, "training.precision": "fp32",
                                   "federation.rounds": 3}, algorithm=algorithm)
        history = run_experiment(config, tmp_path / str(channels_last))
        runs[channels_last] = (history, final_model(config, tmp_path / str(channels_last)).state_dict())

    (plain_history, plain), (fast_history, fast) = runs[False], runs[True]
    assert [r["test_accuracy"] for r in fast_history] == [r["test_accuracy"] for r in plain_history]
    differences = [(plain[key].float() - fast[key].float()).abs().max().item() for key in plain]
    assert max(differences) <= CHANNELS_LAST_TOLERANCE
