"""The library's layers: every import of ``fedcme_core`` points down (or within its own layer), no
module imports itself back through others, and no import hides inside a function or under
``TYPE_CHECKING``; and the library never imports the orchestration stack (Prefect, MLflow, DVC).

Bottom to top (a module may import its own layer and those below it):

    common < data < client < server < algorithms < config < results < rounds

The orchestration (``flows``) is layered the same way, every import pointing down, inside functions
too (its module-level cycles are checked; it defers Prefect's and MLflow's imports for start-up):

    common < tracking < orchestration < report < pipeline < cli

``config`` sits above ``algorithms``: the config's algorithm union is derived from the registry
of algorithms. Every module's imports are read from its source (``ast``): module level, inside
functions, under ``if TYPE_CHECKING``, relative ones resolved, and a module-level
``lazy_module("...")`` (``fedcme_core.common.lazy``: imported on first use), which counts as an
import of the module it names.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fedcme_core"
LAYERS = ("common", "data", "client", "server", "algorithms", "config", "results", "rounds")
# Modules outside the layer packages, each placed in a layer by hand (the package's own, empty,
# __init__.py imports nothing).
PLACED = {"fedcme_core": "common"}
FORBIDDEN = ("prefect", "prefect_dask", "mlflow", "dvc")  # the orchestration's (flows/), never the library's
LAZY = "lazy_module"


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the imported module, resolved (a fedcme_core module, or any top-level package)
    line: int
    hidden: str | None  # "inside a function" / "under TYPE_CHECKING" / None
    path: str

    def where(self) -> str:
        return f"{self.path}:{self.line}"


FLOWS = PACKAGE.parent / "flows"
# flows/, bottom to top: what the commands share, MLflow, Prefect, the report, the DVC pipeline, then the CLI.
FLOWS_LAYERS = ("common", "tracking", "orchestration", "report", "pipeline", "cli")
FLOWS_PLACED = {"flows": "common", "flows.cli": "cli"}


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def library_modules(root: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(path, root): path for path in sorted(root.rglob("*.py"))}


def layer_of(module: str, layers: tuple[str, ...] = LAYERS, placed: dict[str, str] = PLACED) -> str | None:
    if module in placed:
        return placed[module]
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in layers else None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(module: str, source: str, modules: set[str], path: str = "", is_package: bool = False) -> list[Import]:
    """Every import in `source` (the module `module`), resolved against the library's `modules`."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[Import] = []

    def resolve_from(node: ast.ImportFrom) -> list[str]:
        if node.level:
            base = package.split(".")
            base = base[: len(base) - (node.level - 1)]
            stem = ".".join(base + ([node.module] if node.module else []))
        else:
            stem = node.module or ""
        # `from package import submodule` imports the submodule; `from module import name`, the module.
        return [f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in modules else stem for alias in node.names]

    def visit(node: ast.AST, hidden: str | None) -> None:
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            targets = resolve_from(node)
        elif isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name in (LAZY, "import_module", "__import__") and node.args:
                argument = node.args[0]
                if name == LAZY and isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                    targets = [argument.value]
                elif module != "fedcme_core.common.lazy":  # the one place that imports by a name it is given
                    targets = [f"<{name}(...)>"]
                    hidden = hidden or "by a computed name"
        for target in targets:
            found.append(Import(module, target, node.lineno, hidden, path))
        for child in ast.iter_child_nodes(node):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, hidden or "inside a function")
            elif isinstance(node, ast.If) and _is_type_checking(node.test) and child in node.body:
                visit(child, hidden or "under TYPE_CHECKING")
            else:
                visit(child, hidden)

    visit(ast.parse(source), None)
    return found


def library_imports(root: Path = PACKAGE) -> list[Import]:
    modules = library_modules(root)
    names = set(modules)
    return [found for name, path in modules.items()
            for found in imports_of(name, path.read_text(encoding="utf-8"), names,
                                    str(path.relative_to(root.parent)), path.name == "__init__.py")]


def layer_problems(imports: list[Import], package: str = "fedcme_core", layers: tuple[str, ...] = LAYERS,
                   placed: dict[str, str] = PLACED) -> list[str]:
    problems = []
    for found in imports:
        if found.target.split(".")[0] != package:
            continue
        source, target = layer_of(found.module, layers, placed), layer_of(found.target, layers, placed)
        if source is None or target is None:
            unplaced = found.module if source is None else found.target
            problems.append(f"{found.where()}: {unplaced} is in no layer (place it in test_layers' placed modules)")
        elif layers.index(target) > layers.index(source):
            problems.append(f"{found.where()}: {found.module} ({source}) imports {found.target} ({target}), a layer above")
    return problems


def cycles(imports: list[Import], package: str = "fedcme_core") -> list[list[str]]:
    """The import cycles among a package's modules (each found once, from a depth-first search)."""
    graph: dict[str, set[str]] = {}
    for found in imports:
        if found.target.split(".")[0] == package and found.target != found.module:
            graph.setdefault(found.module, set()).add(found.target)
    state: dict[str, str] = {}  # "open" while on the DFS path, "done" after
    path: list[str] = []
    found_cycles: list[list[str]] = []

    def visit(module: str) -> None:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                found_cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return found_cycles


# ----------------------------------------------------------------------------------- the library
def test_every_package_of_the_library_is_a_layer():
    packages = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").is_file()}
    singles = {module_name(path) for path in PACKAGE.glob("*.py")} - {"fedcme_core"}
    assert packages == set(LAYERS), f"packages {sorted(packages)} against the layers {LAYERS}"
    assert singles <= set(PLACED), f"modules in no layer package: {sorted(singles - set(PLACED))}; place them in PLACED"


def test_every_import_points_down_or_within_its_layer():
    problems = layer_problems(library_imports())
    assert not problems, "imports that point up:\n" + "\n".join(problems)


def test_no_import_cycle_among_the_modules():
    found = cycles(library_imports())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in found)


def test_no_import_hides_inside_a_function_or_under_type_checking():
    hidden = [f"{found.where()}: {found.module} imports {found.target} {found.hidden}"
              for found in library_imports() if found.hidden]
    assert not hidden, ("imports to move to the module's top (lazy_module() for one that must wait for its first "
                        "use):\n" + "\n".join(hidden))


def test_the_library_never_imports_the_orchestration():
    used = [f"{found.where()}: {found.module} imports {found.target}" for found in library_imports()
            if found.target.split(".")[0] in FORBIDDEN]
    assert not used, "fedcme_core imports Prefect, MLflow or DVC (flows/ does):\n" + "\n".join(used)


# ------------------------------------------------------------------------------- the orchestration
def test_every_package_of_the_orchestration_is_a_layer():
    packages = {path.name for path in FLOWS.iterdir() if (path / "__init__.py").is_file()}
    singles = {module_name(path, FLOWS) for path in FLOWS.glob("*.py")} - {"flows"}
    assert packages == set(FLOWS_LAYERS) - {"cli"}, f"packages {sorted(packages)} against the layers {FLOWS_LAYERS}"
    assert singles <= set(FLOWS_PLACED), f"modules at flows/'s top in no layer: {sorted(singles - set(FLOWS_PLACED))}"


def test_every_import_of_the_orchestration_points_down_or_within_its_layer():
    """Imports inside functions count too (flows/ defers Prefect's and MLflow's for start-up time)."""
    problems = layer_problems(library_imports(FLOWS), "flows", FLOWS_LAYERS, FLOWS_PLACED)
    assert not problems, "imports that point up:\n" + "\n".join(problems)


def test_no_import_cycle_among_the_orchestration_modules():
    found = cycles([found for found in library_imports(FLOWS) if not found.hidden], "flows")
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in found)


# ----------------------------------------------------------------------------- the checks, checked
MODULES = {"fedcme_core", "fedcme_core.common", "fedcme_core.common.lazy", "fedcme_core.client",
           "fedcme_core.client.models", "fedcme_core.client.training", "fedcme_core.config",
           "fedcme_core.config.schema", "fedcme_core.rounds", "fedcme_core.rounds.store"}


def parsed(module: str, source: str, is_package: bool = False) -> list[Import]:
    return imports_of(module, source, MODULES, module.replace(".", "/") + ".py", is_package)


@pytest.mark.parametrize("source, hidden", [
    ("from fedcme_core.config.schema import TrainingConfig\n", None),
    ("def f():\n    from fedcme_core.config.schema import TrainingConfig\n", "inside a function"),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..config.schema import TrainingConfig\n",
     "under TYPE_CHECKING"),
    ("import typing\nif typing.TYPE_CHECKING:\n    import fedcme_core.config.schema\n", "under TYPE_CHECKING"),
    ("from fedcme_core.common.lazy import lazy_module\nschema = lazy_module('fedcme_core.config.schema')\n", None),
])
def test_an_upward_import_is_found_however_it_is_written(source, hidden):
    found = [item for item in parsed("fedcme_core.client.training", source) if item.target.startswith("fedcme_core.c")
             and item.target != "fedcme_core.common.lazy"]

    assert [(item.target, item.hidden) for item in found] == [("fedcme_core.config.schema", hidden)]
    problems = layer_problems(found)
    assert problems == [f"fedcme_core/client/training.py:{found[0].line}: fedcme_core.client.training (client) imports "
                        "fedcme_core.config.schema (config), a layer above"]


def test_relative_imports_resolve_and_a_package_name_import_is_the_package():
    found = parsed("fedcme_core.rounds", "from . import store\nfrom .store import x\nfrom ..client import models\n"
                   "from fedcme_core.config import load_config\n", is_package=True)

    assert [item.target for item in found] == ["fedcme_core.rounds.store", "fedcme_core.rounds.store",
                                               "fedcme_core.client.models", "fedcme_core.config"]


def test_a_cycle_is_named_and_a_computed_import_is_hidden():
    found = [*parsed("fedcme_core.client.models", "from fedcme_core.client import training\n"),
             *parsed("fedcme_core.client.training", "import fedcme_core.client.models\n"),
             *parsed("fedcme_core.client.training", "import importlib\nm = importlib.import_module('x')\n")]

    assert cycles(found) == [["fedcme_core.client.models", "fedcme_core.client.training", "fedcme_core.client.models"]]
    assert [item.hidden for item in found if item.target.startswith("<")] == ["by a computed name"]
