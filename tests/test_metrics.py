"""Tests of fedcme_core.results.metrics: run summaries (Table II / III forms) and the per-round CSV."""

from __future__ import annotations

import json

import pytest

from fedcme_core.results.metrics import history_csv, split_summary, summarize, with_content_hash

# Accuracies and losses are multiples of 1/8, so sums are exact and each mean is the
# correctly rounded quotient: the same float as the decimal literal in the assertions.
TEN_ROUND_ACCURACIES = [0.125, 0.25, 0.375, 0.25, 0.5, 0.625, 0.875, 0.625, 0.875, 0.75]
TEN_ROUND_TEST_LOSSES = [2.0, 1.75, 1.5, 1.5, 1.25, 1.0, 0.75, 1.0, 0.5, 0.75]


def make_history(accuracies: list[float], test_losses: list[float] | None = None, seconds: float = 1.5) -> list[dict]:
    test_losses = test_losses or [1.0] * len(accuracies)
    return [
        {
            "round": round_index,
            "test_accuracy": accuracy,
            "test_loss": test_loss,
            "train_loss": test_loss / 2,
            "round_seconds": seconds,
        }
        for round_index, (accuracy, test_loss) in enumerate(zip(accuracies, test_losses))
    ]


def test_summary_of_ten_rounds():
    # Prepare
    history = make_history(TEN_ROUND_ACCURACIES, TEN_ROUND_TEST_LOSSES)

    # Execute
    summary = summarize(history, target_accuracy=0.6)

    # Assert
    assert summary["rounds"] == 10
    assert summary["final_accuracy"] == 0.75  # (0.625 + 0.875 + 0.625 + 0.875 + 0.75) / 5
    assert summary["final_loss"] == 0.8  # (1.0 + 0.75 + 1.0 + 0.5 + 0.75) / 5
    assert summary["best_accuracy"] == 0.875
    assert summary["best_round"] == 7  # first reached at record round 6, i.e. after 7 rounds
    assert summary["accuracy_at"] == {"1/5": 0.25, "2/5": 0.25, "3/5": 0.625, "4/5": 0.625, "5/5": 0.75}
    assert list(summary["accuracy_at"]) == ["1/5", "2/5", "3/5", "4/5", "5/5"]
    assert summary["target_accuracy"] == 0.6
    assert summary["rounds_to_target"] == 6  # 0.625 at record round 5
    assert summary["total_seconds"] == 15.0


def test_summary_is_json_ready():
    # Prepare
    history = make_history(TEN_ROUND_ACCURACIES, TEN_ROUND_TEST_LOSSES)

    # Execute
    summary = summarize(history, target_accuracy=0.6)

    # Assert
    assert json.loads(json.dumps(summary)) == summary


@pytest.mark.parametrize(
    ("target_accuracy", "expected_rounds"),
    [(0.5, 5), (0.625, 6), (0.125, 1), (0.9, None), (None, None)],
)
def test_rounds_to_target(target_accuracy, expected_rounds):
    # Prepare
    history = make_history(TEN_ROUND_ACCURACIES)

    # Execute
    summary = summarize(history, target_accuracy=target_accuracy)

    # Assert
    assert summary["rounds_to_target"] == expected_rounds
    assert summary["target_accuracy"] == target_accuracy


def test_records_out_of_order_are_sorted_by_round():
    # Prepare
    history = make_history(TEN_ROUND_ACCURACIES, TEN_ROUND_TEST_LOSSES)
    shuffled = [history[index] for index in (3, 9, 0, 7, 1, 5, 2, 8, 6, 4)]

    # Execute
    summary = summarize(shuffled, target_accuracy=0.6)

    # Assert
    assert summary == summarize(history, target_accuracy=0.6)


def test_short_history_uses_every_round_as_window():
    # Prepare
    history = make_history([0.25, 0.5, 0.75], [1.5, 1.0, 0.5])

    # Execute
    summary = summarize(history)

    # Assert
    assert summary["final_accuracy"] == 0.5
    assert summary["final_loss"] == 1.0
    # T = 3: after rounds ceil(3k/5) = 1, 2, 2, 3, 3.
    assert summary["accuracy_at"] == {"1/5": 0.25, "2/5": 0.5, "3/5": 0.5, "4/5": 0.75, "5/5": 0.75}


def test_window_and_fractions_are_options():
    # Prepare
    history = make_history(TEN_ROUND_ACCURACIES)

    # Execute
    summary = summarize(history, final_window=2, fractions=2)

    # Assert
    assert summary["final_accuracy"] == 0.8125  # (0.875 + 0.75) / 2
    assert summary["accuracy_at"] == {"1/2": 0.5, "2/2": 0.75}


def test_empty_history_is_an_error():
    # Prepare
    history: list[dict] = []

    # Execute / Assert
    with pytest.raises(ValueError, match="history is empty"):
        summarize(history)


def test_duplicate_round_is_an_error_naming_it():
    # Prepare
    history = make_history([0.25, 0.5, 0.75, 0.5])
    history[3]["round"] = 2

    # Execute / Assert
    with pytest.raises(ValueError, match="round 2"):
        summarize(history)


def test_missing_round_is_an_error_naming_it():
    # Prepare
    history = make_history([0.25, 0.5, 0.75])
    history[1]["round"] = 5

    # Execute / Assert
    with pytest.raises(ValueError, match="lacks round 1"):
        summarize(history)


def test_history_csv_of_two_rounds():
    # Prepare
    history = [
        {"round": 1, "test_accuracy": 0.625, "test_loss": 1.0, "train_loss": 1 / 3, "round_seconds": 2.5},
        {"round": 0, "test_accuracy": 0.5, "test_loss": 1.25, "train_loss": 0.1, "round_seconds": 2},
    ]

    # Execute
    text = history_csv(history)

    # Assert
    assert text == (  # records written before the local accuracies: their cells empty
        "round,test_accuracy,local_accuracy,local_accuracy_client_mean,local_accuracy_p10,test_loss,train_loss,"
        "round_seconds\n"
        "1,0.5,,,,1.25,0.1,2.0\n"
        "2,0.625,,,,1.0,0.3333333333333333,2.5\n"
    )


def test_split_summary_keeps_five_compared_figures_in_the_results_file_and_joins_back():
    history = [{"round": r, "test_accuracy": 0.1 * (r + 1), "test_loss": 1.0, "train_loss": 0.5, "round_seconds": 2.0}
               for r in range(10)]
    entry = with_content_hash({**summarize(history, target_accuracy=0.5), "experiment": "e", "seed": 0})

    results, about = split_summary(entry)

    assert results == {"final_accuracy": pytest.approx(0.8), "final_local_accuracy": None, "best_accuracy": 1.0,
                       "rounds_to_target": 5, "accuracy_at": {"2/5": 0.4}}
    assert {"best_round", "final_loss", "rounds", "total_seconds", "experiment", "content_sha256"} <= set(about)
    assert about["accuracy_at"] == entry["accuracy_at"]
    assert {**results, **about} == entry
