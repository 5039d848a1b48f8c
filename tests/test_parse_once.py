"""Parse once: every entry point reads and validates its config file once, then passes the validated
ExperimentConfig down; nothing in the process writes the config out and reads it back (issue #40)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

import flows.orchestration.train
from fedcme_core import rounds
from fedcme_core.config import load_config
from fedcme_core.config.schema import ExperimentConfig

from .conftest import REPO_ROOT

SMOKE = REPO_ROOT / "configs" / "smoke.yaml"
TINY = ["--set", "federation.rounds=1", "--set", "runner.kind=sequential", "--set", "data.synthetic.num_train=200",
        "--set", "data.synthetic.num_test=50"]


class Parses:
    """Counts the parses of an experiment config and the reads of config files, and records the
    config objects that reach the flow (`train`) and the round loop's first task (`prepare_run`)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, config_files: list[Path]) -> None:
        self.validations = 0
        self.file_reads = 0
        self.reached: dict[str, list] = {"train": [], "prepare_run": []}
        watched = {path.resolve() for path in config_files}
        validate = ExperimentConfig.model_validate
        read_text = Path.read_text

        def counting_validate(cls, *args, **kwargs):
            self.validations += 1
            return validate(*args, **kwargs)

        def counting_read_text(path, *args, **kwargs):
            if path.resolve() in watched:
                self.file_reads += 1
            return read_text(path, *args, **kwargs)

        monkeypatch.setattr(ExperimentConfig, "model_validate", classmethod(counting_validate))
        monkeypatch.setattr(Path, "read_text", counting_read_text)
        for module, name in ((flows.orchestration.train, "train"), (rounds, "prepare_run")):
            monkeypatch.setattr(module, name, self._recording(name, getattr(module, name)))

    def _recording(self, name, function):
        def recorded(config, *args, **kwargs):
            self.reached[name].append(config)
            return function(config, *args, **kwargs)
        return recorded

    def reset(self) -> None:
        self.validations = self.file_reads = 0
        self.reached = {name: [] for name in self.reached}


@pytest.fixture
def workdir(tmp_path, monkeypatch, prefect_server) -> Path:
    """A scratch working directory (runs/, metrics/ and the MLflow store land here)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    return tmp_path


@pytest.mark.slow
def test_fedcme_train_parses_its_config_once_and_a_resumed_run_reads_nothing_back(workdir, monkeypatch):
    from flows.cli import main

    parses = Parses(monkeypatch, [SMOKE])
    loaded = []
    load = load_config
    monkeypatch.setattr("fedcme_core.config.load_config", lambda *a, **k: loaded.append(load(*a, **k)) or loaded[-1])
    command = ["train", "--config", str(SMOKE), "--experiment", "once", *TINY]

    for attempt in ("new run", "resumed run"):  # the second reopens the config.json this process wrote
        parses.reset()
        assert main(command) == 0, attempt
        (config,) = loaded[-1:]
        assert (parses.file_reads, parses.validations) == (1, 1), attempt
        # The very object the command validated reaches the flow and the round loop's tasks.
        assert parses.reached["train"] == [config] and parses.reached["train"][0] is config, attempt
        assert all(reached is config for reached in parses.reached["prepare_run"]), attempt
    assert len(loaded) == 2 and (workdir / "runs" / "once" / "config.json").is_file()


@pytest.mark.slow
def test_a_deployment_holds_the_config_validated_once_and_each_run_validates_its_values_once(workdir, monkeypatch):
    from flows.orchestration.deploy import training_deployment
    from flows.orchestration.train import train_flow

    parses = Parses(monkeypatch, [SMOKE])
    overrides = {"federation.rounds": 1, "runner.kind": "sequential", "data.synthetic.num_train": 200,
                 "data.synthetic.num_test": 50}
    expected = load_config(SMOKE, overrides=overrides)
    parses.reset()
    deployment = training_deployment(str(SMOKE), "on-demand", overrides=overrides)
    assert (parses.file_reads, parses.validations) == (1, 1)  # the deployment's one parse, when it is built

    # A run of the deployment, as Prefect starts it: from the stored parameters (plain values), which
    # the flow's parameter check validates once into an ExperimentConfig; the file is not read again.
    parses.reset()
    parameters = json.loads(json.dumps(deployment.parameters))  # as the API stores them
    summary = train_flow(**parameters)
    (config,) = parses.reached["train"]
    assert isinstance(config, ExperimentConfig) and config == expected
    assert parses.file_reads == 0 and summary["rounds"] == 1
    assert all(reached is config for reached in parses.reached["prepare_run"])


@pytest.mark.slow
def test_the_dvc_train_stage_parses_its_params_file_once(workdir, monkeypatch):
    from fedcme_core.data.prepared import save_prepared
    from flows.pipeline import stages

    generator = np.random.default_rng(0)
    save_prepared("fmnist", {  # a tiny stand-in for Fashion-MNIST: the stage reads prepared arrays
        "x_train": generator.integers(0, 256, (160, 1, 28, 28), dtype=np.uint8),
        "y_train": np.arange(160, dtype=np.uint8) % 10,
        "x_test": generator.integers(0, 256, (40, 1, 28, 28), dtype=np.uint8),
        "y_test": np.arange(40, dtype=np.uint8) % 10,
    }, stages.prepared_dir("fmnist"))
    base = {"seed": 0, "device": "cpu", "data": {"dataset": "fmnist"},
            "partition": {"method": "dirichlet", "alpha": 1.0, "min_size": 5},
            "federation": {"num_clients": 4, "clients_per_round": 2, "rounds": 1},
            "training": {"local_epochs": 1, "batch_size": 32}, "model": {"name": "fmnist_cnn"},
            "algorithm": {"name": "fedavg"}, "runner": {"kind": "sequential"}}
    params = workdir / "params.yaml"
    params.write_text(yaml.safe_dump({  # one grid cell
        "base": base, "methods": {"fedavg": {"name": "fedavg", "label": "FedAvg"}},
        "grid": {"datasets": ["fmnist"], "partitions": ["a1.0"], "clients": [[4, 2]], "seeds": [0],
                 "methods": ["fedavg"]},
        "report": {"name": "once"},
    }), encoding="utf-8")
    cell = ["--dataset", "fmnist", "--partition", "a1.0", "--clients", "4", "--seed", "0"]
    assert stages.main(["--params", str(params), "partition", *cell]) == 0

    parses = Parses(monkeypatch, [params])
    given = []
    run_training = flows.orchestration.train.run_training
    monkeypatch.setattr(flows.orchestration.train, "run_training",
                        lambda config, *a, **k: given.append(config) or run_training(config, *a, **k))
    assert stages.main(["--params", str(params), "train", "--method", "fedavg", "--per-round", "2", *cell]) == 0

    # The whole params file read and validated once (its one grid cell's config: one ExperimentConfig
    # validation); that config is passed down as it is.
    assert (parses.file_reads, parses.validations) == (1, 1)
    (config,) = given
    assert parses.reached["train"] == [config] and parses.reached["train"][0] is config
    assert all(reached is config for reached in parses.reached["prepare_run"])
    assert (workdir / "metrics" / "fmnist-a1.0-k4m2-fedavg-s0.json").is_file()


def test_a_config_recorded_by_this_process_is_compared_as_text_never_parsed_back(tmp_path, synthetic_config,
                                                                                 monkeypatch):
    from fedcme_core.rounds.run_record import run_directory_matches, write_config
    from fedcme_core.rounds.store import RunError

    recorded, other = synthetic_config(), synthetic_config({"training.lr": 0.05})
    write_config(recorded, tmp_path)
    parses = Parses(monkeypatch, [])

    assert run_directory_matches(recorded, tmp_path) and not run_directory_matches(other, tmp_path)
    with pytest.raises(RunError, match="holds a run of a different config"):
        write_config(other, tmp_path)
    write_config(recorded, tmp_path)  # reopened: the same text
    assert parses.validations == 0
