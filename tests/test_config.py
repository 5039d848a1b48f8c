"""Config: defaults, the algorithm union, and one clear line per bad value."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcme_core.algorithms import ALGORITHM_CONFIGS, ALGORITHM_NAMES, ALGORITHMS
from fedcme_core.algorithms.fedcme import FedCMEConfig
from fedcme_core.algorithms.fedprox import FedProxConfig
from fedcme_core.algorithms.moon import MoonConfig
from fedcme_core.config.schema import ExperimentConfig, config_from_dict
from fedcme_core.config import load_config
from fedcme_core.config.files import ConfigError, apply_overrides

from .conftest import REPO_ROOT


def test_a_config_and_a_params_file_are_validated_without_importing_torch():
    """Commands validate first and start Prefect's server next, before torch (2 s) is imported."""
    script = ("import sys\n"
              "from fedcme_core.config import load_config\n"
              "load_config('configs/smoke.yaml')\n"
              "load_config('configs/params-niid-bench.yaml')\n"
              "print(sorted(name for name in sys.modules if name.split('.')[0] == 'torch'))\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_the_prepare_and_partition_stages_and_the_report_start_without_torch():
    """Only the train stage trains: the others write numpy arrays and JSON (2 s of torch's import each)."""
    script = ("import sys\n"
              "import flows.pipeline.stages, flows.report.build\n"
              "print(sorted(name for name in sys.modules if name.split('.')[0] == 'torch'))\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_every_algorithm_is_registered_under_its_config_name():
    assert tuple(ALGORITHMS) == ALGORITHM_NAMES and len(set(ALGORITHM_NAMES)) == len(ALGORITHM_CONFIGS)
    assert all(ALGORITHMS[name].config_class is config for name, config in zip(ALGORITHM_NAMES, ALGORITHM_CONFIGS))
    assert all(cls.config_class.__module__ == cls.__module__ for cls in ALGORITHMS.values())  # one module each


def write(tmp_path, text: str):
    path = tmp_path / "params.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_follow_the_spec():
    config = ExperimentConfig()

    assert config.training.local_epochs == 10 and config.training.batch_size == 64
    assert config.training.lr == 0.01 and config.training.momentum == 0.9 and config.training.weight_decay == 1e-5
    assert isinstance(config.algorithm, FedCMEConfig)
    assert config.algorithm.exchange == "classifier" and config.algorithm.eval_fraction == 0.2
    assert config.partition.method == "dirichlet" and config.partition.min_size == 10


def test_algorithm_is_selected_by_name_and_owns_its_parameters(tmp_path):
    path = write(tmp_path, "algorithm:\n  name: fedprox\n  mu: 0.001\n")

    config = load_config(path)

    assert isinstance(config.algorithm, FedProxConfig) and config.algorithm.mu == 0.001


def test_moon_gets_a_projection_head_by_default():
    moon = config_from_dict({"algorithm": {"name": "moon"}})
    fedavg = config_from_dict({"algorithm": {"name": "fedavg"}})

    assert isinstance(moon.algorithm, MoonConfig) and moon.projection_dim == 256
    assert fedavg.projection_dim is None


def test_config_is_frozen():
    config = ExperimentConfig()

    with pytest.raises(Exception):
        config.seed = 3


def test_yaml_scientific_notation_without_dot_is_accepted(tmp_path):
    # PyYAML reads `1e-5` as a string; the config still takes it as a float.
    config = load_config(write(tmp_path, "training:\n  weight_decay: 1e-5\n"))

    assert config.training.weight_decay == pytest.approx(1e-5)


def test_overrides_are_dotted_keys(tmp_path):
    config = load_config(write(tmp_path, "seed: 1\n"), overrides={"training.local_epochs": 4, "algorithm.name": "fedavg"})

    assert config.training.local_epochs == 4 and config.algorithm.name == "fedavg" and config.seed == 1


def test_flat_names_every_leaf():
    flat = ExperimentConfig().flat()

    assert flat["training.lr"] == 0.01 and flat["algorithm.name"] == "fedcme" and "federation.rounds" in flat


BAD_CONFIGS = [
    ("federation:\n  num_clients: 10\n  clients_per_round: 20\n", "federation: clients_per_round (M=20) must be <= num_clients (K=10)"),
    ("partition:\n  alpha: 0\n", "partition.alpha"),
    ("partition:\n  alpha: -0.5\n", "partition.alpha"),
    ("training:\n  local_epochs: 0\n", "training.local_epochs"),
    ("training:\n  local_epochs: 1\nalgorithm:\n  name: fedcme\n", "training.local_epochs: FedCME with exchange 'classifier' needs at least 2"),
    ("data:\n  dataset: mnist\n", "data.dataset"),
    ("data:\n  normalise: imagenet\n", "data.normalise: Input should be 'channel' or 'none'"),
    ("model:\n  name: resnet18\n", "model.name"),
    ("algorithm:\n  name: fedopt\n", "algorithm.name: unknown algorithm 'fedopt'"),
    ("algorithm:\n  name: fedprox\n  tau: 0.5\n", "algorithm.tau: not an option of fedprox (it is read by moon only)"),
    ("trainig:\n  lr: 0.1\n", "trainig: unknown key"),
    ("training:\n  lr: fast\n", "training.lr"),
    ("federation:\n  rounds: 2.5\n", "federation.rounds"),
    ("algorithm:\n  name: fedrs\n  alpha: 1.5\n", "algorithm.alpha"),
    ("algorithm:\n  name: fedcme\n  exchange: half\n", "algorithm.exchange"),
    ("model:\n  name: cifar_cnn\n", "model.name: cifar_cnn expects inputs (3, 32, 32), but data.dataset fmnist gives (1, 28, 28)"),
    ("training:\n  lr: .nan\n", "training.lr"),
    ("algorithm:\n  mu: 0.1\n", "algorithm.name: missing"),
]


@pytest.mark.parametrize("text, expected", BAD_CONFIGS)
def test_bad_config_names_the_key(tmp_path, text, expected):
    path = write(tmp_path, text)

    with pytest.raises(ConfigError) as raised:
        load_config(path)

    message = str(raised.value)
    assert expected in message
    assert message.startswith(str(path))
    assert "\n" not in message


def test_not_yaml_is_one_line_naming_the_file(tmp_path):
    path = write(tmp_path, "training: [unclosed\n")

    with pytest.raises(ConfigError, match=r"params\.yaml: not valid YAML at line \d+"):
        load_config(path)


def test_top_level_must_be_a_mapping(tmp_path):
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(write(tmp_path, "- 1\n- 2\n"))


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="missing.yaml: config file not found"):
        load_config(tmp_path / "missing.yaml")


# ------------------------------------------------------------------ property-based
VALID = config_from_dict(
    {"data": {"dataset": "synthetic"}, "federation": {"num_clients": 8, "clients_per_round": 4, "rounds": 2},
     "training": {"local_epochs": 2}}
)
LEAVES = sorted(VALID.flat())
JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(LEAVES + ["training.unknown", "extra", "algorithm.name"]), value=JUNK)
def test_any_single_bad_value_is_accepted_or_named_in_one_line(key, value):
    values = apply_overrides(VALID.model_dump(mode="json"), {key: value})
    try:
        config = config_from_dict(values, source="params.yaml")
    except ConfigError as error:
        message = str(error)
        assert message.startswith("params.yaml: ") and "\n" not in message
        leaf = key.rsplit(".", 1)[-1]
        assert leaf in message or "algorithm.name" in message or key.split(".")[0] in message
    else:
        assert not (isinstance(value, float) and not math.isfinite(value)), "nan/inf must never be accepted"
        assert config_from_dict(config.model_dump(mode="json")) == config


@settings(max_examples=100, deadline=None)
@given(
    lr=st.floats(1e-6, 10, allow_nan=False), clients=st.integers(1, 500), share=st.floats(0.01, 1.0),
    alpha=st.floats(1e-3, 100), seed=st.integers(0, 2**31),
)
def test_valid_configs_survive_a_round_trip(lr, clients, share, alpha, seed):
    per_round = max(1, int(clients * share))
    values = apply_overrides(VALID.model_dump(mode="json"), {
        "training.lr": lr, "federation.num_clients": clients, "federation.clients_per_round": per_round,
        "partition.alpha": alpha, "seed": seed, "partition.min_size": 1, "data.synthetic.num_train": max(10, clients),
    })
    config = config_from_dict(values)
    assert config_from_dict(config.model_dump(mode="json")) == config
    assert config.federation.clients_per_round == per_round and config.training.lr == lr
