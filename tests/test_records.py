"""The typed round record: what the history, MLflow and the CSV derive from."""

from __future__ import annotations

from fedcme_core.algorithms import RecordSection
from fedcme_core.algorithms.fedcme import MatchingRecord
from fedcme_core.results.metrics import history_csv
from fedcme_core.results.records import RoundRecord, algorithm_section, phase_seconds, round_line

SECTION = MatchingRecord(pairs=[(3, 1)], evaluation_vectors={3: [0.5, 1.0]})


def record(round_index: int = 2, **extra) -> RoundRecord:
    values = dict(round=round_index, selected=[3, 1], algorithm=SECTION,
                  test_accuracy=0.25, local_accuracy=0.25, local_accuracy_client_mean=0.2, local_accuracy_p10=0.1,
                  test_loss=2.5, train_loss=1.5, per_class_accuracy=[0.0, 0.5],
                  client_train_seconds=4.0, client_work_seconds=4.5, critical_client_seconds=2.5, samples_trained=80,
                  aggregated_clients=2, dropped_clients=0, failed_clients=0, rejected_clients=0, failures={},
                  phase_seconds=[1.0], aggregate_seconds=0.5, evaluate_seconds=0.25, round_seconds=5.0)
    return RoundRecord(**{**values, **extra})


def test_a_record_round_trips_through_its_plain_dict_and_drops_absent_figures():
    plain = record().to_dict()

    assert "exchange_seconds" not in plain and plain["phase_seconds"] == [1.0]
    assert plain["algorithm"] == {"pairs": [[3, 1]], "evaluation_vectors": {3: [0.5, 1.0]}}  # the section's own form
    assert RoundRecord.from_dict(plain, MatchingRecord) == record()
    assert RoundRecord.from_dict({**plain, "exchange_seconds": 0.1}, MatchingRecord).exchange_seconds == 0.1
    assert RoundRecord.from_dict(plain).algorithm == RecordSection()  # FedAvg's section: nothing of its own


def test_the_record_names_no_algorithm_and_reads_the_form_before_its_algorithm_section():
    plain = record().to_dict()
    legacy = {key: value for key, value in plain.items() if key != "algorithm"}
    legacy.update(pairs=[[3, 1]], evaluation_vectors={3: [0.5, 1.0]})  # FedCME's keys at the top, as written before

    assert not {"pairs", "evaluation_vectors"} & set(plain)
    assert algorithm_section(plain) == algorithm_section(legacy) == {"pairs": [[3, 1]],
                                                                     "evaluation_vectors": {3: [0.5, 1.0]}}
    assert RoundRecord.from_dict(legacy, MatchingRecord) == record()
    assert algorithm_section(record(algorithm=RecordSection()).to_dict()) == {}


def test_phase_times_are_a_list_and_a_record_of_two_named_phases_still_reads():
    two = record(phase_seconds=[1.0, 2.5], exchange_seconds=0.25).to_dict()
    before = {key: value for key, value in two.items() if key != "phase_seconds"}
    before.update(phase1_seconds=1.0, phase2_seconds=2.5)  # as written before the list
    one = {key: value for key, value in before.items() if key != "phase2_seconds"}

    assert phase_seconds(two) == phase_seconds(before) == [1.0, 2.5] and phase_seconds(one) == [1.0]
    assert RoundRecord.from_dict(before, MatchingRecord).phase_seconds == [1.0, 2.5]
    assert algorithm_section({key: value for key, value in before.items() if key != "algorithm"}) == {}


def test_the_mlflow_values_of_a_record_name_each_phase():
    values = RoundRecord.mlflow_values(record(phase_seconds=[1.0, 2.5], exchange_seconds=0.25).to_dict())

    assert values["time/phase1_seconds"] == 1.0 and values["time/phase2_seconds"] == 2.5
    assert values["time/exchange_seconds"] == 0.25 and values["eval/test_accuracy"] == 0.25
    assert "time/phase3_seconds" not in values and len(values) == len(RoundRecord.mlflow_metrics()) + 2
    one_phase = RoundRecord.mlflow_values(record().to_dict())
    assert "time/exchange_seconds" not in one_phase and one_phase["time/phase1_seconds"] == 1.0
    legacy = {**{key: value for key, value in record().to_dict().items() if key != "phase_seconds"},
              "phase1_seconds": 3.0}
    assert RoundRecord.mlflow_values(legacy)["time/phase1_seconds"] == 3.0


def test_the_round_number_people_read_counts_from_one():
    assert record(round_index=0).number == 1
    assert history_csv([record(0).to_dict(), record(1).to_dict()]).splitlines()[1].startswith("1,")


def test_metric_and_csv_names_derive_from_the_record():
    assert RoundRecord.csv_columns() == ("round", "test_accuracy", "local_accuracy", "local_accuracy_client_mean",
                                         "local_accuracy_p10", "test_loss", "train_loss", "round_seconds")
    names = RoundRecord.mlflow_metrics()  # grouped by prefix, so MLflow's charts group them
    assert list(names)[0] == "test_accuracy" and {"exchange_seconds", "rejected_clients"} <= set(names)
    assert not {"round", "selected", "algorithm", "failures", "per_class_accuracy", "phase_seconds"} & set(names)
    assert names["train_loss"] == "train/loss" and names["failed_clients"] == "clients/failed"
    assert all(name.split("/")[0] in ("eval", "train", "time", "clients") for name in names.values())


def test_round_line_by_hand():
    # 2 rounds done here in 10 s: 5 s a round, 7 rounds left after round 3 of 10.
    line = round_line(record(round_index=2).to_dict(), total_rounds=10, elapsed=10.0, rounds_done_here=2)
    assert line == "round    3/10  acc 0.2500  loss 2.5000  train_loss 1.5000  5.0s  ETA 35s"
