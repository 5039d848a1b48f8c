"""The record of one global round: what the round loop writes into a run's history, and
what the MLflow metrics, the per-round CSV and the report derive from.

A history holds plain dicts (a server state loads with ``weights_only=True``);
:meth:`RoundRecord.to_dict` and :meth:`RoundRecord.from_dict` cross between the two.
``round`` is the 0-based index t of the round; everything a person reads counts rounds from 1
(:attr:`RoundRecord.number`: the console line, the MLflow step, the CSV, the report and the
matching artifact ``matching/round-0001.json``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

METRIC = {"metric": True}  # logged to MLflow per round
CSV = {"metric": True, "csv": True}  # also a column of metrics/<exp>.csv


@dataclass(frozen=True)
class RoundRecord:
    round: int  # t, 0-based
    selected: list[int]
    pairs: list[list[int]]  # the matching as formed (FedCME), [] otherwise
    evaluation_vectors: dict[int, list[float]]  # client -> eps_k uploaded this round (FedCME)
    test_accuracy: float = field(metadata=CSV)
    test_loss: float = field(metadata=CSV)
    train_loss: float = field(metadata=CSV)  # the clients' last-epoch loss, weighted by D_k
    per_class_accuracy: list[float]
    client_train_seconds: float = field(metadata=METRIC)
    client_work_seconds: float = field(metadata=METRIC)  # local training plus the step-7 report
    critical_client_seconds: float = field(metadata=METRIC)  # the longest client of each phase, summed
    samples_trained: int
    aggregated_clients: int = field(metadata=METRIC)
    dropped_clients: int = field(metadata=METRIC)
    failed_clients: int = field(metadata=METRIC)
    rejected_clients: int = field(metadata=METRIC)
    failures: dict[int, str]  # client -> why it is not in the aggregate
    phase1_seconds: float = field(metadata=METRIC)
    aggregate_seconds: float = field(metadata=METRIC)
    evaluate_seconds: float = field(metadata=METRIC)
    round_seconds: float = field(metadata=CSV)
    exchange_seconds: float | None = field(default=None, metadata=METRIC)  # None: no exchange this round
    phase2_seconds: float | None = field(default=None, metadata=METRIC)

    @property
    def number(self) -> int:
        """The round as people count it: 1 for the first."""
        return self.round + 1

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        return {key: value for key, value in values.items() if value is not None}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RoundRecord:
        names = {item.name for item in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in values.items() if key in names})

    @classmethod
    def metric_names(cls) -> tuple[str, ...]:
        return tuple(item.name for item in dataclasses.fields(cls) if item.metadata.get("metric"))

    @classmethod
    def csv_columns(cls) -> tuple[str, ...]:
        """``round`` (1-based) and the per-round figures the plots and the report read."""
        return ("round", *(item.name for item in dataclasses.fields(cls) if item.metadata.get("csv")))


def round_line(record: Mapping[str, Any], total_rounds: int, elapsed: float, rounds_done_here: int) -> str:
    """The console line of a finished round, with an ETA from this command's own pace."""
    done = int(record["round"]) + 1
    remaining = elapsed / max(rounds_done_here, 1) * (total_rounds - done)
    return (
        f"round {done:>4}/{total_rounds}  acc {record['test_accuracy']:.4f}  loss {record['test_loss']:.4f}  "
        f"train_loss {record['train_loss']:.4f}  {record['round_seconds']:.1f}s  ETA {remaining:.0f}s"
    )
