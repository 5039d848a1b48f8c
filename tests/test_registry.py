"""The one registry of algorithms: adding one is a module (its config class and its Algorithm
subclass, FedAvg's unless it implements every hook) and a registry line; the config union, the names
and the round code follow from it.

The toy algorithms below are such modules, written here; the registry line is
``registry([*ALGORITHMS.values(), Toy])``, and the experiment config takes its algorithm union
from ``config_union`` of that registry, as ``fedcme_core.config.schema`` does of ``ALGORITHMS``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest
import torch.nn.functional as F
from pydantic import Field, ValidationError, create_model

import fedcme_core.algorithms as algorithms
from fedcme_core.algorithms import (
    ALGORITHMS,
    DEFAULT_ALGORITHM,
    Algorithm,
    BaseAlgorithmConfig,
    ClientContext,
    Matching,
    Phase,
    RecordSection,
    Upload,
    config_union,
    registry,
    round_phases,
)
from fedcme_core.algorithms.fedavg import FedAvg
from fedcme_core.client.hooks import ClientHooks
from fedcme_core.common.frozen import Frozen
from fedcme_core.results.records import RoundRecord
from fedcme_core.config.files import apply_overrides
from fedcme_core.config.schema import ExperimentConfig, config_from_dict
from fedcme_core.config import ConfigError
from fedcme_core.rounds import final_model, run_experiment, run_partition

from .conftest import SYNTHETIC
from .helpers import same_state


# ------------------------------------------------------------- a toy algorithm: a scaled loss
class ScaledLossConfig(BaseAlgorithmConfig):
    name: Literal["scaled_loss"] = "scaled_loss"
    display_name = "Scaled"
    label_parameter = "scale"
    scale: float = Field(1.0, gt=0)


@dataclass(frozen=True)
class ScaledRecord(RecordSection):
    """The scale and each client's batches (client -> count)."""

    scale: float = 1.0
    batches: dict[int, int] = field(default_factory=dict)


class ScaledLossHooks(ClientHooks):
    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.batches = 0

    def extra_loss(self, inputs, labels, features, logits):
        self.batches += 1
        return (self.scale - 1.0) * F.cross_entropy(logits, labels)  # L = scale * CE


class ScaledLoss(FedAvg):
    """FedAvg with its cross-entropy scaled; its record section counts the batches it scaled."""

    config_class = ScaledLossConfig
    record_class = ScaledRecord

    def client_hooks(self, model, context: ClientContext) -> ClientHooks:
        return ScaledLossHooks(self.config.scale)

    def client_update(self, model, inputs, labels, context, hooks) -> dict[str, Any]:
        return {"batches": hooks.batches}

    def server_record(self, matching: Matching, uploads: Sequence[Upload]) -> ScaledRecord:
        return ScaledRecord(self.config.scale, {upload.client: upload.report["batches"] for upload in uploads})


# ------------------------------------------------------- a toy algorithm: FedAvg in three phases
class ThreePhasesConfig(BaseAlgorithmConfig):
    name: Literal["three_phases"] = "three_phases"
    display_name = "ThreePhases"


class ThreePhases(FedAvg):
    """FedAvg's local epochs in three phases (1, 1, E - 2), an exchange (of nothing: no matching) at
    each boundary; the exchanges are counted."""

    config_class = ThreePhasesConfig
    exchanges: list[int] = []  # the rounds' exchange calls (SerialExecutor: in this process)

    def phases(self, local_epochs: int) -> list[Phase]:
        return [Phase(0, 1), Phase(1, 2), Phase(2, local_epochs)]

    def exchange(self, sources, donors, destinations) -> list[int]:
        ThreePhases.exchanges.append(len(sources))
        return super().exchange(sources, donors, destinations)


TOYS = registry([*ALGORITHMS.values(), ScaledLoss, ThreePhases])  # the registry line(s)
ToyExperimentConfig = create_model("ToyExperimentConfig", __base__=ExperimentConfig,
                                   algorithm=(config_union(TOYS), DEFAULT_ALGORITHM))
PINNED = {"training.channels_last": False, "training.precision": "fp32", "federation.rounds": 2}


@pytest.fixture
def toys(monkeypatch):
    """The toys registered: `build_algorithm` (the round code's) reads the registry."""
    monkeypatch.setattr(algorithms, "ALGORITHMS", TOYS)
    return lambda algorithm, overrides=None: ToyExperimentConfig.model_validate(
        apply_overrides(dict(SYNTHETIC, algorithm=algorithm), {**PINNED, **(overrides or {})}))


def test_a_registered_algorithm_is_a_config_section_by_its_name():
    config = ToyExperimentConfig.model_validate(dict(SYNTHETIC, algorithm={"name": "scaled_loss", "scale": 2.0}))

    assert isinstance(config.algorithm, ScaledLossConfig) and config.algorithm.scale == 2.0
    assert tuple(TOYS)[-2:] == ("scaled_loss", "three_phases") and TOYS["fedcme"] is ALGORITHMS["fedcme"]
    with pytest.raises(ValidationError, match="scale"):
        ToyExperimentConfig.model_validate(dict(SYNTHETIC, algorithm={"name": "scaled_loss", "scale": 0}))
    with pytest.raises(ConfigError, match="unknown algorithm 'scaled_loss'"):  # unregistered, unknown
        config_from_dict(dict(SYNTHETIC, algorithm={"name": "scaled_loss"}))


def test_the_registry_refuses_a_class_without_a_config_or_a_taken_name():
    class Nameless(Algorithm):
        pass

    class Twin(FedAvg):
        config_class = ThreePhasesConfig

    class Hookless(Algorithm):  # the interface alone: FedAvg is the implementation to start from
        config_class = ScaledLossConfig

    class PlainConfig(Frozen):
        name: Literal["plain"] = "plain"

    class Untyped(FedAvg):
        config_class = PlainConfig

    with pytest.raises(TypeError, match="Nameless names no config_class"):
        registry([FedAvg, Nameless])
    with pytest.raises(TypeError, match=r"Hookless leaves hooks unimplemented: client_hooks, client_state, "
                                        r"client_update, exchange, match, phases, server_init, server_record, "
                                        r"server_update \(subclass FedAvg"):
        registry([Hookless])
    with pytest.raises(TypeError, match="Untyped: its config_class PlainConfig is no BaseAlgorithmConfig"):
        registry([Untyped])
    with pytest.raises(ValueError, match="'three_phases' is taken by ThreePhases"):
        registry([ThreePhases, Twin])


def test_a_registered_algorithm_trains_in_the_round_loop(tmp_path, toys):
    config = toys({"name": "scaled_loss", "scale": 2.0})

    history = run_experiment(config, tmp_path / "run")

    assert [record["round"] for record in history] == [0, 1]
    assert all(record["algorithm"]["scale"] == 2.0 for record in history)
    # Each client scaled every batch of its 2 epochs: ceil(D_k / 32) batches each.
    partition, _ = run_partition(config, tmp_path / "run")
    assert all(record["algorithm"]["batches"] == {client: 2 * math.ceil(len(partition.clients[client]) / 32)
                                                  for client in record["selected"]} for record in history)
    assert all(0.0 <= record["test_accuracy"] <= 1.0 and record["train_loss"] > 0 for record in history)
    # The section is the algorithm's typed object, plain data only where the store keeps it.
    batches = history[0]["algorithm"]["batches"]
    assert RoundRecord.from_dict(history[0], ScaledRecord).algorithm == ScaledRecord(2.0, batches)
    assert config.algorithm.label() == "Scaled(2)"


def test_three_phases_of_fedavg_are_fedavg_exactly(tmp_path, toys):
    """The round loop runs any number of phases, exchanging at each boundary; a local run resumes
    exactly, so FedAvg split into three phases gives FedAvg's model bit for bit."""
    fedavg, three = toys({"name": "fedavg"}, {"training.local_epochs": 3}), toys({"name": "three_phases"},
                                                                                {"training.local_epochs": 3})
    ThreePhases.exchanges.clear()

    fedavg_history = run_experiment(fedavg, tmp_path / "fedavg")
    three_history = run_experiment(three, tmp_path / "three")

    assert same_state(final_model(fedavg, tmp_path / "fedavg"), final_model(three, tmp_path / "three"))
    assert [r["test_loss"] for r in fedavg_history] == [r["test_loss"] for r in three_history]
    assert ThreePhases.exchanges == [0, 0, 0, 0]  # 2 boundaries x 2 rounds, nobody matched
    assert all(len(r["phase_seconds"]) == 3 and "exchange_seconds" in r for r in three_history)
    assert all(len(r["phase_seconds"]) == 1 and "exchange_seconds" not in r for r in fedavg_history)
    assert [r["samples_trained"] for r in three_history] == [r["samples_trained"] for r in fedavg_history]


@pytest.mark.parametrize("phases", [[], [(0, 2)], [(0, 1), (2, 3)], [(0, 2), (2, 2), (2, 3)], [(1, 3)]])
def test_phases_that_do_not_cover_the_epochs_in_order_are_refused(phases):
    class Odd(FedAvg):
        def phases(self, local_epochs):
            return phases

    with pytest.raises(ValueError, match=r"fedavg: local phases .* do not run one after another from epoch 0 to 3"):
        round_phases(Odd(None), 3)
