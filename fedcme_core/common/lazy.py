"""Modules imported on first use, declared at the top of the module that uses them.

    torch = lazy_module("torch")

binds a stand-in whose first attribute access imports ``torch`` (an ordinary import, kept in
``sys.modules`` as usual) and which hands every attribute on from the real module. Nothing is
imported, and nothing enters ``sys.modules``, until then.

Three places need it. A config is validated before torch is imported (2 s here: ``fedcme train``
starts Prefect's server while torch loads, BENCHMARKS.md), and the config's algorithm union is
derived from the registry of algorithms (``fedcme_core.algorithms``), so importing an algorithm
module must not import torch or the torch-bound modules below it; they use those only when they
run. And the datasets reach torchvision (2 s, torch._dynamo) only when a download or the mirror's
Fashion-MNIST files need it (``fedcme_core.data.sources``). And the pipeline's partition stage
and its report write numpy arrays and JSON only, so the datasets, the seeds and the stages
(``flows.pipeline.stages``) reach torch only when a tensor is built or a model trained.

The dependency stays where a reader and ``tests/test_layers.py`` see it: a module-level
``lazy_module("fedcme_core.x")`` counts as an import of ``fedcme_core.x``, and no module of the
library imports anything inside a function.
"""

from __future__ import annotations

import importlib
import types
from typing import Any


class LazyModule(types.ModuleType):
    """Stands in for the module `name`; imported at the first attribute read (no attribute is
    cached here, so a module attribute replaced later, e.g. by a test, is what is read).

    Every read goes through ``importlib.import_module``, never ``sys.modules`` alone: while one
    thread is still running the module's code (a Dask worker's first client step), the module is
    already in ``sys.modules`` half initialized, and the import system makes a second thread wait
    on the module's import lock until it is whole (a few microseconds once it is)."""

    def __getattr__(self, attribute: str) -> Any:
        return getattr(importlib.import_module(self.__name__), attribute)

    def __repr__(self) -> str:
        return f"<lazy module {self.__name__!r}>"


def lazy_module(name: str) -> Any:
    """The module `name`, imported when one of its attributes is first read (typed Any: the real
    module's attributes are read through it)."""
    return LazyModule(name)
