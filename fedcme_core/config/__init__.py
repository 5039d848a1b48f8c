"""The experiment config: its schema (pydantic), the params files that hold a grid, and partition
tags; one ConfigError line for any problem. The ``algorithm:`` section's
classes are the algorithms' own (the union derived from their registry, ``fedcme_core.algorithms``,
a layer below). The public names, for scripts: ``from fedcme_core.config import load_config``."""

from fedcme_core.config.files import ConfigError
from fedcme_core.config.params import load_config
from fedcme_core.config.schema import ExperimentConfig, config_from_dict

__all__ = ["ConfigError", "ExperimentConfig", "config_from_dict", "load_config"]
