"""The inputs of the results report: a metrics folder's experiments and their matching records.

Each experiment contributes ``metrics/<exp>.json`` (its results, :func:`fedcme_core.results.metrics.summarize`),
``metrics/about/<exp>.json`` (its identity: method label, setting, group, seed and the grid cell; a
file written before 2026-12-01 holds both in one), ``metrics/<exp>.csv`` (per round) and
``metrics/matching/<exp>.json`` (the matching, :func:`fedcme_core.server.matching.matching_similarity`).
Every file is checked as it is read: a bad one is one ValueError naming it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedcme_core.results.metrics import verify_content_hash

from flows.report.figures import matching_rounds
from flows.report.tables import FEDCME_PREFIX, unique_in_order

IDENTIFYING_KEYS = ("experiment", "method", "setting", "group", "seed")
SUMMARY_KEYS = ("rounds", "final_accuracy", "best_accuracy", "accuracy_at", "rounds_to_target")
REQUIRED_KEYS = IDENTIFYING_KEYS + SUMMARY_KEYS
GROUPS = ("main", "ablation")


def read_json_object(path: Path) -> dict[str, Any]:
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(entry, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(entry).__name__}")
    return entry


def load_metrics(directory: Path) -> list[dict[str, Any]]:
    """Every experiment of `directory`: each ``*.json`` results file joined with its ``about/`` file,
    sorted by file name.

    Raises ValueError naming the file when it is not valid JSON, not an object, does not match
    its ``content_sha256``, lacks a required key (named too) or has a group other than "main" /
    "ablation".
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"{directory}: metrics folder not found")
    entries = []
    for path in sorted(directory.glob("*.json")):
        entry = read_json_object(path)
        about = directory / "about" / path.name
        if about.is_file():
            entry = {**entry, **read_json_object(about)}
        verify_content_hash(entry, str(path))
        for key in REQUIRED_KEYS:
            if key not in entry:
                missing = "" if about.is_file() else f" (and {about} is missing)"
                raise ValueError(f"{path}: lacks the required key {key!r}{missing}")
        if entry["group"] not in GROUPS:
            raise ValueError(f"{path}: key 'group' must be one of {GROUPS}, got {entry['group']!r}")
        entries.append(entry)
    return entries


def load_matching(directory: Path) -> list[dict[str, Any]]:
    """The matching records of ``<metrics>/matching/*.json`` (none when the folder is absent)."""
    folder = Path(directory) / "matching"
    records = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        record = read_json_object(path)
        for key in ("experiment", "method", "setting", "seed", "class_counts", "rounds"):
            if key not in record:
                raise ValueError(f"{path}: lacks the required key {key!r}")
        records.append(record)
    return records


def matching_runs(records: Sequence[Mapping[str, Any]], entries: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The matching records of the one (method, setting) the picture shows, over its seeds.

    The first main-group FedCME method (in the order of the entries) of the first setting whose
    runs have scored pairs; seeds in ascending order. Empty when no run matched anything.
    """
    main = {(entry["method"], entry["setting"]) for entry in entries if entry["group"] == "main"}
    candidates = [record for record in records
                  if (record["method"], record["setting"]) in main and record["method"].startswith(FEDCME_PREFIX)
                  and matching_rounds(record) is not None]
    if not candidates:
        return []
    order = unique_in_order([(entry["method"], entry["setting"]) for entry in entries])
    chosen = min({(r["method"], r["setting"]) for r in candidates}, key=order.index)
    return sorted((r for r in candidates if (r["method"], r["setting"]) == chosen), key=lambda r: int(r["seed"]))
