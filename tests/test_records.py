"""The typed round record: what the history, MLflow and the CSV derive from."""

from __future__ import annotations

from fedcme_core.results.metrics import history_csv
from fedcme_core.results.records import RoundRecord, algorithm_section, round_line


def record(round_index: int = 2, **extra) -> RoundRecord:
    values = dict(round=round_index, selected=[3, 1], algorithm={"pairs": [[3, 1]], "evaluation_vectors": {3: [0.5, 1.0]}},
                  test_accuracy=0.25, test_loss=2.5, train_loss=1.5, per_class_accuracy=[0.0, 0.5],
                  client_train_seconds=4.0, client_work_seconds=4.5, critical_client_seconds=2.5, samples_trained=80,
                  aggregated_clients=2, dropped_clients=0, failed_clients=0, rejected_clients=0, failures={},
                  phase1_seconds=1.0, aggregate_seconds=0.5, evaluate_seconds=0.25, round_seconds=5.0)
    return RoundRecord(**{**values, **extra})


def test_a_record_round_trips_through_its_plain_dict_and_drops_absent_phases():
    plain = record().to_dict()

    assert "exchange_seconds" not in plain and "phase2_seconds" not in plain
    assert RoundRecord.from_dict(plain) == record()
    assert RoundRecord.from_dict({**plain, "exchange_seconds": 0.1}).exchange_seconds == 0.1


def test_the_record_names_no_algorithm_and_reads_the_form_before_its_algorithm_section():
    plain = record().to_dict()
    legacy = {key: value for key, value in plain.items() if key != "algorithm"}
    legacy.update(pairs=[[3, 1]], evaluation_vectors={3: [0.5, 1.0]})  # FedCME's keys at the top, as written before

    assert not {"pairs", "evaluation_vectors"} & set(plain)
    assert algorithm_section(plain) == algorithm_section(legacy) == {"pairs": [[3, 1]], "evaluation_vectors": {3: [0.5, 1.0]}}
    assert RoundRecord.from_dict(legacy) == record()
    assert algorithm_section(record(algorithm={}).to_dict()) == {}


def test_the_round_number_people_read_counts_from_one():
    assert record(round_index=0).number == 1
    assert history_csv([record(0).to_dict(), record(1).to_dict()]).splitlines()[1].startswith("1,")


def test_metric_and_csv_names_derive_from_the_record():
    assert RoundRecord.csv_columns() == ("round", "test_accuracy", "test_loss", "train_loss", "round_seconds")
    metrics = RoundRecord.metric_names()
    assert metrics[0] == "test_accuracy" and {"exchange_seconds", "rejected_clients"} <= set(metrics)
    assert not {"round", "selected", "algorithm", "failures", "per_class_accuracy"} & set(metrics)
    names = RoundRecord.mlflow_metrics()  # grouped by prefix, so MLflow's charts group them
    assert list(names) == list(metrics) and names["test_accuracy"] == "eval/test_accuracy"
    assert names["train_loss"] == "train/loss" and names["failed_clients"] == "clients/failed"
    assert all(name.split("/")[0] in ("eval", "train", "time", "clients") for name in names.values())


def test_round_line_by_hand():
    # 2 rounds done here in 10 s: 5 s a round, 7 rounds left after round 3 of 10.
    line = round_line(record(round_index=2).to_dict(), total_rounds=10, elapsed=10.0, rounds_done_here=2)
    assert line == "round    3/10  acc 0.2500  loss 2.5000  train_loss 1.5000  5.0s  ETA 35s"
