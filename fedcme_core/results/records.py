"""The record of one global round: what the round loop writes into a run's history, and
what the MLflow metrics (named by :meth:`RoundRecord.mlflow_metrics`), the per-round CSV and the
report derive from.

A history holds plain dicts (a server state loads with ``weights_only=True``);
:meth:`RoundRecord.to_dict` and :meth:`RoundRecord.from_dict` cross between the two. The record
names no algorithm: what an algorithm keeps of a round is its own section, ``algorithm``
(``Algorithm.round_record``: FedCME's ``pairs`` and ``evaluation_vectors``), read through
:func:`algorithm_section`, which also reads a record written before the section existed (FedCME's
keys at the top level of every record).

``round`` is the 0-based index t of the round; everything a person reads counts rounds from 1
(:attr:`RoundRecord.number`: the console line, the MLflow step, the CSV, the report and the
matching artifact ``matching/round-0001.json``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def metric(name: str, csv: bool = False) -> dict[str, Any]:
    """A field logged to MLflow per round under `name` (grouped by prefix: eval/, train/, time/,
    clients/, so MLflow's charts group them); with `csv`, also a column of metrics/<exp>.csv."""
    return {"metric": name, "csv": csv}


@dataclass(frozen=True)
class RoundRecord:
    round: int  # t, 0-based
    selected: list[int]
    algorithm: dict[str, Any]  # the algorithm's own section (Algorithm.round_record), plain JSON data
    test_accuracy: float = field(metadata=metric("eval/test_accuracy", csv=True))
    test_loss: float = field(metadata=metric("eval/test_loss", csv=True))
    train_loss: float = field(metadata=metric("train/loss", csv=True))  # the clients' last-epoch loss, weighted by D_k
    per_class_accuracy: list[float]
    client_train_seconds: float = field(metadata=metric("time/client_train_seconds"))
    client_work_seconds: float = field(metadata=metric("time/client_work_seconds"))  # local training plus the step-7 report
    critical_client_seconds: float = field(metadata=metric("time/critical_client_seconds"))  # the longest client of each phase, summed
    samples_trained: int
    aggregated_clients: int = field(metadata=metric("clients/aggregated"))
    dropped_clients: int = field(metadata=metric("clients/dropped"))
    failed_clients: int = field(metadata=metric("clients/failed"))
    rejected_clients: int = field(metadata=metric("clients/rejected"))
    failures: dict[int, str]  # client -> why it is not in the aggregate
    phase1_seconds: float = field(metadata=metric("time/phase1_seconds"))
    aggregate_seconds: float = field(metadata=metric("time/aggregate_seconds"))
    evaluate_seconds: float = field(metadata=metric("time/evaluate_seconds"))
    round_seconds: float = field(metadata=metric("time/round_seconds", csv=True))
    # The exchanges at the phase boundaries and the phases after the first, each summed (one of each
    # for FedCME); None: a round of one phase.
    exchange_seconds: float | None = field(default=None, metadata=metric("time/exchange_seconds"))
    phase2_seconds: float | None = field(default=None, metadata=metric("time/phase2_seconds"))

    @property
    def number(self) -> int:
        """The round as people count it: 1 for the first."""
        return self.round + 1

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        return {key: value for key, value in values.items() if value is not None}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RoundRecord:
        names = {item.name for item in dataclasses.fields(cls)} - {"algorithm"}
        return cls(**{key: value for key, value in values.items() if key in names},
                   algorithm=dict(algorithm_section(values)))

    @classmethod
    def metric_names(cls) -> tuple[str, ...]:
        """The record's keys logged to MLflow per round (test_accuracy first)."""
        return tuple(item.name for item in dataclasses.fields(cls) if item.metadata.get("metric"))

    @classmethod
    def mlflow_metrics(cls) -> dict[str, str]:
        """{record key: MLflow metric name}: test_accuracy -> eval/test_accuracy, train_loss ->
        train/loss, round_seconds -> time/round_seconds, failed_clients -> clients/failed."""
        return {item.name: item.metadata["metric"] for item in dataclasses.fields(cls) if item.metadata.get("metric")}

    @classmethod
    def csv_columns(cls) -> tuple[str, ...]:
        """``round`` (1-based) and the per-round figures the plots and the report read."""
        return ("round", *(item.name for item in dataclasses.fields(cls) if item.metadata.get("csv")))


# FedCME's keys, which a record held at its top level (for every algorithm) before the algorithm section.
LEGACY_ALGORITHM_KEYS = ("pairs", "evaluation_vectors")


def algorithm_section(record: Mapping[str, Any]) -> Mapping[str, Any]:
    """The algorithm's own section of a history record (a dict), in either form: ``record["algorithm"]``,
    or for a record written before it existed, the FedCME keys at its top level."""
    if "algorithm" in record:
        return record["algorithm"]
    return {key: record[key] for key in LEGACY_ALGORITHM_KEYS if key in record}


def round_line(record: Mapping[str, Any], total_rounds: int, elapsed: float, rounds_done_here: int) -> str:
    """The console line of a finished round, with an ETA from this command's own pace."""
    done = int(record["round"]) + 1
    remaining = elapsed / max(rounds_done_here, 1) * (total_rounds - done)
    return (
        f"round {done:>4}/{total_rounds}  acc {record['test_accuracy']:.4f}  loss {record['test_loss']:.4f}  "
        f"train_loss {record['train_loss']:.4f}  {record['round_seconds']:.1f}s  ETA {remaining:.0f}s"
    )
