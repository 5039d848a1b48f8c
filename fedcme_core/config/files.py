"""Reading config files: YAML in which a key given twice is an error, every failure one line
(:class:`ConfigError`), and dotted overrides ({"training.lr": 0.1}) applied to a copy.

Shared by the experiment config (:mod:`fedcme_core.config.schema`), the params file
(:mod:`fedcme_core.config.params`) and the DVC parameter check (``flows/pipeline/dvc_params.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A configuration file or value is invalid; the message names the key and the reason."""


def read_yaml(path: str | Path) -> Any:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: cannot read config file ({error})") from None
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = f": {error.problem}" if isinstance(error, DuplicateKeyError) else ""
        raise ConfigError(f"{path}: not valid YAML{where}{problem}") from None


class DuplicateKeyError(yaml.constructor.ConstructorError):
    pass


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load, except that a key given twice in one mapping is an error (as DVC's reader has
    it), not silently the last value."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise DuplicateKeyError(None, None, f"key {key!r} given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def apply_overrides(values: Any, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the nested mapping `values` with dotted `overrides` set."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"config: the top level must be a mapping of keys, got {type(values).__name__}")
    result = _deep_copy(values)
    for dotted, value in overrides.items():
        node = result
        *parents, leaf = dotted.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{dotted}: cannot set a key below {part!r}, which is not a mapping")
            node = child
        node[leaf] = value
    return result


def _deep_copy(values: Mapping[str, Any]) -> dict[str, Any]:
    return {key: _deep_copy(value) if isinstance(value, Mapping) else value for key, value in values.items()}
