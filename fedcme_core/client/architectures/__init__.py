"""Model architectures, and the one registry of them (no torch).

Adding an architecture is one new module here and one line in ``ARCHITECTURES`` below. The module
declares an :class:`~.base.Architecture` named ``ARCHITECTURE``: its ``model.name``, its input shape (or
None: it adapts to the dataset's), its no-grad batch, its feature dimension per extractor/classifier
split, and its backbone builder (theta); :func:`fedcme_core.client.models.build_model` adds the
classifier phi and, for MOON, the projection head. The module reaches torch only through
``lazy_module`` (as the algorithms do): the config (:mod:`fedcme_core.config.schema`, a layer above)
checks a dataset against its model and the model's classifier split, and validating a config must
not cost torch's import (`fedcme train` validates the whole params file before it starts anything).
Layers an architecture builds from as classes of their own live in :mod:`fedcme_core.client.layers`.
"""

from __future__ import annotations

from collections.abc import Iterable

from fedcme_core.client.architectures import cifar_cnn, cifar_cnn64, fmnist_cnn, resnet18_gn
from fedcme_core.client.architectures.base import Architecture, InputShape


def registry(architectures: Iterable[Architecture]) -> dict[str, Architecture]:
    """name -> Architecture, in the order given; no two the same name."""
    table: dict[str, Architecture] = {}
    for architecture in architectures:
        if architecture.name in table:
            raise ValueError(f"architecture name {architecture.name!r} is declared twice")
        table[architecture.name] = architecture
    return table


# The registry: one line per architecture.
ARCHITECTURES: dict[str, Architecture] = registry([
    fmnist_cnn.ARCHITECTURE,
    cifar_cnn.ARCHITECTURE,
    cifar_cnn64.ARCHITECTURE,
    resnet18_gn.ARCHITECTURE,
])

# The built-in architectures' names and declarations, for the benchmarks and tests (the config and the
# builder read ARCHITECTURES itself, so an architecture registered later is known to them too).
MODEL_NAMES = tuple(ARCHITECTURES)
MODEL_INPUT_SHAPES: dict[str, InputShape | None] = {name: a.input_shape for name, a in ARCHITECTURES.items()}
MODEL_INFERENCE_BATCH: dict[str, int] = {name: a.inference_batch for name, a in ARCHITECTURES.items()}


def architecture(name: str) -> Architecture:
    """The registered architecture `name`; else a one-line ValueError naming ``model.name`` and the choices."""
    if name not in ARCHITECTURES:
        raise ValueError(f"model.name: unknown model {name!r}; choose one of {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[name]


def check_classifier_layers(name: str, classifier_layers: int) -> None:
    """Raise a one-line ValueError naming ``model.classifier_layers`` and the model when the model
    cannot split off `classifier_layers` linear layers as its classifier."""
    supported = architecture(name).classifier_layers
    if classifier_layers not in supported:
        choices = " or ".join(str(layers) for layers in supported)
        raise ValueError(f"model.classifier_layers: model {name} offers a classifier of {choices} linear "
                         f"layer{'s' if supported[-1] > 1 else ''}, not {classifier_layers!r}")


def check_input_shape(name: str, input_shape: InputShape | None, dataset: str) -> None:
    """Raise a one-line ValueError naming ``model.name`` when the model is built for inputs other than
    `input_shape`, the (C, H, W) that `dataset` gives (None: not known yet, checked when it is)."""
    expected = architecture(name).input_shape
    if expected is not None and input_shape is not None and tuple(input_shape) != expected:
        raise ValueError(f"model.name: {name} expects inputs {expected}, but data.dataset {dataset} gives "
                         f"{tuple(input_shape)}")


__all__ = ["ARCHITECTURES", "Architecture", "InputShape", "MODEL_INFERENCE_BATCH", "MODEL_INPUT_SHAPES", "MODEL_NAMES",
           "architecture", "check_classifier_layers", "check_input_shape", "registry"]
