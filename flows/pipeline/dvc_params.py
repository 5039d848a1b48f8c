"""Which params paths ``dvc.yaml`` reads, for a given params file, and which of them it lacks.

DVC fails a stage whose params path is missing from ``params.yaml`` only when it reaches that
stage ("Parameters 'base.data.train_subset' are missing"). This expands ``dvc.yaml``'s matrix
stages the way DVC does (``${grid.datasets}`` from the params, ``${item.clients.0}`` from each
matrix item) and lists every params path and matrix source it names, so `fedcme check` and the
tests find a missing one before anything runs.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from fedcme_core.config.files import ConfigError, read_yaml

_REFERENCE = re.compile(r"\$\{\s*([^}\s]+)\s*\}")
_MISSING = object()


def lookup(tree: Any, dotted: str) -> Any:
    """The value at `dotted` ("grid.clients.0") in nested mappings and lists, or _MISSING."""
    node = tree
    for part in dotted.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def _substitute(text: str, context: Mapping[str, Any]) -> str:
    def value(match: re.Match) -> str:
        found = lookup(context, match.group(1))
        return match.group(0) if found is _MISSING else str(found)

    return _REFERENCE.sub(value, text)


def _matrix_items(matrix: Mapping[str, Any], params: Mapping[str, Any], needed: list[str],
                  defaults: Mapping[str, Any]) -> Iterator[dict]:
    columns: dict[str, list] = {}
    for key, source in matrix.items():
        if isinstance(source, str) and (reference := _REFERENCE.fullmatch(source.strip())):
            source = lookup(params, reference.group(1))
            if source is _MISSING and lookup(defaults, reference.group(1)) is not _MISSING:
                source = lookup(defaults, reference.group(1))  # dvc.yaml's `vars` default (tune.methods: {})
            else:
                needed.append(reference.group(1))
        columns[key] = list(source) if isinstance(source, (list, Mapping)) else []  # a mapping: its keys
    for values in itertools.product(*columns.values()):
        yield dict(zip(columns, values))


def _stage_params(stage: Mapping[str, Any]) -> Iterator[str]:
    for entry in stage.get("params") or []:
        if isinstance(entry, str):
            yield entry
        elif isinstance(entry, Mapping):  # {params.yaml: [key, ...]}
            for keys in entry.values():
                yield from keys or []


def needed_params(dvc_yaml: Mapping[str, Any], params: Mapping[str, Any]) -> list[str]:
    """Every params path the stages of `dvc_yaml` read from `params`, matrix sources included."""
    needed: list[str] = []
    defaults = {key: value for entry in dvc_yaml.get("vars") or [] if isinstance(entry, Mapping)
                for key, value in entry.items()}
    for stage in (dvc_yaml.get("stages") or {}).values():
        items = list(_matrix_items(stage["matrix"], params, needed, defaults)) if "matrix" in stage else [{}]
        for item, path in itertools.product(items, _stage_params(stage)):
            needed.append(_substitute(path, {**params, "item": item}))
    return list(dict.fromkeys(needed))


def check_dvc_params(dvc_yaml_path: str | Path, params_path: str | Path) -> int:
    """The number of params paths `dvc.yaml` reads from the params file; one ConfigError line
    naming the file and the paths when it lacks any (DVC would stop on each)."""
    dvc_yaml = read_yaml(dvc_yaml_path)
    if not isinstance(dvc_yaml, Mapping):
        raise ConfigError(f"{dvc_yaml_path}: not a mapping of stages")
    params = read_yaml(params_path) or {}
    needed = needed_params(dvc_yaml, params)
    missing = [path for path in needed if lookup(params, path) is _MISSING]
    if missing:
        raise ConfigError(f"{params_path}: {', '.join(missing)}: missing (read by {dvc_yaml_path}; "
                          "DVC needs every params path a stage lists, null included)")
    return len(needed)
