"""The factors of a sensitivity study in a grid file's ``report`` section (``report.references``, ``report.factors``).

A factor is FedCME with one reading (or setup) changed beside its no-exchange twin, and for a setup
factor the FedAvg of that setup; ``report.references`` names today's FedAvg, FedRS, FedCME and twin,
which every factor is compared with (:mod:`flows.report.sensitivity`). Only the report reads these
keys: no grid cell's config depends on them. :func:`factor_method_problems` says where a factor names
a method its grid lacks (the grid file checks its own factors, :func:`fedcme_core.config.params.load_params`
those of other grids whose files exist).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fedcme_core.config.partition_tags import parse_partition_tag

GRID_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]*$"


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class ReportReferences(_Section):
    """`report.references`: the methods of today's readings (keys of `methods`): FedAvg, FedRS, FedCME,
    FedCME's no-exchange twin and, where it was trained, FedProx."""

    fedavg: str
    fedrs: str
    fedcme: str
    twin: str
    fedprox: str | None = None

    def named(self) -> dict[str, str]:
        """{role: method} of the roles it names."""
        return {role: method for role, method in self.model_dump().items() if method is not None}


class ReportFactor(_Section):
    """`report.factors[i]`: FedCME with one reading (or setup) changed, its no-exchange twin, and for a
    setup factor the FedAvg, FedRS and FedProx of that setup (default: the reference FedAvg; a reading
    factor's baselines are the references, trained under the same setup). Its methods are keys of
    `methods`, or of the grid file of `grid` (another grid whose published metrics hold its runs);
    `setting` is the partition tag of its runs (default: its grid's)."""

    name: str = Field(pattern=GRID_NAME_PATTERN)
    label: str = Field(min_length=1)
    fedcme: str
    twin: str
    fedavg: str | None = None
    fedrs: str | None = None
    fedprox: str | None = None
    grid: str | None = Field(None, pattern=GRID_NAME_PATTERN, description="the grid whose metrics hold its runs")
    setting: str | None = Field(None, description="a partition tag: a<alpha> or c<k>")

    @field_validator("setting")
    @classmethod
    def _partition_tag(cls, tag: str | None) -> str | None:
        if tag is not None:
            parse_partition_tag(tag)
        return tag

    def methods(self, references: ReportReferences) -> dict[str, str]:
        """{role: method} of its runs: fedcme, twin and fedavg (the reference FedAvg unless it names one),
        and fedrs and fedprox where it names them."""
        own = {"fedrs": self.fedrs, "fedprox": self.fedprox}
        return {"fedcme": self.fedcme, "twin": self.twin, "fedavg": self.fedavg or references.fedavg,
                **{role: method for role, method in own.items() if method is not None}}

    def is_setup(self, references: ReportReferences, own_grid: str) -> bool:
        """A setup factor: its runs have a FedAvg of their own (another grid, or a FedAvg it names)."""
        return (self.grid not in (None, own_grid)) or self.fedavg not in (None, references.fedavg)

    def baseline(self, role: str, references: ReportReferences, own_grid: str) -> str | None:
        """The method of baseline `role` (fedrs, fedprox) trained under this factor's setup: its own for a
        setup factor (None where it names none: a baseline of another setup is no comparison), else today's."""
        own = getattr(self, role)
        if own is not None or self.is_setup(references, own_grid):
            return own
        return getattr(references, role)


class ReportCombination(_Section):
    """`report.combination`: the readings that helped (names of reading factors), combined and trained at
    the headline setting in the grid `grid`: FedCME(0.01) (`fedcme`), FedCME(0.1) (`strong`) and its
    no-exchange twin (`twin`), beside the committed runs of the grid `against` with today's readings:
    FedAvg, FedRS, FedCME(0.01) (`today`) and FedCME(0.1) (`today_strong`). Methods are keys of `methods`
    in those grids' files."""

    readings: list[str] = Field(min_length=1)
    grid: str = Field(pattern=GRID_NAME_PATTERN)
    fedcme: str
    strong: str
    twin: str
    against: str = Field(pattern=GRID_NAME_PATTERN)
    fedavg: str
    fedrs: str
    today: str
    today_strong: str

    def methods_by_grid(self) -> dict[str, dict[str, str]]:
        """{grid: {role: method}}: the combined runs' grid, then the grid of today's runs."""
        return {self.grid: {"fedcme": self.fedcme, "strong": self.strong, "twin": self.twin},
                self.against: {"fedavg": self.fedavg, "fedrs": self.fedrs, "today": self.today,
                               "today_strong": self.today_strong}}


def check_combination(combination: ReportCombination | None, references: ReportReferences | None,
                      factors: Sequence[ReportFactor], own_grid: str) -> None:
    """Raise ValueError when the combination names a reading that is no reading factor of the report."""
    if combination is None:
        return
    readings = [factor.name for factor in factors
                if references is not None and not factor.is_setup(references, own_grid)]
    unknown = [name for name in combination.readings if name not in readings]
    if unknown:
        raise ValueError(f"combination.readings: {', '.join(unknown)} is not a reading factor of report.factors "
                         f"(readings: {', '.join(readings) or 'none'})")


def check_factors(references: ReportReferences | None, factors: Sequence[ReportFactor]) -> None:
    """Raise ValueError when factors lack references or two share a name (or one is named 'reference')."""
    if factors and references is None:
        raise ValueError("factors: needs report.references (fedavg, fedrs, fedcme, twin) to compare with")
    names = [factor.name for factor in factors]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"factors: names must differ, {', '.join(twice)} given twice")
    if "reference" in names:
        raise ValueError("factors: 'reference' names today's readings; give the factor another name")


def factor_method_problems(references: ReportReferences | None, factors: Sequence[ReportFactor],
                           methods: Mapping[str, Any], grid: str, own_grid: str,
                           partitions: Sequence[str] | None = None) -> list[str]:
    """Where the references (in the own grid) and the factors of `grid` name a method that `methods`
    (that grid's) lacks, each as "report.factors.<i>.<role>: <method> (<factor>) not defined in methods",
    or a setting that is none of `partitions` (that grid's partition tags, when given)."""
    problems = []
    if references is not None and grid == own_grid:
        problems += [f"report.references.{role}: {method} not defined in methods"
                     for role, method in references.named().items() if method not in methods]
    for index, factor in enumerate(factors):
        if (factor.grid or own_grid) != grid or references is None:
            continue
        where = "" if grid == own_grid else f" of the {grid} grid"
        problems += [f"report.factors.{index}.{role}: {method} ({factor.name}) not defined in methods{where}"
                     for role, method in factor.methods(references).items() if method not in methods]
        if partitions is not None and factor.setting is not None and factor.setting not in partitions:
            problems.append(f"report.factors.{index}.setting: {factor.setting} ({factor.name}) is not a partition "
                            f"of the {grid} grid (its partitions: {', '.join(partitions) or 'none'})")
    return problems


def other_grid_file(grid: str, beside: Path) -> Path | None:
    """The grid file of another grid: ``params-<grid>.yaml`` beside the file `beside`, else under
    ``configs/`` beside it (a params.yaml copied to the root); None when neither exists."""
    for folder in (Path(beside).parent, Path(beside).parent / "configs"):
        if (folder / f"params-{grid}.yaml").is_file():
            return folder / f"params-{grid}.yaml"
    return None
