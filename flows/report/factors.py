"""The sensitivity study of a grid: its grid file's ``report.references``, ``report.factors`` and
``report.combination``, the study's roles, which the report reads and no training does.

A factor is FedCME with one reading (or setup) changed beside its no-exchange twin, and for a setup
factor the FedAvg of that setup; ``report.references`` names today's FedAvg, FedRS, FedCME and twin,
which every factor is compared with (:mod:`flows.report.sensitivity`); ``report.combination`` the
readings that helped, combined (:mod:`flows.report.combination`). The roles are the grid file's keys,
which name each role after the method its runs are (``fedcme``, ``twin``, ``fedavg`` ...); the report
reads them as the fields of these models (:data:`ROLE`), never by a string of its own.

:func:`load_study` reads a grid file's study: its keys checked (one ConfigError line naming the file
and the key), and every method it names found in the ``methods`` of its grid, or of another grid's
file where that file exists (``params-<grid>.yaml`` beside it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fedcme_core.config.files import ConfigError, read_yaml
from fedcme_core.config.params import ParamsFile, load_params
from fedcme_core.config.partition_tags import parse_partition_tag
from fedcme_core.config.messages import format_validation_error
from fedcme_core.config.sections import GRID_NAME_PATTERN, other_grid_file

# A field's marks: a factor's role that defaults to the references' method, and the grid of the
# combination that holds a role's runs (its own `grid`, or `against`).
FROM_REFERENCES = {"from_references": True}
COMBINED = {"grid": "grid"}
AGAINST = {"grid": "against"}


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
    fedavg: str | None = Field(None, json_schema_extra=FROM_REFERENCES)
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

    @classmethod
    def roles(cls) -> tuple[str, ...]:
        """Its fields that name a method, in order: those the references also have."""
        return tuple(name for name in cls.model_fields if name in ReportReferences.model_fields)

    @classmethod
    def from_references(cls) -> tuple[str, ...]:
        """Its roles that default to the references' method (FedAvg)."""
        return tuple(role for role in cls.roles()
                     if (cls.model_fields[role].json_schema_extra or {}).get("from_references"))

    def methods(self, references: ReportReferences) -> dict[str, str]:
        """{role: method} of its runs: the roles it names, in order, FedAvg the reference's unless it names one."""
        methods = {role: getattr(self, role) for role in self.roles()}
        methods.update({role: getattr(references, role) for role in self.from_references() if methods[role] is None})
        return {role: method for role, method in methods.items() if method is not None}

    def is_setup(self, references: ReportReferences, own_grid: str) -> bool:
        """A setup factor: its runs have a FedAvg of their own (another grid, or a FedAvg it names)."""
        return (self.grid not in (None, own_grid)) or any(
            getattr(self, role) not in (None, getattr(references, role)) for role in self.from_references())


class ReportCombination(_Section):
    """`report.combination`: the readings that helped (names of reading factors), combined and trained at
    the headline setting in the grid `grid`: FedCME(0.01), FedCME(0.1) and its no-exchange twin, beside the
    committed runs of the grid `against` with today's readings: FedAvg, FedRS, FedCME(0.01) and
    FedCME(0.1). Methods are keys of `methods` in those grids' files; each role's description is the
    label of its runs in the report."""

    readings: list[str] = Field(min_length=1)
    grid: str = Field(pattern=GRID_NAME_PATTERN)
    fedcme: str = Field(description="FedCME(0.01) combined", json_schema_extra=COMBINED)
    strong: str = Field(description="FedCME(0.1) combined", json_schema_extra=COMBINED)
    twin: str = Field(description="FedCME(0.1) combined w/o exchange", json_schema_extra=COMBINED)
    against: str = Field(pattern=GRID_NAME_PATTERN)
    fedavg: str = Field(description="FedAvg", json_schema_extra=AGAINST)
    fedrs: str = Field(description="FedRS", json_schema_extra=AGAINST)
    today: str = Field(description="FedCME(0.01) today", json_schema_extra=AGAINST)
    today_strong: str = Field(description="FedCME(0.1) today", json_schema_extra=AGAINST)

    @classmethod
    def role_labels(cls) -> dict[str, str]:
        """{role: the label of its runs}, in order: the combined runs, then today's."""
        return {name: field.description for name, field in cls.model_fields.items() if field.json_schema_extra}

    def methods_by_grid(self) -> dict[str, dict[str, str]]:
        """{grid: {role: method}}: the combined runs' grid, then the grid of today's runs."""
        by_grid: dict[str, dict[str, str]] = {self.grid: {}, self.against: {}}
        for name, field in type(self).model_fields.items():
            if field.json_schema_extra:
                by_grid[getattr(self, field.json_schema_extra["grid"])][name] = getattr(self, name)
        return by_grid


def role_names(roles: Sequence[str]) -> SimpleNamespace:
    """The roles `roles` (a study model's fields) by attribute, each its own name: the report names a
    role as ``ROLE.twin``, checked against the grid file's keys when its module loads."""
    return SimpleNamespace(**{role: role for role in roles})


ROLE = role_names([*ReportFactor.roles(), *ReportCombination.role_labels()])  # every role of the study


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


class Study(_Section):
    """A grid file's `report` section as the study reads it: the grid's name and `checks` (the core's
    keys, validated with the grid file) and the study's own keys."""

    name: str = "default"
    checks: list[str] = []
    references: ReportReferences | None = None
    factors: list[ReportFactor] = []
    combination: ReportCombination | None = None

    @model_validator(mode="after")
    def _factors_checked(self) -> Study:
        check_factors(self.references, self.factors)
        check_combination(self.combination, self.references, self.factors, self.name)
        return self

    def factor_grid(self, factor: ReportFactor) -> str:
        """The grid whose metrics hold a factor's runs: its `grid`, else this one."""
        return factor.grid or self.name

    def method_problems(self, methods: Mapping[str, Any], grid: str, partitions: Any = None) -> list[str]:
        """Where `references`, the factors and the combination of `grid` name a method that `methods`
        (that grid's) lacks, or a factor a setting outside its `partitions` (when given)."""
        problems = factor_method_problems(self.references, self.factors, methods, grid, self.name, partitions)
        if self.combination is not None:
            problems += [f"report.combination.{role}: {method} not defined in methods of the {grid} grid"
                         for role, method in self.combination.methods_by_grid().get(grid, {}).items()
                         if method not in methods]
        return problems

    def other_grids(self) -> list[str]:
        """The grids other than this one that the report reads: those of the factors, the combination and the checks."""
        grids = [self.factor_grid(factor) for factor in self.factors]
        grids += list(self.combination.methods_by_grid()) if self.combination is not None else []
        grids += self.checks
        return [grid for grid in dict.fromkeys(grids) if grid != self.name]


class _StudyFile(BaseModel):
    """What a study is validated in, so that an error names its key as the grid file does (report.factors.0.twin)."""

    report: Study


def study_of(params: ParamsFile, source: str = "params") -> Study:
    """The study of the validated grid file `params` (`source` names it in the errors), with the methods it
    names in this grid checked; a problem is one ConfigError line naming the key."""
    report = params.report
    try:
        study = _StudyFile.model_validate({"report": {"name": report.name, "checks": report.checks,
                                                      **report.study()}}).report
    except ValidationError as error:
        raise ConfigError(format_validation_error(error, source)) from None
    partitions = list(dict.fromkeys(tag for grid in (params.grid, params.ablation) if grid is not None
                                    for tag in grid.partitions))
    problems = study.method_problems(params.methods, study.name, partitions)
    if problems:
        raise ConfigError(f"{source}: {problems[0]}")
    return study


def load_study(path: str | Path, params: ParamsFile | None = None) -> Study:
    """The study of the grid file `path` (`params`: the file as loaded, else read here), checked against
    the other grids' files where they exist; else one ConfigError naming this file, the key and the other file."""
    study = study_of(params if params is not None else load_params(path), str(path))
    for grid in study.other_grids():
        other = other_grid_file(grid, Path(path))
        if other is None:
            continue
        values = read_yaml(other)
        values = values if isinstance(values, Mapping) else {}
        methods = values.get("methods") if isinstance(values.get("methods"), Mapping) else {}
        sections = [values[key] for key in ("grid", "ablation") if isinstance(values.get(key), Mapping)]
        partitions = list(dict.fromkeys(tag for section in sections for tag in section.get("partitions") or []))
        problems = study.method_problems(methods, grid, partitions)
        if problems:
            raise ConfigError(f"{path}: {problems[0]} ({other})")
    return study
