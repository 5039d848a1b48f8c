"""No module of the library or of the orchestration outside ``fedcme_core/algorithms/`` names an
algorithm: no string literal that is a registered algorithm's name (``"fedcme"``, ``"moon"`` ...), and
no import of one algorithm's module or class. What the rest of the project needs of an algorithm it
reads from the registry and the algorithm's config class (display name, label parameter, readings,
paper claims, checks). Sources are read with ``ast``, as ``tests/test_layers.py`` reads them; tests,
configs and docs may name algorithms.

The project shares its name with its method: "fedcme" is also the command, the cache folder and the
default MLflow experiment, in the modules of PROJECT_NAME_USES only.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fedcme_core.algorithms import ALGORITHMS, ALGORITHM_NAMES

from .test_layers import FLOWS, PACKAGE, imports_of, library_modules

ALGORITHMS_PACKAGE = PACKAGE / "algorithms"
# Where "fedcme" is the project's name, not the algorithm's: path -> what it names there.
PROJECT_NAME_USES = {
    "fedcme_core/client/compute.py": "the machine's cache folder (~/.cache/fedcme)",
    "flows/cli.py": "the command, `fedcme`",
    "flows/tracking/names.py": "the grids' MLflow experiment, `fedcme`",
    "flows/tracking/store.py": "the command that syncs a run, `fedcme sync`",
}
PROJECT_NAME = "fedcme"


def specific_modules() -> set[str]:
    """The modules of the registered algorithms (fedcme_core.algorithms.fedcme, ...)."""
    return {cls.__module__ for cls in ALGORITHMS.values()}


def specific_classes() -> set[str]:
    """The registered algorithms' classes and their config classes (FedCME, FedCMEConfig, ...)."""
    return {name for cls in ALGORITHMS.values() for name in (cls.__name__, cls.config_class.__name__)}


def name_literals(source: str) -> list[tuple[int, str]]:
    """(line, literal) of every string constant in `source` that is an algorithm's name."""
    return [(node.lineno, node.value) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in ALGORITHM_NAMES]


def class_imports(source: str) -> list[tuple[int, str]]:
    """(line, name) of every name imported from the algorithms' package that is one algorithm's class."""
    return [(node.lineno, alias.name) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fedcme_core.algorithms")
            for alias in node.names if alias.name in specific_classes()]


def modules_outside_the_algorithms() -> dict[str, Path]:
    modules = {**library_modules(PACKAGE), **library_modules(FLOWS)}
    return {name: path for name, path in modules.items() if not path.is_relative_to(ALGORITHMS_PACKAGE)}


def relative(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


def problems_of(name: str, source: str, where: str, modules: set[str]) -> list[str]:
    """The places where the module `name` (its `source`, at `where`) names an algorithm."""
    allowed = {PROJECT_NAME} if where in PROJECT_NAME_USES else set()
    problems = [f"{where}:{line}: the literal {literal!r}" for line, literal in name_literals(source)
                if literal not in allowed]
    problems += [f"{where}:{found.line}: imports {found.target}"
                 for found in imports_of(name, source, modules | specific_modules(), where,
                                         where.endswith("__init__.py"))
                 if found.target in specific_modules()]
    problems += [f"{where}:{line}: imports {imported} from the algorithms" for line, imported in class_imports(source)]
    return problems


def test_no_module_outside_the_algorithms_names_an_algorithm():
    modules = modules_outside_the_algorithms()
    problems = [problem for name, path in modules.items()
                for problem in problems_of(name, path.read_text(encoding="utf-8"), relative(path), set(modules))]
    assert not problems, ("algorithms named outside fedcme_core/algorithms (read it from the registry or the "
                          "algorithm's config class):\n" + "\n".join(problems))


def test_each_use_of_the_project_name_is_still_there():
    """The list shrinks when a module stops naming the project (PROJECT_NAME_USES is no blanket leave)."""
    unused = [where for where in PROJECT_NAME_USES
              if PROJECT_NAME not in [literal for _, literal in name_literals((PACKAGE.parent / where).read_text())]]
    assert not unused, f"no longer name the project: {unused}; take them off PROJECT_NAME_USES"


@pytest.mark.parametrize(("source", "found"), [
    ('if config.algorithm.name == "moon":\n    pass\n', ["the literal 'moon'"]),
    ('LABELS = {"fedprox": "FedProx"}\n', ["the literal 'fedprox'"]),
    ("from fedcme_core.algorithms.fedcme import FedCMEConfig\n",
     ["imports fedcme_core.algorithms.fedcme", "imports FedCMEConfig from the algorithms"]),
    ("from fedcme_core.algorithms import Scaffold\n", ["imports Scaffold from the algorithms"]),
    ("from fedcme_core.common.lazy import lazy_module\nmoon = lazy_module('fedcme_core.algorithms.moon')\n",
     ["imports fedcme_core.algorithms.moon"]),
    ('from fedcme_core.algorithms import ALGORITHM_CONFIGS, readings\nTEXT = "FedCME(0.01), fedcme-mu001"\n', []),
])
def test_a_name_is_found_however_it_is_written(source, found):
    problems = problems_of("fedcme_core.config.example", source, "fedcme_core/config/example.py",
                           {"fedcme_core.common.lazy"})

    assert [problem.split(": ", 1)[1] for problem in problems] == found
