"""The ``algorithm:`` section of a config: one pydantic model per algorithm, without torch.

A config is validated before torch is imported (2 s here), so that a command's first step,
starting Prefect's temporary server, comes first and a bad config starts nothing. Each
algorithm module under ``fedcme_core/algorithms/`` takes its ``config_class`` from here, and its
name is the model's ``name`` literal, declared once.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field, model_validator

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
    # The open readings of the text (SPEC.md, "Open readings"); defaults are SPEC.md's choices.
    # align_loss: class_mean, each batch class mean against zeta[c]; sample, each sample against zeta[y_i].
    align_loss: Literal["class_mean", "sample"] = "class_mean"
    # Over the d feature dimensions: the mean (F.mse_loss) or the sum (the squared norm).
    align_reduction: Literal["mean", "sum"] = "mean"
    # The received classifier's momentum at the exchange: reset, or received with it.
    exchange_optimizer: Literal["reset", "swap"] = "reset"
    # zeta^{t+1}[c] weighs client k by D_k (samples) or by its count of class c (class_counts).
    feature_weights: Literal["samples", "class_counts"] = "samples"

    @model_validator(mode="after")
    def _no_meaningless_options(self) -> FedCMEConfig:
        # An option that would change nothing is named rather than ignored (a default value is fine).
        defaults = type(self).model_fields
        inert = []
        if self.mu == 0:
            inert += [(key, "mu = 0 (no alignment)") for key in ("align_loss", "align_reduction", "feature_weights")]
        if self.exchange == "none":
            inert += [("exchange_optimizer", "exchange none")]
        for key, reason in inert:
            if getattr(self, key) != defaults[key].default:
                raise ValueError(f"{key}: {getattr(self, key)!r} has no effect with {reason}; leave it at "
                                 f"{defaults[key].default!r}")
        return self


class ScaffoldConfig(Frozen):
    name: Literal["scaffold"] = "scaffold"


ALGORITHM_CONFIGS: tuple[type[Frozen], ...] = (
    FedAvgConfig, FedProxConfig, MoonConfig, FedRSConfig, FedCMEConfig, ScaffoldConfig,
)
ALGORITHM_NAMES: tuple[str, ...] = tuple(cls.model_fields["name"].default for cls in ALGORITHM_CONFIGS)
AlgorithmConfig = Annotated[Union[ALGORITHM_CONFIGS], Field(discriminator="name")]
