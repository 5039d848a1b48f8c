"""The config's view of the registries of data sources (:mod:`fedcme_core.data.catalog`) and model
architectures (:mod:`fedcme_core.client.architectures`): the names it accepts, checked against the
registries when a config is validated (so a source or an architecture registered later is known), a
dataset's input shape and number of classes as far as they are known before its data is loaded, and
the one check of a dataset against its model. No torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Protocol

from pydantic import AfterValidator

from fedcme_core.client.architectures import InputShape, architecture, check_classifier_layers, check_input_shape
from fedcme_core.data.catalog import SourceSettings, SyntheticSpec, preparable_names, source
from fedcme_core.data.prepared import prepared_meta
from fedcme_core.data.sources import DataError


class DataSettings(Protocol):
    """A config's `data:` section (``fedcme_core.config.schema.DataConfig``)."""

    dataset: str
    data_dir: str
    path: str | None
    prepared_dir: str | None

    @property
    def synthetic(self): ...


class ModelSettings(Protocol):
    """A config's `model:` section (``fedcme_core.config.schema.ModelConfig``)."""

    name: str
    classifier_layers: int


def known_dataset(name: str) -> str:
    """`name` when it is a registered source; else ValueError "unknown dataset ...; expected one of ..."."""
    source(name)
    return name


def known_model(name: str) -> str:
    """`name` when it is a registered architecture; else ValueError "unknown model ...; choose one of ..."."""
    try:
        architecture(name)
    except ValueError as error:
        raise ValueError(str(error).removeprefix("model.name: ")) from None
    return name


def grid_dataset(name: str) -> str:
    """`name` when the prepare stage writes it (a grid's dataset); else ValueError naming those that it does."""
    known_dataset(name)
    if name not in preparable_names():
        raise ValueError(f"{name!r} is not a dataset the prepare stage writes; choose one of "
                         f"{', '.join(preparable_names())}")
    return name


DatasetName = Annotated[str, AfterValidator(known_dataset)]  # data.dataset
ModelName = Annotated[str, AfterValidator(known_model)]  # model.name
GridDatasetName = Annotated[str, AfterValidator(grid_dataset)]  # grid.datasets, datasets.<name>


def source_settings(data: DataSettings) -> SourceSettings:
    """What a source reads, from a `data:` section (the synthetic spec without its seed: shapes only)."""
    synthetic = data.synthetic
    return SourceSettings(Path(data.data_dir), None, Path(data.path) if data.path is not None else None,
                          SyntheticSpec(num_train=synthetic.num_train, num_test=synthetic.num_test,
                                        shape=tuple(synthetic.shape), noise=synthetic.noise))


def _prepared_facts(data: DataSettings) -> dict | None:
    """The facts a prepared folder records for the config's dataset (None: no folder, or none recorded)."""
    if data.prepared_dir is None or not (Path(data.prepared_dir) / "meta.json").is_file():
        return None
    try:
        meta = prepared_meta(Path(data.prepared_dir))
    except DataError:
        return None
    return meta.get("derived") if meta["dataset"] == data.dataset else None


def data_input_shape(data: DataSettings) -> InputShape | None:
    """The (C, H, W) of the dataset's samples before its data is loaded: declared by its source, or
    recorded beside its prepared arrays, or read from its file's header (None: not known yet)."""
    facts = _prepared_facts(data)
    if facts is not None:
        return tuple(int(size) for size in facts["input_shape"])
    return source(data.dataset).shape(source_settings(data))


def data_num_classes(data: DataSettings) -> int | None:
    """The dataset's number of classes where known before its data is loaded (None: derived then)."""
    facts = _prepared_facts(data)
    if facts is not None:
        return int(facts["num_classes"])
    return source(data.dataset).peek_classes(source_settings(data))


def check_data_model(data: DataSettings, model: ModelSettings) -> None:
    """The dataset against its model, as far as known before loading: a source that reads ``data.path``
    has one, the model is built for the dataset's input shape (or adapts to it), and it offers a
    classifier of ``model.classifier_layers`` layers. One ValueError line naming the key."""
    if source(data.dataset).needs_path and data.path is None:
        raise ValueError(f"data.path: missing; data.dataset {data.dataset} reads its data from data.path")
    check_input_shape(model.name, data_input_shape(data), data.dataset)
    check_classifier_layers(model.name, model.classifier_layers)
