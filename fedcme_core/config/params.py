"""The schema of a whole params file (``params.yaml``, ``configs/params-*.yaml``).

A params file holds ``base`` (the experiment config every run starts from, see
:mod:`fedcme_core.config.schema`), ``methods`` (named algorithm sections with a display label and a
group), ``datasets`` (the model of each dataset, and the path of a researcher's own data), ``grid``
and ``ablation`` (the experiments ``dvc repro`` trains) and ``report``. Every section forbids
unknown keys, and every grid cell's composed experiment config is validated too, so that a typo
anywhere (``gird:`` for ``grid:``, ``methods.fedprox.mu`` as ``mu_``) is one line naming the file
and the key, before anything trains or writes. :func:`load_params` reads and validates a file (a
DVC stage: its sections, and then only the cell it trains); :func:`load_config` only the one experiment config a run takes from
it (``base``); :meth:`ParamsFile.cell_config`
is the experiment config of one grid cell (method, dataset, partition tag, K, M, seed), the one the
DVC train stage runs: `base`, then the partition tag (:mod:`fedcme_core.config.partition_tags`), the grid
dimensions, the method's algorithm, ``datasets.<d>``, and last the method's ``setup``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, PrivateAttr, ValidationError, model_validator

from fedcme_core.config.messages import format_validation_error
from fedcme_core.config.schema import ExperimentConfig, PartitionConfig, config_from_dict
from fedcme_core.config.files import ConfigError, apply_overrides, read_yaml
from fedcme_core.config.sections import (
    AblationSection, Dataset, DatasetEntry, GridSection, MethodEntry, ReportSection, Section, TuneSection,
)
from fedcme_core.config.partition_tags import check_tag_for_method, partition_overrides


class ParamsFile(Section):
    """A whole params file: what `dvc repro` and `fedcme train --config` read."""

    base: ExperimentConfig
    methods: dict[str, MethodEntry] = Field(min_length=1)
    datasets: dict[Dataset, DatasetEntry] = {}
    grid: GridSection
    ablation: AblationSection | None = None
    report: ReportSection = ReportSection()
    tune: TuneSection | None = None  # opt-in: no tune section, no tuning (the default grid)
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
        if self.base.data.validation_fraction or self.base.data.evaluate_on != "test":
            raise ValueError("base.data.validation_fraction: the grid's train stages train on the whole training "
                             "set; hold out a validation set for tuning in tune.validation_fraction")
        if self.tune is not None:
            unknown = [method for method in self.tune.methods if method not in self.grid.methods]
            if unknown:
                raise ValueError(f"tune.methods: {', '.join(unknown)} not in grid.methods (the grid's methods are "
                                 "tuned; ablations train with their own values)")
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
            **(model.overrides() if model is not None else {}),  # model.*, and data.path for a researcher's data
            **self.methods[method].setup,
        }
        if prepared_dir is not None:
            overrides["data.prepared_dir"] = prepared_dir
        return overrides

    def cell_config(self, *cell: Any, prepared_dir: str | None = None, source: str = "params") -> ExperimentConfig:
        """The validated config of one grid cell (validated once per file and kept: by `params_from_dict`
        with `cells`, else here on first use), reading its data from `prepared_dir` when given."""
        config = self._cells.get(cell)
        if config is None:
            config = config_from_dict(apply_overrides(self.raw_base, self.cell_overrides(*cell)), source=source)
            self._cells[cell] = config
        if prepared_dir is None:
            return config
        return config.model_copy(update={"data": config.data.model_copy(update={"prepared_dir": prepared_dir})})

    def tune_cell(self, method: str) -> tuple[str, str, str, int, int, int]:
        """The cell a method's candidates train on: the grid's first setting, with the tune section's seed."""
        grid, tune = self.grid, self.tune
        if tune is None or method not in tune.methods:
            raise ConfigError(f"tune.methods.{method}: not defined (tuned: "
                              f"{', '.join(tune.methods) if tune is not None else 'none, no tune section'})")
        return method, grid.datasets[0], grid.partitions[0], *grid.clients[0], tune.seed

    def tune_candidates(self, method: str) -> list[dict[str, Any]]:
        """The candidates of `method`, each a dict of dotted overrides, in order (the choice's tie order)."""
        self.tune_cell(method)
        return self.tune.candidates(method)

    def tune_config(self, method: str, candidate: Mapping[str, Any], prepared_dir: str | None = None,
                    source: str = "params") -> ExperimentConfig:
        """The config of one candidate's tuning run: its cell (:meth:`tune_cell`) for ``tune.rounds``
        rounds with the candidate's values, holding out ``tune.validation_fraction`` and evaluating on it
        (``data.evaluate_on: validation``: the run never reads the test set)."""
        cell, tune = self.tune_cell(method), self.tune
        overrides = {**self.cell_overrides(*cell, prepared_dir=prepared_dir), "federation.rounds": tune.rounds,
                     "data.validation_fraction": tune.validation_fraction, "data.evaluate_on": "validation",
                     **candidate}
        return config_from_dict(apply_overrides(self.raw_base, overrides), source=f"{source} [tune {method}]")

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
    # methods.<name>.algorithm.mu -> methods.<name>.mu: the file has no `algorithm` level there (tune.methods has).
    return re.sub(r"(?<!tune\.)(methods\.[^.:;\s]+)\.algorithm\b", r"\1", format_validation_error(error, source))


def params_from_dict(values: Any, source: str = "params", cells: bool = True) -> ParamsFile:
    """Validate a whole params file's contents, and with `cells` every grid cell's composed config
    (without: each cell is validated when :meth:`ParamsFile.cell_config` is first asked for it)."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"{source}: the top level must be a mapping of keys, got {type(values).__name__}")
    try:
        params = ParamsFile.model_validate(dict(values))
    except ValidationError as error:
        raise ConfigError(_format_params_location(error, source)) from None
    for cell in params.all_cells() if cells else ():
        method, dataset, partition, clients, per_round, seed = cell
        params.cell_config(*cell, source=f"{source} [grid cell {method} {dataset} {partition} "
                                         f"K={clients} M={per_round} seed={seed}]")
    for method in params.tune.methods if cells and params.tune is not None else ():
        for candidate in params.tune_candidates(method):
            params.tune_config(method, candidate, source=source)
    return params


def load_params(path: str | Path, cells: bool = True) -> ParamsFile:
    """Read and validate a params file; a problem is one ConfigError line naming file and key.

    With `cells` (``fedcme check``, the report, the tools), every grid cell's composed config is
    validated too; without, only the file's sections are, and a cell's config when it is asked for
    (a DVC stage: the train stage validates its own cell's config, once, and no other)."""
    values = read_yaml(path)
    if not is_params_file(values):
        raise ConfigError(f"{path}: base: missing, or not a mapping of config keys (a params file needs "
                          "base, methods, grid)")
    params = params_from_dict(values, source=str(path), cells=cells)
    return params


def load_config(
    path: str | Path, overrides: Mapping[str, Any] | None = None, section: str | None = None
) -> ExperimentConfig:
    """Load and validate one experiment's config; `overrides` are dotted keys ({"training.lr": 0.1}).

    With `section`, the config is that top-level key of the file. A params file (a top-level `base`
    mapping: params.yaml, configs/params-*.yaml) gives its `base` by default: the file's sections are
    validated once, its `base` (with the overrides) among them, so that a typo anywhere in the file
    (``gird:`` for ``grid:``) is one line; its grid cells are the pipeline's (:func:`load_params`,
    ``fedcme check``), and no other experiment config is validated.
    """
    values = read_yaml(path)
    if values is None:
        values = {}
    source = str(path)
    if is_params_file(values) and section in (None, "base"):
        whole = {**values, "base": apply_overrides(values["base"], overrides or {})}
        return params_from_dict(whole, source=source, cells=False).base
    if is_params_file(values):
        section = section or "base"
    if section is not None:
        if not isinstance(values, Mapping) or not isinstance(values.get(section), Mapping):
            raise ConfigError(f"{path}: {section}: missing, or not a mapping of config keys")
        values, source = values[section], f"{path} [{section}]"
    if overrides:
        values = apply_overrides(values, overrides)
    return config_from_dict(values, source=source)
