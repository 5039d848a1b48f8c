"""Local accuracy (issue #56): the test set dealt to the clients by their training label mix, and the global
model scored on each share beside the whole test set, in the record, the summary, the CSV and the report."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest
import torch
from torch import nn

from fedcme_core.algorithms import build_algorithm
from fedcme_core.client.evaluation import evaluate, local_accuracy
from fedcme_core.data.labels import PartitionError
from fedcme_core.data.local_shares import largest_remainder, local_shares
from fedcme_core.results.metrics import history_csv, split_summary, summarize
from fedcme_core.results.records import RoundRecord
from fedcme_core.rounds import store
from fedcme_core.rounds.run_shares import run_test_shares
from fedcme_core.rounds.setup import prepare_run
from fedcme_core.rounds.steps import evaluate_step

from flows.report.seed_stats import summary_csv
from flows.report.tables import accuracy_table

from .conftest import build_synthetic_config
from .report_helpers import LOW, metrics_entry


def test_largest_remainder_splits_exactly_and_gives_the_left_over_to_the_largest_remainders():
    assert largest_remainder(4, np.array([3, 1])).tolist() == [3, 1]
    assert largest_remainder(2, np.array([2, 1])).tolist() == [1, 1]  # 4/3 -> 1 r 1/3, 2/3 -> 0 r 2/3
    assert largest_remainder(5, np.array([1, 1, 1])).tolist() == [2, 2, 1]  # ties: the lower index first
    assert largest_remainder(3, np.array([0, 5, 0, 1])).tolist() == [0, 3, 0, 0]  # 2.5 -> 3, 0.5 -> 0 (tie, 1 first)
    assert largest_remainder(7, np.array([0, 2, 0])).tolist() == [0, 7, 0]


def test_each_class_goes_to_the_clients_that_train_on_it_in_their_proportions():
    counts = np.array([[3, 0, 0], [1, 2, 0]])  # class 2: nobody trains on it
    labels = np.array([0, 1, 0, 2, 0, 1, 0, 1, 2])  # class 0: 0, 2, 4, 6; class 1: 1, 5, 7; class 2: 3, 8

    shares = local_shares(counts, labels, seed=7)

    assert [np.bincount(labels[share], minlength=3).tolist() for share in shares] == [[3, 0, 0], [1, 3, 0]]
    assert all(share.dtype == np.int64 and np.all(np.diff(share) > 0) for share in shares)
    assert set(np.concatenate(shares).tolist()) == {0, 1, 2, 4, 5, 6, 7}  # class 2's samples go to nobody


def test_shares_are_disjoint_follow_each_clients_mix_and_derive_from_the_seed():
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 40, size=(7, 5)) * (rng.random((7, 5)) < 0.6)
    counts[0, :] = np.maximum(counts[0, :], 1)  # every class trained on by someone
    labels = rng.integers(0, 5, size=503)

    shares = local_shares(counts, labels, seed=1)

    everything = np.concatenate(shares)
    assert len(everything) == len(set(everything.tolist())) == len(labels)  # disjoint, covering the test set
    held = np.array([np.bincount(labels[share], minlength=5) for share in shares])  # [K, C]
    exact = np.bincount(labels, minlength=5) * counts / counts.sum(axis=0)  # n_c * N_kc / N_c
    assert np.all(np.abs(held - exact) < 1) and np.all(held[counts == 0] == 0)
    again, other = local_shares(counts, labels, seed=1), local_shares(counts, labels, seed=2)
    assert all(np.array_equal(a, b) for a, b in zip(shares, again, strict=True))
    assert any(not np.array_equal(a, b) for a, b in zip(shares, other, strict=True))
    assert [len(share) for share in other] == [len(share) for share in shares]  # the same sizes, dealt otherwise


@pytest.mark.parametrize(("counts", "labels", "message"), [
    (np.array([1, 2]), np.array([0]), "2-d integer array"),
    (np.array([[1.0, 2.0]]), np.array([0]), "2-d integer array"),
    (np.array([[1, -2]]), np.array([0]), "non-negative"),
    (np.array([[1, 2]]), np.array([0, 2]), "class 2 but train_counts has 2 classes"),
])
def test_bad_inputs_are_named_in_one_line(counts, labels, message):
    with pytest.raises(PartitionError, match=message):
        local_shares(counts, labels, seed=0)


def test_local_accuracy_weighs_by_share_size_counts_each_client_once_and_takes_the_10th_percentile():
    correct = np.array([1, 1, 0, 1, 0, 0, 1, 1, 1, 1], dtype=bool)
    shares = [np.array([0, 1, 2, 3]), np.array([4, 5]), np.array([6, 7, 8, 9]), np.array([], dtype=np.int64)]

    local = local_accuracy(correct, shares)

    assert local.weighted == 0.7 == correct.mean()  # (3 + 0 + 4) / 10: the shares cover the test set
    assert local.client_mean == pytest.approx((0.75 + 0.0 + 1.0) / 3)  # the empty share is left out
    assert local.p10 == pytest.approx(0.15)  # 0.0 + 0.2 * (0.75 - 0.0), numpy's linear interpolation
    assert local_accuracy(correct, [np.array([], dtype=np.int64)]) is None


def test_the_one_pass_gives_each_samples_correctness_on_any_number_of_workers():
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    x, y = torch.randn(37, 4), torch.randint(0, 3, (37,))

    one, two = (evaluate(model, x, y, 3, batch_size=8, workers=workers, per_sample=True) for workers in (1, 2))

    assert one.correct.dtype == np.bool_ and one.correct.shape == (37,)
    assert np.array_equal(one.correct, (model(x).argmax(dim=1) == y).numpy())
    assert np.array_equal(one.correct, two.correct)
    assert one.correct.mean() == one.accuracy and evaluate(model, x, y, 3, batch_size=8).correct is None


def test_the_record_logs_and_writes_the_local_accuracies_and_reads_a_record_written_before_them():
    names = RoundRecord.mlflow_metrics()
    assert names["local_accuracy"] == "eval/local_accuracy"
    assert names["local_accuracy_client_mean"] == "eval/local_accuracy_client_mean"
    assert names["local_accuracy_p10"] == "eval/local_accuracy_p10"
    assert RoundRecord.csv_columns()[:3] == ("round", "test_accuracy", "local_accuracy")
    old = {"round": 0, "test_accuracy": 0.5, "test_loss": 1.0, "train_loss": 0.5, "round_seconds": 2.0}
    new = {**old, "round": 1, "local_accuracy": 0.5, "local_accuracy_client_mean": 0.375, "local_accuracy_p10": 0.125}

    rows = list(csv.DictReader(io.StringIO(history_csv([old, new]))))

    assert rows[0]["local_accuracy"] == "" and rows[1]["local_accuracy_client_mean"] == "0.375"
    assert RoundRecord.mlflow_values(new)["eval/local_accuracy_p10"] == 0.125
    assert "eval/local_accuracy" not in RoundRecord.mlflow_values(old)


def test_the_final_local_accuracy_is_the_mean_of_the_last_rounds_and_none_for_an_older_history():
    history = [{"round": index, "test_accuracy": 0.5, "test_loss": 1.0, "train_loss": 0.5, "round_seconds": 1.0,
                "local_accuracy": value} for index, value in enumerate([0.0, 0.25, 0.5, 0.75, 0.5, 0.25, 0.5])]
    older = [{key: value for key, value in record.items() if key != "local_accuracy"} for record in history]

    summary = summarize(history)

    assert summary["final_local_accuracy"] == 0.5  # (0.5 + 0.75 + 0.5 + 0.25 + 0.5) / 5
    assert summarize(older)["final_local_accuracy"] is None
    assert summarize(older[:2] + history[2:])["final_local_accuracy"] == 0.5  # only the window counts
    assert split_summary(summary)[0]["final_local_accuracy"] == 0.5  # metrics/<exp>.json: the DVC metric


def test_the_report_sets_the_local_accuracy_beside_the_final_accuracy_with_a_dash_for_older_runs():
    entries = [{**metrics_entry("a", "FedAvg", LOW, 0.5), "final_local_accuracy": 0.25},
               metrics_entry("b", "FedCME(0.01)", LOW, 0.625)]  # written before the local accuracy

    lines = accuracy_table(entries, "final_accuracy", "final_local_accuracy").splitlines()

    assert lines[0] == f"| Method | {LOW} (%) | {LOW} local (%) |"
    assert lines[2] == "| FedAvg | 50.00 (1) | **25.00 (1)** |" and lines[3] == "| FedCME(0.01) | **62.50 (1)** | – |"
    rows = list(csv.DictReader(io.StringIO(summary_csv(entries, "g"))))
    assert [row["final_local_accuracy"] for row in rows] == ["0.25", ""]


def test_the_evaluate_step_scores_the_global_model_on_the_runs_test_shares(tmp_path):
    config = build_synthetic_config()  # 6 clients, 100 test samples, every class trained on
    run_dir = tmp_path / "run"
    prepare_run(config, run_dir)
    store.hold_aggregate(run_dir, 0, store.server_state(run_dir, 0, build_algorithm(config.algorithm).state_class))

    evaluation = evaluate_step(config, run_dir, 0)

    shares = run_test_shares(config, run_dir)
    assert len(shares) == 6 and sum(len(share) for share in shares) == 100  # the test set, dealt whole
    assert run_test_shares(config, run_dir) is shares  # once per process
    assert evaluation.local_accuracy == evaluation.test_accuracy  # weighted by share size: no new information
    # 6 clients: the 10th percentile lies between the two lowest, whose mean is at most the client mean.
    assert 0.0 <= evaluation.local_accuracy_p10 <= evaluation.local_accuracy_client_mean <= 1.0
