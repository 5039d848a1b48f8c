"""The ``algorithm:`` section of a config: one pydantic model per algorithm, without torch.

A config is validated before torch is imported (2 s here), so that a command's first step,
starting Prefect's temporary server, comes first and a bad config starts nothing. Each
algorithm module under ``fedcme_core/algorithms/`` takes its ``config_class`` from here, and its
name is the model's ``name`` literal, declared once.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field

from .frozen import Frozen


class FedAvgConfig(Frozen):
    name: Literal["fedavg"] = "fedavg"


class FedProxConfig(Frozen):
    name: Literal["fedprox"] = "fedprox"
    mu: float = Field(0.01, ge=0)


class MoonConfig(Frozen):
    name: Literal["moon"] = "moon"
    mu: float = Field(1.0, ge=0)
    tau: float = Field(0.5, gt=0)


class FedRSConfig(Frozen):
    name: Literal["fedrs"] = "fedrs"
    alpha: float = Field(0.5, gt=0, le=1)
    # presence: s_c = 1 if the client holds c else alpha (the paper);
    # proportional: s_c = alpha + (1 - alpha) * n_c / max_j n_j (the authors' code).
    scaling: Literal["presence", "proportional"] = "presence"


class FedCMEConfig(Frozen):
    name: Literal["fedcme"] = "fedcme"
    mu: float = Field(0.01, ge=0, description="feature-alignment weight; 0 disables alignment")
    exchange: Literal["none", "classifier", "extractor", "model"] = "classifier"
    matching: Literal["pairwise", "many_to_one"] = "pairwise"
    eval_fraction: float = Field(0.2, gt=0, le=1)
    align_reduction: Literal["mean", "sum"] = "mean"


class ScaffoldConfig(Frozen):
    name: Literal["scaffold"] = "scaffold"


ALGORITHM_CONFIGS: tuple[type[Frozen], ...] = (
    FedAvgConfig, FedProxConfig, MoonConfig, FedRSConfig, FedCMEConfig, ScaffoldConfig,
)
ALGORITHM_NAMES: tuple[str, ...] = tuple(cls.model_fields["name"].default for cls in ALGORITHM_CONFIGS)
AlgorithmConfig = Annotated[Union[ALGORITHM_CONFIGS], Field(discriminator="name")]
