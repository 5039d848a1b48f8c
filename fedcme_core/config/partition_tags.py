"""The partition dimension of a grid (``grid.partitions``): one tag per partition family member.

- ``a<alpha>`` (``a0.1``, ``a1.0``): the base's Dirichlet-family partition (``base.partition.method``:
  dirichlet, iid, lognormal_dirichlet or client_dirichlet) with ``partition.alpha = alpha``. The alpha
  is written as Python writes the float (``a1.0``, not ``a1``), so one partition has one name.
- ``c<k>`` (``c2``): NIID-Bench's #C=k, ``partition.method: labels_per_client`` with k labels per client.

A tag is part of file names (``fmnist-a0.1-k50-s0``, ``cifar10-c2-k10m10-fedavg-s0``) as written.
Torch-free: the params schema, the stages and the report read it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

LABELS_PER_CLIENT = "labels_per_client"
TAG_FORMS = "write a<alpha> (Dirichlet alpha) or c<k> (k labels per client)"
_LABELS_TAG = re.compile(r"c([1-9][0-9]*)")


@dataclass(frozen=True)
class PartitionTag:
    """A parsed tag: exactly one of `alpha` (an ``a`` tag) and `labels_per_client` (a ``c`` tag) is set."""

    tag: str
    alpha: float | None = None
    labels_per_client: int | None = None


def alpha_tag(alpha: float) -> str:
    """0.1 -> "a0.1", 1 -> "a1.0": the tag of a Dirichlet alpha, as file names spell it."""
    return f"a{float(alpha)!r}"


def parse_partition_tag(tag: Any) -> PartitionTag:
    """The meaning of `tag`; ValueError saying what is wrong with a bad one (no key: the caller names it)."""
    if isinstance(tag, str) and (match := _LABELS_TAG.fullmatch(tag)):
        return PartitionTag(tag, labels_per_client=int(match.group(1)))
    if isinstance(tag, str) and tag.startswith("a"):
        try:
            alpha = float(tag[1:])
        except ValueError:
            alpha = math.nan
        if math.isfinite(alpha) and alpha > 0:
            if tag != alpha_tag(alpha):
                raise ValueError(f"{tag!r} is spelled {alpha_tag(alpha)} (the tag is part of file names)")
            return PartitionTag(tag, alpha=alpha)
    raise ValueError(f"{tag!r} is not a partition tag; {TAG_FORMS}")


def check_tag_for_method(tag: str, base_method: str) -> None:
    """ValueError when an ``a`` tag meets a base partition method that reads no alpha (labels_per_client)."""
    if parse_partition_tag(tag).alpha is not None and base_method == LABELS_PER_CLIENT:
        raise ValueError(f"{tag!r} sets a Dirichlet alpha, but base.partition.method is {LABELS_PER_CLIENT}; "
                         "write c<k>, or set base.partition.method to dirichlet, iid, lognormal_dirichlet or "
                         "client_dirichlet")


def partition_overrides(tag: str) -> dict[str, Any]:
    """The dotted experiment-config overrides of a tag: {"partition.alpha": 0.1} or
    {"partition.method": "labels_per_client", "partition.labels_per_client": 2}."""
    parsed = parse_partition_tag(tag)
    if parsed.alpha is not None:
        return {"partition.alpha": parsed.alpha}
    return {"partition.method": LABELS_PER_CLIENT, "partition.labels_per_client": parsed.labels_per_client}


def partition_label(tag: str) -> str:
    """"α=0.1" / "#C=2": a tag as the report names it."""
    parsed = parse_partition_tag(tag)
    return f"α={parsed.alpha}" if parsed.alpha is not None else f"#C={parsed.labels_per_client}"


def partition_description(partition: Any) -> str:
    """"dirichlet(0.1)", "iid", "labels_per_client(2)": what a partition config (method, alpha,
    labels_per_client) partitions by, as the results CSV names it."""
    if partition.method == LABELS_PER_CLIENT:
        return f"{LABELS_PER_CLIENT}({partition.labels_per_client})"
    if partition.method == "iid":
        return "iid"
    return f"{partition.method}({partition.alpha})"


def entry_partition_tag(entry: Mapping[str, Any]) -> str:
    """The tag of a metrics entry: its ``partition``, or ``a<alpha>`` for one written before tags
    (those under docs/results/*/ hold only ``alpha``)."""
    tag = entry.get("partition")
    return str(tag) if tag is not None else alpha_tag(entry["alpha"])
