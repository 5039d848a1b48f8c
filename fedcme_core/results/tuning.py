"""Choosing a method's hyper-parameters by validation accuracy (the grid file's ``tune:`` section).

A candidate is a dict of dotted config overrides (``{"training.lr": 0.01, "algorithm.mu": 0.1}``:
:meth:`fedcme_core.config.sections.TuneSection.candidates`), its
history the per-round records of its tuning run, whose ``test_accuracy`` is measured on the validation
set (``data.evaluate_on: validation``): tuning never reads the test set.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

SCORE_WINDOW = 5  # the score: mean validation accuracy over the last 5 rounds (all of them when fewer)


def validation_score(history: Sequence[Mapping[str, Any]], window: int = SCORE_WINDOW) -> float:
    """Mean ``test_accuracy`` (here: validation accuracy) of the last `window` rounds of `history`."""
    if not history:
        raise ValueError("a candidate's history has no rounds")
    records = sorted(history, key=lambda record: int(record["round"]))
    last = records[-window:]
    return sum(float(record["test_accuracy"]) for record in last) / len(last)


def choose(candidates: Sequence[Mapping[str, Any]],
           histories: Sequence[Sequence[Mapping[str, Any]]]) -> tuple[int, list[float]]:
    """(index of the chosen candidate, each candidate's :func:`validation_score`): the highest score;
    a tie goes to the candidate given first. `histories[i]` is `candidates[i]`'s tuning history."""
    if len(candidates) != len(histories) or not candidates:
        raise ValueError(f"{len(candidates)} candidates and {len(histories)} histories: need one history each, "
                         "and at least one candidate")
    scores = [validation_score(history) for history in histories]
    return scores.index(max(scores)), scores
