"""The base of every algorithm's config class: the model of its ``algorithm:`` section, and what the
rest of the project reads of an algorithm without naming it.

Each algorithm's config class says how the algorithm is shown (``display_name``, and
``label_parameter``, the hyper-parameter its label shows: FedCME(0.01) is FedCME with mu 0.01), which
of its options are readings the paper leaves open (``readings``, columns of the report's summary),
the projection head its model needs (``projection_dim``), which claims of its paper a grid can check
(``paper``) and what it requires of the experiment (:meth:`BaseAlgorithmConfig.check_experiment`).
The report, the tracking names and the experiment config derive their tables from these, over the
registry (``fedcme_core.algorithms.ALGORITHM_CONFIGS``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from fedcme_core.common.frozen import Frozen


@dataclass(frozen=True)
class PaperClaims:
    """The claims of an algorithm's paper that a grid's runs can check (``flows.report.claims``).

    `reference` is the paper's headline setting of the algorithm (a subset of its config's fields),
    `ablations` each ablation's role -> the reference with those fields changed, and `claims` each
    claim as (text, the role expected ahead, the role expected behind), where "reference" is the
    reference's role and "others" the best other method of the setting.
    """

    reference: Mapping[str, Any]
    ablations: Mapping[str, Mapping[str, Any]]
    claims: tuple[tuple[str, str, str], ...]


class BaseAlgorithmConfig(Frozen):
    """The base of every algorithm's config class; a subclass declares ``name: Literal["..."]``."""

    display_name: ClassVar[str]  # how tables and labels write it: "FedCME"
    label_parameter: ClassVar[str | None] = None  # the field its label shows (None: the bare name)
    readings: ClassVar[tuple[str, ...]] = ()  # its options that are readings the paper leaves open (SPEC.md)
    projection_dim: ClassVar[int | None] = None  # its model's projection head when model.projection_dim is unset
    paper: ClassVar[PaperClaims | None] = None  # the claims of its paper that a grid can check

    def label(self) -> str:
        """`FedCME(0.01)`, `FedRS(0.5)`, `FedAvg`: the display name and the label parameter's value."""
        if self.label_parameter is None:
            return self.display_name
        return f"{self.display_name}({getattr(self, self.label_parameter):g})"

    def check_experiment(self, experiment: Any) -> None:
        """Raise ValueError ("<dotted key>: <reason>") when the experiment config `experiment` cannot run
        this algorithm; every experiment can by default."""

    def is_paper_reference(self) -> bool:
        """Whether this section is its paper's reference setting (``paper.reference``)."""
        return self.paper is not None and all(getattr(self, key) == value
                                              for key, value in self.paper.reference.items())
