"""Summary metrics of one training run, in the forms that FedCME's paper reports.

FedCME (Nie et al., arXiv:2307.08574) compares methods by final test accuracy (its Table
II) and by test accuracy at fixed fractions of the training budget T, plus the number of
rounds needed to reach a target accuracy (its Table III). This module turns a run's
history (one record per global round, ``round`` = 0..T-1, with ``test_accuracy``,
``test_loss``, ``train_loss`` and ``round_seconds``) into:

- :func:`summarize`: a JSON-ready dict with the final accuracy (mean of the last
  ``final_window`` rounds, a choice of SPEC.md), the final local accuracy (the same mean of
  ``local_accuracy``), the best accuracy and its round, the
  accuracy after round ceil(T * k / fractions) for k = 1..fractions, the rounds to reach a
  target accuracy and the total wall time;
- :func:`history_csv`: the per-round CSV text that DVC plots and the report's figures read;
- :func:`with_content_hash` / :func:`verify_content_hash`: a summary's SHA-256, so an edited or
  corrupted metrics file is named when the report reads it;
- :func:`split_summary`: an experiment's summary as its two files, the few numbers that `dvc metrics
  show` compares (``metrics/<exp>.json``, :data:`RESULT_KEYS`) and the rest: what names the run and
  its other figures (``metrics/about/<exp>.json``).

Round counts in the outputs are 1-based: "after round r" means after r global rounds,
i.e. the record whose ``round`` is r - 1.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedcme_core.results.records import RoundRecord

CSV_COLUMNS = RoundRecord.csv_columns()
# What a history record must hold for the summary and the CSV (not the local accuracies: older records lack them).
RECORD_KEYS = tuple(key for key in CSV_COLUMNS if key not in RoundRecord.optional_keys())


def ordered_records(history: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The records sorted by round; checks that the rounds are exactly 0..T-1.

    Raises ValueError for an empty history, a record lacking a key of RECORD_KEYS, a
    non-integer round, a duplicated round (the message names it) or a missing round.
    """
    if len(history) == 0:
        raise ValueError("history is empty")
    for position, record in enumerate(history):
        for key in RECORD_KEYS:
            if key not in record:
                raise ValueError(f"history record {position} lacks the key {key!r}")
        round_index = record["round"]
        if isinstance(round_index, bool) or not isinstance(round_index, (int, np.integer)):
            raise ValueError(f"history record {position}: round must be an integer, got {round_index!r}")
    records = sorted(history, key=lambda record: int(record["round"]))
    seen_rounds: set[int] = set()
    for record in records:
        round_index = int(record["round"])
        if round_index in seen_rounds:
            raise ValueError(f"history has round {round_index} more than once")
        seen_rounds.add(round_index)
    for expected_round, record in enumerate(records):
        if int(record["round"]) != expected_round:
            raise ValueError(f"history lacks round {expected_round} (its rounds must be 0..{len(records) - 1})")
    return records


def rounds_after_fraction(total_rounds: int, numerator: int, denominator: int) -> int:
    """ceil(total_rounds * numerator / denominator), in exact integer arithmetic."""
    return -(-total_rounds * numerator // denominator)


def summarize(
    history: Sequence[Mapping[str, Any]],
    *,
    target_accuracy: float | None = None,
    final_window: int = 5,
    fractions: int = 5,
) -> dict[str, Any]:
    """The run's summary as a JSON-ready dict of plain Python values.

    Keys: ``rounds`` (T), ``final_window`` (the requested window), ``final_accuracy`` and
    ``final_loss`` (mean test accuracy / loss over the last ``final_window`` rounds, all of
    them when T is smaller), ``final_local_accuracy`` (the mean ``local_accuracy`` over the same
    rounds; None when one of them lacks it, a history written before it), ``best_accuracy``
    and ``best_round`` (1-based, first round reaching the best), ``accuracy_at`` ({"k/fractions": accuracy after round
    ceil(T * k / fractions)}), ``target_accuracy`` and ``rounds_to_target`` (1-based rounds
    until test accuracy first reaches the target; None if it never does or there is no
    target) and ``total_seconds`` (sum of round_seconds).
    """
    if final_window < 1:
        raise ValueError(f"final_window must be at least 1, got {final_window}")
    if fractions < 1:
        raise ValueError(f"fractions must be at least 1, got {fractions}")
    records = ordered_records(history)
    total_rounds = len(records)
    accuracies = [float(record["test_accuracy"]) for record in records]
    window = records[-final_window:]

    best_accuracy = max(accuracies)
    best_position = accuracies.index(best_accuracy)

    accuracy_at = {
        f"{numerator}/{fractions}": accuracies[rounds_after_fraction(total_rounds, numerator, fractions) - 1]
        for numerator in range(1, fractions + 1)
    }

    rounds_to_target = None
    if target_accuracy is not None:
        rounds_to_target = next(
            (position + 1 for position, accuracy in enumerate(accuracies) if accuracy >= target_accuracy),
            None,
        )

    local = [record.get("local_accuracy") for record in window]
    return {
        "rounds": total_rounds,
        "final_window": final_window,
        "final_accuracy": float(np.mean([float(record["test_accuracy"]) for record in window])),
        "final_local_accuracy": None if None in local else float(np.mean([float(value) for value in local])),
        "final_loss": float(np.mean([float(record["test_loss"]) for record in window])),
        "best_accuracy": best_accuracy,
        "best_round": best_position + 1,
        "accuracy_at": accuracy_at,
        "target_accuracy": None if target_accuracy is None else float(target_accuracy),
        "rounds_to_target": rounds_to_target,
        "total_seconds": float(math.fsum(float(record["round_seconds"]) for record in records)),
    }


def history_csv(history: Sequence[Mapping[str, Any]]) -> str:
    """The history as CSV text (header + one line per round, round 1-based, floats in repr form; a figure
    the record lacks, such as the local accuracy of a round written before it, is an empty cell)."""
    lines = [",".join(CSV_COLUMNS)]
    for record in ordered_records(history):
        values = [str(int(record["round"]) + 1)]
        values += ["" if record.get(column) is None else repr(float(record[column])) for column in CSV_COLUMNS[1:]]
        lines.append(",".join(values))
    return "\n".join(lines) + "\n"


HASH_KEY = "content_sha256"


def _canonical_sha256(values: Mapping[str, Any]) -> str:
    text = json.dumps({key: value for key, value in values.items() if key != HASH_KEY}, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def with_content_hash(summary: Mapping[str, Any]) -> dict[str, Any]:
    """`summary` plus ``content_sha256``: the SHA-256 of its other keys as canonical JSON."""
    return {**summary, HASH_KEY: _canonical_sha256(summary)}


# What `dvc metrics show` compares, one column each (fractions; rounds_to_target in rounds), so that
# its table fits a terminal: the final accuracy, the final local accuracy (None for a run written before
# it), the best, the accuracy after round ceil(2T/5) and the rounds to the target. Everything else of
# a summary (what names the run, its other figures) goes to the about/ file; that file keeps the whole
# ``accuracy_at`` too, so the two join by a plain dict update.
RESULT_KEYS = ("final_accuracy", "final_local_accuracy", "best_accuracy", "rounds_to_target")
COMPARED_FRACTION = "2/5"


def split_summary(entry: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(results, about) of an experiment's hashed summary: results holds RESULT_KEYS and
    ``accuracy_at`` reduced to COMPARED_FRACTION (numbers only, so `dvc metrics show` lists no text);
    about holds every other key, the whole ``accuracy_at`` included. ``{**results, **about}`` is `entry`."""
    results = {key: entry[key] for key in RESULT_KEYS if key in entry}
    accuracy_at = entry.get("accuracy_at")
    if isinstance(accuracy_at, Mapping) and COMPARED_FRACTION in accuracy_at:
        results["accuracy_at"] = {COMPARED_FRACTION: accuracy_at[COMPARED_FRACTION]}
    about = {key: value for key, value in entry.items() if key not in RESULT_KEYS}
    return results, about


def verify_content_hash(entry: Mapping[str, Any], source: str) -> None:
    """Raise ValueError naming `source` when a metrics entry's ``content_sha256`` does not match it."""
    if HASH_KEY in entry and entry[HASH_KEY] != _canonical_sha256(entry):
        raise ValueError(f"{source}: content hash mismatch (edited or corrupted metrics file)")
