"""The record of one global round: what the round loop writes into a run's history, and
what the MLflow metrics (:meth:`RoundRecord.mlflow_values`), the per-round CSV and the report
derive from.

The round loop builds a typed :class:`RoundRecord`; the run store keeps its plain form
(:meth:`RoundRecord.to_dict`: a server state loads with ``weights_only=True``), which is what a
history holds and every reader outside the round reads; :meth:`RoundRecord.from_dict` reads it back.
The record names no algorithm: what an algorithm keeps of a round is its own section, ``algorithm``
(a :class:`~fedcme_core.algorithms.RecordSection` the algorithm owns, ``Algorithm.server_record``),
read from the plain form by :func:`algorithm_section`, which also reads a record written before the
section existed (the algorithm's keys at the top level of the record). The local phases' times are a
list, one per phase (``phase_seconds``), logged to MLflow as ``time/phase1_seconds``,
``time/phase2_seconds``, ...; :func:`phase_seconds` also reads a record written before the list
(``phase1_seconds``, and ``phase2_seconds``, the sum of every later phase).

``round`` is the 0-based index t of the round; everything a person reads counts rounds from 1
(:attr:`RoundRecord.number`: the console line, the MLflow step, the CSV, the report and the
matching artifact ``matching/round-0001.json``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fedcme_core.algorithms import RecordSection

PHASE_METRIC = "time/phase{}_seconds"  # the MLflow metric of phase i (1-based)


def metric(name: str, csv: bool = False) -> dict[str, Any]:
    """A field logged to MLflow per round under `name` (grouped by prefix: eval/, train/, time/,
    clients/, so MLflow's charts group them); with `csv`, also a column of metrics/<exp>.csv."""
    return {"metric": name, "csv": csv}


@dataclass(frozen=True)
class RoundRecord:
    round: int  # t, 0-based
    selected: list[int]
    algorithm: RecordSection  # the algorithm's own section (Algorithm.server_record)
    test_accuracy: float = field(metadata=metric("eval/test_accuracy", csv=True))
    # The global model on each client's test share (fedcme_core.client.evaluation.local_accuracy), weighted
    # by share size (the test accuracy again, up to the classes no client trains on), each client once, and
    # the 10th-percentile client; None in a record written before them.
    local_accuracy: float | None = field(
        default=None, kw_only=True, metadata=metric("eval/local_accuracy", csv=True))
    local_accuracy_client_mean: float | None = field(
        default=None, kw_only=True, metadata=metric("eval/local_accuracy_client_mean", csv=True))
    local_accuracy_p10: float | None = field(
        default=None, kw_only=True, metadata=metric("eval/local_accuracy_p10", csv=True))
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
    phase_seconds: list[float]  # each local phase's wall time, in order (MLflow: PHASE_METRIC)
    aggregate_seconds: float = field(metadata=metric("time/aggregate_seconds"))
    evaluate_seconds: float = field(metadata=metric("time/evaluate_seconds"))
    round_seconds: float = field(metadata=metric("time/round_seconds", csv=True))
    # The exchanges at the phase boundaries, summed; None: a round of one phase.
    exchange_seconds: float | None = field(default=None, metadata=metric("time/exchange_seconds"))

    @property
    def number(self) -> int:
        """The round as people count it: 1 for the first."""
        return self.round + 1

    def to_dict(self) -> dict[str, Any]:
        """The stored form: plain data, the algorithm's section as it writes it, no None figure."""
        values = {**dataclasses.asdict(self), "algorithm": self.algorithm.to_dict()}
        return {key: value for key, value in values.items() if value is not None}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], section: type[RecordSection] = RecordSection) -> RoundRecord:
        """The record stored as `values` (either form), its algorithm section read as `section`."""
        names = {item.name for item in dataclasses.fields(cls)} - {"algorithm", "phase_seconds"}
        return cls(**{key: value for key, value in values.items() if key in names},
                   algorithm=section.from_dict(algorithm_section(values)), phase_seconds=phase_seconds(values))

    @classmethod
    def mlflow_metrics(cls) -> dict[str, str]:
        """{record key: MLflow name} of the record's single figures: test_accuracy -> eval/test_accuracy,
        train_loss -> train/loss, round_seconds -> time/round_seconds, failed_clients -> clients/failed
        (test_accuracy first; the phase times, one metric per phase, are PHASE_METRIC's)."""
        return {item.name: item.metadata["metric"] for item in dataclasses.fields(cls) if item.metadata.get("metric")}

    @classmethod
    def mlflow_values(cls, record: Mapping[str, Any]) -> dict[str, float]:
        """{MLflow name: value} of a stored record (either form): its single figures that it holds,
        then time/phase1_seconds, time/phase2_seconds, ... of its phases."""
        values = {name: float(record[key]) for key, name in cls.mlflow_metrics().items() if record.get(key) is not None}
        values.update({PHASE_METRIC.format(index): seconds for index, seconds in enumerate(phase_seconds(record), 1)})
        return values

    @classmethod
    def csv_columns(cls) -> tuple[str, ...]:
        """``round`` (1-based) and the per-round figures the plots and the report read."""
        return ("round", *(item.name for item in dataclasses.fields(cls) if item.metadata.get("csv")))

    @classmethod
    def optional_keys(cls) -> frozenset[str]:
        """The figures a stored record may lack (None, or written before they existed): local_accuracy ..."""
        return frozenset(item.name for item in dataclasses.fields(cls) if item.default is None)


# The phase times of a record written before they were a list: the first phase, and every later one summed.
LEGACY_PHASE_KEYS = ("phase1_seconds", "phase2_seconds")


def phase_seconds(record: Mapping[str, Any]) -> list[float]:
    """The phase times of a stored record: its ``phase_seconds``, or for a record written before the
    list, [phase1_seconds] and phase2_seconds (every later phase, summed) where it has one."""
    if "phase_seconds" in record:
        return [float(seconds) for seconds in record["phase_seconds"]]
    return [float(record[key]) for key in LEGACY_PHASE_KEYS if record.get(key) is not None]


def algorithm_section(record: Mapping[str, Any]) -> Mapping[str, Any]:
    """The algorithm's own section of a stored record, in either form: ``record["algorithm"]``, or for
    a record written before it existed, the keys at its top level that are no field of the record."""
    if "algorithm" in record:
        return record["algorithm"]
    own = {item.name for item in dataclasses.fields(RoundRecord)} | set(LEGACY_PHASE_KEYS)
    return {key: value for key, value in record.items() if key not in own}


def round_line(record: Mapping[str, Any], total_rounds: int, elapsed: float, rounds_done_here: int) -> str:
    """The console line of a finished round, with an ETA from this command's own pace."""
    done = int(record["round"]) + 1
    remaining = elapsed / max(rounds_done_here, 1) * (total_rounds - done)
    return (
        f"round {done:>4}/{total_rounds}  acc {record['test_accuracy']:.4f}  loss {record['test_loss']:.4f}  "
        f"train_loss {record['train_loss']:.4f}  {record['round_seconds']:.1f}s  ETA {remaining:.0f}s"
    )
