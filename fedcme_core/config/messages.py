"""A pydantic ValidationError of a config as one line naming each key and what is wrong with it
(:class:`~fedcme_core.config.files.ConfigError`'s message): the algorithm's tag and a union member's
type left out of the key, another algorithm's option named as such."""

from __future__ import annotations

import re

from pydantic import ValidationError

from fedcme_core.algorithms import ALGORITHM_CONFIGS, ALGORITHM_NAMES


def _format_location(location: tuple) -> str:
    # Discriminated unions put the tag in the path: ("algorithm", "fedprox", "mu") -> algorithm.mu
    parts = [str(part) for part in location]
    parts = [part for index, part in enumerate(parts)
             if not (index > 0 and parts[index - 1] == "algorithm" and part in ALGORITHM_NAMES)]
    # A plain union puts the member's type in the path: training.channels_last.bool -> training.channels_last
    return ".".join(part for part in parts if not re.fullmatch(r"bool|int|float|str|literal\[.*\]", part))


def _unknown_key_message(location: tuple) -> str:
    """"unknown key", or for an algorithm's key that belongs to another algorithm (align_loss under
    fedavg) which algorithms read it."""
    if len(location) == 3 and location[0] == "algorithm" and location[1] in ALGORITHM_NAMES:
        owners = [cls.model_fields["name"].default for cls in ALGORITHM_CONFIGS if location[2] in cls.model_fields]
        if owners:
            return f"not an option of {location[1]} (it is read by {', '.join(owners)} only)"
    return "unknown key"


def format_validation_error(error: ValidationError, source: str) -> str:
    """One line: `source: key: reason; key: reason`."""
    messages = []
    for detail in error.errors(include_url=False):
        message = detail["msg"].removeprefix("Value error, ")
        location = _format_location(detail["loc"])
        if detail["type"] == "extra_forbidden":
            message = _unknown_key_message(detail["loc"])
        elif detail["type"] == "missing":
            message = "missing"
        elif detail["type"] == "union_tag_invalid":
            message = f"unknown algorithm {detail['input'].get('name')!r}; choose one of {', '.join(ALGORITHM_NAMES)}"
            location = f"{location}.name"
        elif detail["type"] == "union_tag_not_found":
            location, message = f"{location}.name", "missing; choose one of " + ", ".join(ALGORITHM_NAMES)
        if location and re.match(r"[A-Za-z_][\w.]*: ", message):  # a section's validator names its own key
            message = f"{location}.{message}"
        elif location and not message.startswith(location):
            message = f"{location}: {message}"
        messages.append(message)
    return f"{source}: " + "; ".join(messages)
