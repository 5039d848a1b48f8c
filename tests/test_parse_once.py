"""Parse once: every entry point reads and validates its experiment's config once, then passes the
validated ExperimentConfig down; nothing in the process writes the config out and reads it back (issues
#40, #53). A run from a params file validates only its own experiment's config: `base` for `fedcme
train`, its one grid cell for a DVC train stage (`fedcme check` validates every cell)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

import flows.orchestration.train
from fedcme_core.config import load_config
from fedcme_core.config.params import ParamsFile, load_params
from fedcme_core.config.schema import ExperimentConfig
from fedcme_core.rounds import run_record
from flows.orchestration.tasks import PrefectExecutor

from .conftest import REPO_ROOT

SMOKE = REPO_ROOT / "configs" / "smoke.yaml"
TINY = ["--set", "federation.rounds=1", "--set", "runner.kind=sequential", "--set", "data.synthetic.num_train=200",
        "--set", "data.synthetic.num_test=50"]


class Parses:
    """Counts the validations of an experiment config and of a whole params file, and the reads of
    config files, and records the config objects that reach the flow's run (`train`) and the round
    loop's steps (every step the executor runs takes the config first)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, config_files: list[Path]) -> None:
        self.validations = self.params_validations = self.file_reads = 0
        self.reached: dict[str, list] = {"train": [], "steps": []}
        watched = {path.resolve() for path in config_files}
        validate, validate_params = ExperimentConfig.model_validate, ParamsFile.model_validate
        read_text = Path.read_text
        call, map_calls = PrefectExecutor.call, PrefectExecutor.map

        def counting_validate(cls, *args, **kwargs):
            self.validations += 1
            return validate(*args, **kwargs)

        def counting_validate_params(cls, *args, **kwargs):
            self.params_validations += 1
            return validate_params(*args, **kwargs)

        def counting_read_text(path, *args, **kwargs):
            if path.resolve() in watched:
                self.file_reads += 1
            return read_text(path, *args, **kwargs)

        def recorded_call(executor, step, function, *args):
            self.reached["steps"].append(args[0])
            return call(executor, step, function, *args)

        def recorded_map(executor, step, function, arguments, *rest, **options):
            self.reached["steps"] += [args[0] for args in arguments]
            return map_calls(executor, step, function, arguments, *rest, **options)

        monkeypatch.setattr(ExperimentConfig, "model_validate", classmethod(counting_validate))
        monkeypatch.setattr(ParamsFile, "model_validate", classmethod(counting_validate_params))
        monkeypatch.setattr(Path, "read_text", counting_read_text)
        monkeypatch.setattr(PrefectExecutor, "call", recorded_call)
        monkeypatch.setattr(PrefectExecutor, "map", recorded_map)
        train = flows.orchestration.train.train
        monkeypatch.setattr(flows.orchestration.train, "train",
                            lambda config, *a, **k: self.reached["train"].append(config) or train(config, *a, **k))

    def reset(self) -> None:
        self.validations = self.params_validations = self.file_reads = 0
        self.reached = {name: [] for name in self.reached}

    def passed_down(self, config: ExperimentConfig) -> bool:
        """The very object validated reached the flow's run once and every step of the round loop."""
        return (len(self.reached["train"]) == 1 and self.reached["train"][0] is config
                and self.reached["steps"] and all(reached is config for reached in self.reached["steps"]))


def smoke_params_file(folder: Path) -> Path:
    """A valid params file whose `base` is configs/smoke.yaml, with a grid of four cells."""
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump({
        "base": yaml.safe_load(SMOKE.read_text()),
        "methods": {"fedavg": {"name": "fedavg"}, "fedcme-mu001": {"name": "fedcme", "mu": 0.01}},
        "grid": {"datasets": ["fmnist"], "partitions": ["a0.5"], "clients": [[8, 4]], "seeds": [0, 1],
                 "methods": ["fedavg", "fedcme-mu001"]},
    }), encoding="utf-8")
    return path


@pytest.fixture
def workdir(tmp_path, monkeypatch, prefect_server) -> Path:
    """A scratch working directory (runs/, metrics/ and the MLflow store land here)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    return tmp_path


def test_a_run_from_a_params_file_validates_its_base_once_and_nothing_else(tmp_path, monkeypatch):
    parses = Parses(monkeypatch, [REPO_ROOT / "params.yaml"])
    config = load_config(REPO_ROOT / "params.yaml", overrides={"federation.rounds": 3})

    # The Makefile's default: the file's sections validated once, the base (with the overrides) within
    # them and no experiment config besides; the grid cells are the pipeline's and `fedcme check`'s
    # (before: 1 + 8 cells + the base again).
    assert (parses.file_reads, parses.validations, parses.params_validations) == (1, 0, 1)
    assert config.federation.rounds == 3 and config.data.dataset == "fmnist"
    parses.reset()  # the whole file, as `fedcme check` validates it: every cell
    cells = list(load_params(REPO_ROOT / "params.yaml").all_cells())
    assert len(cells) > 1 and parses.validations == len(cells) and parses.params_validations == 1


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["config file", "params file"])
def test_fedcme_train_parses_its_config_once_and_a_resumed_run_reads_nothing_back(workdir, monkeypatch, kind):
    from flows.cli import main

    path = SMOKE if kind == "config file" else smoke_params_file(workdir)
    parses = Parses(monkeypatch, [path])
    loaded = []
    load = load_config
    monkeypatch.setattr("fedcme_core.config.load_config", lambda *a, **k: loaded.append(load(*a, **k)) or loaded[-1])
    command = ["train", "--config", str(path), "--experiment", "once", *TINY]

    records_read: list[str] = []  # compute.json and partition.npz read from disk
    for cache in (run_record._COMPUTE, run_record._PARTITION):
        monkeypatch.setattr(cache, "load", lambda path, load=cache.load: records_read.append(path.name) or load(path))
    for attempt in ("new run", "resumed run"):  # the second reopens the config.json this process wrote
        parses.reset()
        assert main(command) == 0, attempt
        (config,) = loaded[-1:]
        expected = (1, 1, 0) if kind == "config file" else (1, 0, 1)  # a params file: its base within it
        assert (parses.file_reads, parses.validations, parses.params_validations) == expected, attempt
        assert records_read == [], attempt  # what the process wrote, it never reads back
        # The very object the command validated reaches the flow and the round loop's tasks.
        assert parses.passed_down(config), attempt
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
    assert isinstance(config, ExperimentConfig) and config == expected and parses.passed_down(config)
    assert parses.file_reads == 0 and summary["rounds"] == 1


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
    params.write_text(yaml.safe_dump({  # two grid cells (seeds 0 and 1)
        "base": base, "methods": {"fedavg": {"name": "fedavg", "label": "FedAvg"}},
        "grid": {"datasets": ["fmnist"], "partitions": ["a1.0"], "clients": [[4, 2]], "seeds": [0, 1],
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

    # The params file read once and its sections validated once, and of the experiment configs only
    # the stage's own cell's (seed 0's, not seed 1's); that config is passed down as it is.
    assert (parses.file_reads, parses.params_validations, parses.validations) == (1, 1, 1)
    (config,) = given
    assert config.seed == 0 and parses.passed_down(config)
    about = json.loads((workdir / "metrics" / "about" / "fmnist-a1.0-k4m2-fedavg-s0.json").read_text())
    # What computed it comes from the run's summary (compute.json is not read back by the stage).
    assert about["compute"] == json.loads((workdir / "runs" / "fmnist-a1.0-k4m2-fedavg-s0" / "compute.json")
                                          .read_text())["name"]


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
