"""The sections of a params file below ``base``: ``methods`` (named algorithm sections with a label,
a group and ``setup`` overrides), ``grid`` and ``ablation`` (the experiments ``dvc repro`` trains) and
``report`` (its name, target, published figures and the grids it checks against; a study's own keys
there are the report's, ``flows.report``). Each forbids unknown keys (but ``report``, whose other keys
are the studies'); :mod:`fedcme_core.config.params` composes them into the whole file and its grid cells.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from fedcme_core.config.partition_tags import parse_partition_tag, partition_label
from fedcme_core.config.data_sources import GridDatasetName
from fedcme_core.config.schema import AlgorithmConfig, ModelConfig
from fedcme_core.data.catalog import SOURCES


Dataset = GridDatasetName  # a source the prepare stage writes (fedcme_core/data/catalog): fmnist, cifar10, npz, ...


GRID_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]*$"  # a grid's name (report.name): docs/results/<name>.csv


def other_grid_file(grid: str, beside: Path) -> Path | None:
    """The grid file of another grid: ``params-<grid>.yaml`` beside the file `beside`, else under
    ``configs/`` beside it (a params.yaml copied to the root); None when neither exists."""
    for folder in (Path(beside).parent, Path(beside).parent / "configs"):
        if (folder / f"params-{grid}.yaml").is_file():
            return folder / f"params-{grid}.yaml"
    return None


# What `methods.<name>.setup` may not set: the grid's dimensions (and anything under them).
GRID_KEYS = ("seed", "data.dataset", "partition", "federation.num_clients", "federation.clients_per_round")


def setting_label(dataset: str, partition: str, clients: int, per_round: int) -> str:
    """"CIFAR-10 α=0.5 K=10 M=10" / "CIFAR-10 #C=2 K=10 M=10": a grid setting as the report names it."""
    label = SOURCES[dataset].label if dataset in SOURCES else dataset
    return f"{label} {partition_label(partition)} K={clients} M={per_round}"


def _under(key: str, prefixes: tuple[str, ...]) -> bool:
    return any(key == prefix or key.startswith(f"{prefix}.") for prefix in prefixes)


def _setup_key_problem(key: str, value: Any) -> str | None:
    """Why `key` may not be a `setup` override, or None when it may."""
    if _under(key, GRID_KEYS):
        return "a grid dimension; the grid and ablation sections set it"
    if _under(key, ("data.path",)):
        return "the data the prepare stage reads, the same for every method; set it in base.data.path"
    if _under(key, ("algorithm",)):
        return "the method's algorithm; write it in the method itself (methods.<name>.mu), not in setup"
    if isinstance(value, Mapping):
        return "give each key dotted (training.local_epochs: 4), not a whole section"
    return None


class Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class MethodEntry(Section):
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


class DatasetEntry(ModelConfig):
    """`datasets.<name>`: the model a grid dataset trains (the keys of `model:`: name, classifier_layers,
    projection_dim) and, for a researcher's own data (npz, imagefolder), its `path`, which the prepare
    stage reads and the dataset's cells take as `data.path`."""

    path: str | None = Field(None, min_length=1)

    def overrides(self) -> dict[str, Any]:
        """The dotted overrides of the dataset's cells: model.<key> for each model key given, data.path."""
        given = self.model_dump(mode="json", exclude_unset=True)
        path = given.pop("path", None)
        return {**{f"model.{key}": value for key, value in given.items()}, **({"data.path": path} if path else {})}


class GridSection(Section):
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


def _tune_key_problem(key: str, value: Any) -> str | None:
    """Why `key` may not be a tuned parameter, or None when it may (a method's algorithm keys may)."""
    if _under(key, ("algorithm.name",)):
        return "the method's algorithm; tune its options (algorithm.mu), not which algorithm it is"
    if _under(key, ("data", "federation.rounds", "tracking", "runner")):
        return "not a hyper-parameter; the tune section sets the data and the rounds of its runs"
    if _under(key, ("algorithm",)):
        return _setup_key_problem(key.removeprefix("algorithm."), value)
    return _setup_key_problem(key, value)


class TuneSection(Section):
    """`tune`: per method (a key of `methods`), the candidate values of dotted config paths
    (``{training.lr: [0.005, 0.01, 0.05], algorithm.mu: [0.01, 0.1]}``: every combination is a
    candidate), trained for `rounds` rounds with seed `seed` on the grid's first setting, with
    `validation_fraction` of the training set held out and evaluated on in place of the test set.
    The DVC `tune` stage picks each method's candidate by validation accuracy
    (:func:`fedcme_core.results.tuning.choose`); the method's train stages apply it. `methods: {}`
    tunes nothing and makes no tune stage: the shipped grid files' section, which holds every params
    path dvc.yaml's tune stage names."""

    rounds: int = Field(ge=1)
    seed: int = Field(ge=0)  # each key given (dvc.yaml's tune stage lists them)
    validation_fraction: float = Field(gt=0, lt=1)
    methods: dict[str, dict[str, list[Any]]]

    @field_validator("methods")
    @classmethod
    def _candidate_paths(cls, methods: dict[str, dict[str, list[Any]]]) -> dict[str, dict[str, list[Any]]]:
        for method, candidates in methods.items():
            if not candidates:
                raise ValueError(f"{method}: no candidates; give {{path: [values]}} (training.lr: [0.005, 0.01])")
            for key, values in candidates.items():
                problem = _tune_key_problem(key, values[0] if values else None)
                if problem is not None:
                    raise ValueError(f"{method}.{key}: {problem}")
                if not values:
                    raise ValueError(f"{method}.{key}: no values")
                if len(set(map(repr, values))) != len(values):
                    raise ValueError(f"{method}.{key}: a value given twice in {values}")
        return methods

    def candidates(self, method: str) -> list[dict[str, Any]]:
        """Every combination of `method`'s values, in the order of their product as written (the first path
        varies slowest): {a: [1, 2], b: [3]} -> [{a: 1, b: 3}, {a: 2, b: 3}]."""
        paths = self.methods[method]
        return [dict(zip(paths, values)) for values in itertools.product(*paths.values())]


PUBLISHED_MEASURES = ("final_accuracy", "accuracy_at_2T5", "best_accuracy")  # columns of docs/results/<grid>.csv


class PublishedFigure(Section):
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


class ReportSection(Section):
    """`report`: the grid's name, its target accuracy, the figures published for its runs and the other
    grids whose published figures the report sets beside ours (`checks`). A study of the grid's runs
    keeps its own keys here (the sensitivity study's ``references``, ``factors`` and ``combination``),
    which no training reads: here they are plain data, which the report reads and checks
    (``flows.report.factors``)."""

    name: str = Field("default", pattern=GRID_NAME_PATTERN, description="the grid's name (docs/results/<name>.csv)")
    target_accuracy: float | None = Field(None, gt=0, le=1)
    published: list[PublishedFigure] = []
    checks: list[Annotated[str, StringConstraints(pattern=GRID_NAME_PATTERN)]] = Field(
        [], description="other grids whose published figures (their report.published) the report sets beside ours")
    references: dict[str, Any] | None = None
    factors: list[dict[str, Any]] = []
    combination: dict[str, Any] | None = None

    def study(self) -> dict[str, Any]:
        """The study's keys that this section holds, as written (for ``flows.report.factors``)."""
        return self.model_dump(include={"references", "factors", "combination"}, exclude_defaults=True)

    def other_grids(self) -> list[str]:
        """The grids other than this one whose published figures the report sets beside ours."""
        return [grid for grid in dict.fromkeys(self.checks) if grid != self.name]

