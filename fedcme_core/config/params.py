"""The schema of a whole params file (``params.yaml``, ``configs/params-*.yaml``).

A params file holds ``base`` (the experiment config every run starts from, see
:mod:`fedcme_core.config`), ``methods`` (named algorithm sections with a display label and a
group), ``datasets`` (the model of each dataset), ``grid`` and ``ablation`` (the experiments
``dvc repro`` trains) and ``report``. Every section forbids unknown keys, and every grid cell's
composed experiment config is validated too, so that a typo anywhere (``gird:`` for ``grid:``,
``methods.fedprox.mu`` as ``mu_``) is one line naming the file and the key, before anything
trains or writes. :func:`load_params` reads and validates a file; :meth:`ParamsFile.cell_config`
is the experiment config of one grid cell (method, dataset, partition tag, K, M, seed), the one the
DVC train stage runs: `base`, then the partition tag (:mod:`fedcme_core.partition_tags`), the grid
dimensions, the method's algorithm, ``datasets.<d>``, and last the method's ``setup``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from .config import (
    AlgorithmConfig,
    ExperimentConfig,
    ModelConfig,
    PartitionConfig,
    config_from_dict,
    format_validation_error,
)
from .config_files import ConfigError, apply_overrides, read_yaml
from .params_factors import (
    GRID_NAME_PATTERN, ReportFactor, ReportReferences, check_factors, factor_method_problems, other_grid_file,
)
from .partition_tags import check_tag_for_method, parse_partition_tag, partition_label, partition_overrides

GRID_DATASETS = ("fmnist", "cifar10")
Dataset = Literal["fmnist", "cifar10"]
DATASET_LABELS = {"fmnist": "FMNIST", "cifar10": "CIFAR-10", "synthetic": "Synthetic"}


# What `methods.<name>.setup` may not set: the grid's dimensions (and anything under them).
GRID_KEYS = ("seed", "data.dataset", "partition", "federation.num_clients", "federation.clients_per_round")


def setting_label(dataset: str, partition: str, clients: int, per_round: int) -> str:
    """"CIFAR-10 α=0.5 K=10 M=10" / "CIFAR-10 #C=2 K=10 M=10": a grid setting as the report names it."""
    return f"{DATASET_LABELS.get(dataset, dataset)} {partition_label(partition)} K={clients} M={per_round}"


def _under(key: str, prefixes: tuple[str, ...]) -> bool:
    return any(key == prefix or key.startswith(f"{prefix}.") for prefix in prefixes)


def _setup_key_problem(key: str, value: Any) -> str | None:
    """Why `key` may not be a `setup` override, or None when it may."""
    if _under(key, GRID_KEYS):
        return "a grid dimension; the grid and ablation sections set it"
    if _under(key, ("algorithm",)):
        return "the method's algorithm; write it in the method itself (methods.<name>.mu), not in setup"
    if isinstance(value, Mapping):
        return "give each key dotted (training.local_epochs: 4), not a whole section"
    return None


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class MethodEntry(_Section):
    """`methods.<name>`: an algorithm section plus its display label, report group and `setup`, the
    dotted experiment-config overrides of its cells (``{training.local_epochs: 4}``), applied last."""

    label: str | None = None
    group: Literal["main", "ablation"] = "main"
    setup: dict[str, Any] = {}
    algorithm: AlgorithmConfig

    @model_validator(mode="before")
    @classmethod
    def _split(cls, values: Any) -> Any:
        # The file writes {name: fedprox, mu: 0.01, label: ...}: label, group and setup are ours,
        # the rest the algorithm's.
        if not isinstance(values, Mapping):
            return values
        rest = dict(values)
        entry = {key: rest.pop(key) for key in ("label", "group", "setup") if key in rest}
        return {**entry, "algorithm": rest}

    @field_validator("setup")
    @classmethod
    def _no_grid_keys(cls, setup: dict[str, Any]) -> dict[str, Any]:
        for key, value in setup.items():
            problem = _setup_key_problem(key, value)
            if problem is not None:
                raise ValueError(f"{key}: {problem}")
        return setup


class GridSection(_Section):
    """The settings of a grid: datasets x partitions (tags: a0.1, c2) x (K, M) pairs x seeds, for each method."""

    datasets: list[Dataset] = Field(min_length=1)
    partitions: list[str] = Field(min_length=1, description="partition tags: a<alpha> or c<k>")
    clients: list[tuple[int, int]] = Field(min_length=1, description="(K, M) pairs")
    seeds: list[int] = Field(min_length=1)
    methods: list[str] = Field(min_length=1)

    @field_validator("partitions", mode="before")
    @classmethod
    def _partition_tags(cls, tags: Any) -> Any:
        if isinstance(tags, list):
            for index, tag in enumerate(tags):
                parse_partition_tag(tag)
                if tag in tags[:index]:
                    raise ValueError(f"{tag!r} given twice")
        return tags

    @model_validator(mode="after")
    def _distinct_client_counts(self) -> GridSection:
        # Partitions are named by K, so two pairs with the same K would share (and fight over) one.
        counts = [clients for clients, _ in self.clients]
        if len(set(counts)) != len(counts):
            raise ValueError(f"clients: K must differ between (K, M) pairs, got {[list(pair) for pair in self.clients]}")
        return self

    def cells(self) -> Iterator[tuple[str, str, str, int, int, int]]:
        """(method, dataset, partition tag, K, M, seed) of every experiment, in dvc.yaml's matrix order."""
        for method, dataset, partition, (clients, per_round), seed in itertools.product(
            self.methods, self.datasets, self.partitions, self.clients, self.seeds
        ):
            yield method, dataset, partition, clients, per_round, seed

    def settings(self) -> set[tuple[str, str, int, int, int]]:
        return {cell[1:] for cell in self.cells()}


class AblationSection(GridSection):
    """`ablation`: a grid of its own on settings of `grid`; its method list may be empty (no ablation runs)."""

    methods: list[str] = Field(default_factory=list)


PUBLISHED_MEASURES = ("final_accuracy", "accuracy_at_2T5", "best_accuracy")  # columns of docs/results/<grid>.csv


class PublishedFigure(_Section):
    """`report.published[i]`: a figure someone published for one method in one setting of this grid,
    which the report sets beside ours (for example NIID-Bench's FedAvg 68.2%)."""

    method: str = Field(description="a key of `methods`")
    dataset: Dataset
    partition: str = Field(description="a partition tag of the grid: a<alpha> or c<k>")
    clients: tuple[int, int] = Field(description="(K, M)")
    measure: Literal[PUBLISHED_MEASURES] = "final_accuracy"  # type: ignore[valid-type]
    accuracy: float = Field(le=100, description="in percent")
    source: str = Field(min_length=1, description="where it was published, and how it was measured")

    @field_validator("partition")
    @classmethod
    def _partition_tag(cls, tag: str) -> str:
        parse_partition_tag(tag)
        return tag

    @field_validator("accuracy")
    @classmethod
    def _in_percent(cls, value: float) -> float:
        if value <= 1:
            raise ValueError(f"{value} looks like a fraction: give the published figure in percent (68.2, not 0.682)")
        return value

    @property
    def setting(self) -> tuple[str, str, int, int]:
        return self.dataset, self.partition, *self.clients

    @property
    def setting_label(self) -> str:
        return setting_label(*self.setting)


class ReportSection(_Section):
    name: str = Field("default", pattern=GRID_NAME_PATTERN, description="the grid's name (docs/results/<name>.csv)")
    target_accuracy: float | None = Field(None, gt=0, le=1)
    published: list[PublishedFigure] = []
    references: ReportReferences | None = None
    factors: list[ReportFactor] = []

    @model_validator(mode="after")
    def _factors_checked(self) -> ReportSection:
        check_factors(self.references, self.factors)
        return self

    def factor_grid(self, factor: ReportFactor) -> str:
        """The grid whose metrics hold a factor's runs: its `grid`, else this one."""
        return factor.grid or self.name

    def method_problems(self, methods: Mapping[str, Any], grid: str, partitions: Any = None) -> list[str]:
        """Where `references` and the factors of `grid` name a method that `methods` (that grid's) lacks,
        or a setting outside its `partitions` (when given)."""
        return factor_method_problems(self.references, self.factors, methods, grid, self.name, partitions)


class ParamsFile(_Section):
    """A whole params file: what `dvc repro` and `fedcme train --config` read."""

    base: ExperimentConfig
    methods: dict[str, MethodEntry] = Field(min_length=1)
    datasets: dict[Dataset, ModelConfig] = {}
    grid: GridSection
    ablation: AblationSection | None = None
    report: ReportSection = ReportSection()
    _cells: dict[tuple, ExperimentConfig] = PrivateAttr(default_factory=dict)  # the validated cell configs

    @model_validator(mode="after")
    def _grid_names_defined(self) -> ParamsFile:
        for section, grid in (("grid", self.grid), ("ablation", self.ablation)):
            if grid is None:
                continue
            for tag in grid.partitions:
                try:
                    check_tag_for_method(tag, self.base.partition.method)
                except ValueError as error:
                    raise ValueError(f"{section}.partitions: {error}") from None
            unknown = [method for method in grid.methods if method not in self.methods]
            if unknown:
                raise ValueError(f"{section}.methods: {', '.join(unknown)} not defined in methods "
                                 f"(known: {', '.join(self.methods)})")
        if self.ablation is not None:
            outside = sorted(self.ablation.settings() - self.grid.settings())
            if outside:
                raise ValueError(f"ablation: settings {outside} are not in grid (their partitions come from grid)")
        trained = {(method, *setting[:4]) for grid in (self.grid, self.ablation) if grid is not None
                   for method, *setting in grid.cells()}
        for index, figure in enumerate(self.report.published):
            if (figure.method, *figure.setting) not in trained:
                raise ValueError(f"report.published.{index}: no grid or ablation run of {figure.method} in "
                                 f"{figure.dataset} {figure.partition} K={figure.clients[0]} M={figure.clients[1]} "
                                 "to set beside it")
        partitions = list(dict.fromkeys(tag for grid in (self.grid, self.ablation) if grid is not None
                                        for tag in grid.partitions))
        problems = self.report.method_problems(self.methods, self.report.name, partitions)
        if problems:
            raise ValueError(problems[0])
        dotted = [name for name in self.methods if "." in name]
        if dotted:
            raise ValueError(f"methods: names must not contain dots (DVC params paths), got {', '.join(dotted)}")
        return self

    @property
    def raw_base(self) -> dict[str, Any]:
        return self.base.model_dump(mode="json")

    def partition_config(self, partition: str) -> PartitionConfig:
        """`base.partition` with a partition tag's overrides: what the partition stage partitions by."""
        try:
            check_tag_for_method(partition, self.base.partition.method)
            fields = {key.removeprefix("partition."): value for key, value in partition_overrides(partition).items()}
            return PartitionConfig.model_validate({**self.base.partition.model_dump(), **fields})
        except ValidationError as error:
            raise ConfigError(format_validation_error(error, f"partition {partition}")) from None
        except ValueError as error:
            raise ConfigError(f"partition: {error}") from None

    def cell_overrides(self, method: str, dataset: str, partition: str, clients: int, per_round: int, seed: int,
                       prepared_dir: str | None = None) -> dict[str, Any]:
        """The dotted overrides that turn `base` into the config of one grid cell: the grid's dimensions,
        the method's algorithm, the dataset's model, then the method's `setup`."""
        if method not in self.methods:
            raise ConfigError(f"methods.{method}: not defined (known: {', '.join(sorted(self.methods))})")
        model = self.datasets.get(dataset)
        overrides: dict[str, Any] = {
            "seed": seed,
            "data.dataset": dataset,
            **partition_overrides(partition),
            "federation.num_clients": clients,
            "federation.clients_per_round": per_round,
            "algorithm": self.methods[method].algorithm.model_dump(mode="json"),
            **({f"model.{key}": value for key, value in model.model_dump(mode="json", exclude_unset=True).items()}
               if model is not None else {}),
            **self.methods[method].setup,
        }
        if prepared_dir is not None:
            overrides["data.prepared_dir"] = prepared_dir
        return overrides

    def cell_config(self, *cell: Any, prepared_dir: str | None = None, source: str = "params") -> ExperimentConfig:
        """The validated config of one grid cell (validated once per file: `params_from_dict` keeps
        every cell's), reading its data from `prepared_dir` when given."""
        config = self._cells.get(cell)
        if config is None:
            config = config_from_dict(apply_overrides(self.raw_base, self.cell_overrides(*cell)), source=source)
            self._cells[cell] = config
        if prepared_dir is None:
            return config
        return config.model_copy(update={"data": config.data.model_copy(update={"prepared_dir": prepared_dir})})

    def all_cells(self) -> Iterator[tuple[str, str, str, int, int, int]]:
        yield from self.grid.cells()
        if self.ablation is not None:
            yield from self.ablation.cells()

    def label(self, method: str) -> str:
        return self.methods[method].label or method

    def group(self, method: str) -> str:
        return self.methods[method].group


def is_params_file(values: Any) -> bool:
    """A params file has a top-level `base` mapping (a plain experiment config does not)."""
    return isinstance(values, Mapping) and isinstance(values.get("base"), Mapping)


def _format_params_location(error: ValidationError, source: str) -> str:
    # methods.<name>.algorithm.mu -> methods.<name>.mu: the file has no `algorithm` level there.
    return re.sub(r"(methods\.[^.:;\s]+)\.algorithm\b", r"\1", format_validation_error(error, source))


def params_from_dict(values: Any, source: str = "params") -> ParamsFile:
    """Validate a whole params file's contents, and every grid cell's composed config."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"{source}: the top level must be a mapping of keys, got {type(values).__name__}")
    try:
        params = ParamsFile.model_validate(dict(values))
    except ValidationError as error:
        raise ConfigError(_format_params_location(error, source)) from None
    for cell in params.all_cells():
        method, dataset, partition, clients, per_round, seed = cell
        params.cell_config(*cell, source=f"{source} [grid cell {method} {dataset} {partition} "
                                         f"K={clients} M={per_round} seed={seed}]")
    return params


def load_params(path: str | Path) -> ParamsFile:
    """Read and validate a whole params file; a problem is one ConfigError line naming file and key."""
    values = read_yaml(path)
    if not is_params_file(values):
        raise ConfigError(f"{path}: base: missing, or not a mapping of config keys (a params file needs "
                          "base, methods, grid)")
    params = params_from_dict(values, source=str(path))
    check_factor_grids(params, Path(path))
    return params


def check_factor_grids(params: ParamsFile, path: Path) -> None:
    """The factors of other grids name methods of those grids' files (where the files exist); else one
    ConfigError naming this file, the factor's key and the other file."""
    for grid in dict.fromkeys(params.report.factor_grid(factor) for factor in params.report.factors):
        other = other_grid_file(grid, path) if grid != params.report.name else None
        if other is None:
            continue
        values = read_yaml(other)
        values = values if isinstance(values, Mapping) else {}
        methods = values.get("methods") if isinstance(values.get("methods"), Mapping) else {}
        sections = [values[key] for key in ("grid", "ablation") if isinstance(values.get(key), Mapping)]
        partitions = list(dict.fromkeys(tag for section in sections for tag in section.get("partitions") or []))
        problems = params.report.method_problems(methods, grid, partitions)
        if problems:
            raise ConfigError(f"{path}: {problems[0]} ({other})")
