"""Tests of the report's numbers: seed statistics and the tables (flows.report.seed_stats, flows.report.tables)."""

from __future__ import annotations

import csv
import io

import pytest
import yaml

from flows.report.figures import seed_band
from flows.report.tables import (
    ablation_entries,
    accuracy_table,
    paired_table,
    speed_table,
    where_fedcme_does_not_win,
)
from flows.report.build import cell_columns
from flows.report.build import compute_description
from flows.report.seed_stats import ACCURACY_KEYS, CSV_COLUMNS, PairedDifference, SeedStats, p_text, summary_csv
from flows.tracking.names import experiment_name
from fedcme_core.config.params import params_from_dict
from fedcme_core.config.sections import PUBLISHED_MEASURES

from .conftest import REPO_ROOT
from .report_helpers import HIGH, LOW, grid_entries, metrics_entry, table_row


# ---------------------------------------------------------------------------- seed statistics
def test_seed_stats_mean_and_sample_std():
    summary = SeedStats({0: 0.5, 1: 0.6, 2: 0.7})

    assert summary.n == 3 and summary.mean == pytest.approx(0.6)
    assert summary.std == pytest.approx(0.1)  # sqrt(((-0.1)^2 + 0 + 0.1^2) / 2)
    assert SeedStats({4: 0.5}).std is None


def test_paired_difference_wins_and_t_test_by_hand():
    difference = PairedDifference({0: 0.01, 1: 0.02, 2: -0.03})
    assert (difference.wins, difference.losses, difference.n) == (2, 1, 3)

    # d = (1, 2, 3) points: mean 2, sd 1, t = 2 / (1 / sqrt 3) = 3.464 with 2 df: p = 0.0742.
    assert PairedDifference({0: 0.01, 1: 0.02, 2: 0.03}).p_value == pytest.approx(0.07418, abs=1e-5)
    assert PairedDifference({0: 0.01}).p_value is None
    assert PairedDifference({0: 0.01, 1: 0.03}).p_value is None  # two seeds: no p-value (one degree of freedom)
    assert p_text(PairedDifference({0: 0.01, 1: 0.03})) == "n<3"
    assert p_text(PairedDifference({0: 0.01, 1: 0.02, 2: 0.03})) == "0.074"
    assert PairedDifference({0: 0.0, 1: 0.0}).p_value is None  # identical methods: no test


def test_a_demonstrated_win_is_every_seed_at_p_below_005():
    # d = (2, 2.1, 1.9) points: mean 2, sd 0.1, t = 34.6 with 2 df: p = 0.0008.
    assert PairedDifference({0: 0.02, 1: 0.021, 2: 0.019}).demonstrated
    assert not PairedDifference({0: 0.01, 1: 0.02, 2: 0.03}).demonstrated  # every seed, but p = 0.074
    assert not PairedDifference({0: 0.05, 1: 0.051, 2: -0.001}).demonstrated  # one seed lost
    assert not PairedDifference({0: 0.5}).demonstrated  # one seed: no test


# ------------------------------------------------------------------------------------- tables
def test_table_ii_gives_mean_std_and_n_per_cell():
    table = accuracy_table(grid_entries(), "final_accuracy")

    assert table.splitlines()[0] == f"| Method | {LOW} (%) | {HIGH} (%) |"
    assert table_row(table, "FedAvg") == ["55.00 ± 7.07 (2)", "70.12 (1)"]
    assert table_row(table, "FedProx(0.01)") == ["56.50 ± 7.78 (2)", "–"]
    assert table_row(table, "FedCME(0.01)") == ["**57.00 ± 5.66 (2)**", "**72.50 (1)**"]


def test_table_ii_bolds_every_tied_best_mean():
    entries = [metrics_entry("a", "FedAvg", LOW, 0.6), metrics_entry("b", "FedCME(0.01)", LOW, 0.6)]

    table = accuracy_table(entries, "final_accuracy")

    assert table_row(table, "FedAvg") == ["**60.00 (1)**"] and table_row(table, "FedCME(0.01)") == ["**60.00 (1)**"]


def test_table_ii_rejects_two_runs_of_one_cell_and_seed():
    entries = [metrics_entry("one", "FedAvg", LOW, 0.5), metrics_entry("two", "FedAvg", LOW, 0.6)]

    with pytest.raises(ValueError, match=r"'one' and 'two' are both method 'FedAvg'.*seed 0"):
        accuracy_table(entries, "final_accuracy")


def test_table_iii_gives_fractions_over_seeds_and_rounds_to_target():
    table = speed_table(grid_entries(), LOW)

    assert table.splitlines()[0] == ("| Method | 1/5 T (%) | 2/5 T (%) | 3/5 T (%) | 4/5 T (%) | last round (T) (%) "
                                     "| rounds to target |")
    assert table_row(table, "FedAvg") == ["20.00 ± 0.00 (2)", "40.00 ± 7.07 (2)", "47.00 ± 7.07 (2)",
                                          "53.00 ± 7.07 (2)", "55.00 ± 7.07 (2)", "5 (1/2)"]
    assert table_row(table, "FedProx(0.01)")[-1] == "**4**"
    assert table_row(table, "FedCME(0.01)")[0] == "**35.00 ± 0.00 (2)**"
    assert table_row(table, "FedCME(0.01)")[-1] == "**4**"  # (3 + 5) / 2; FedProx's 4 ties it


def test_paired_table_against_fedavg():
    table = paired_table(grid_entries(), LOW)

    # FedCME - FedAvg: seed 0 +3, seed 1 +1 points: mean +2, sd 1.41; two seeds give no p-value (t on 1 df).
    assert table_row(table, "FedCME(0.01)") == ["+2.00 ± 1.41", "2", "2", "n<3"]
    assert table_row(table, "FedProx(0.01)") == ["+1.50 ± 0.71", "2", "2", "n<3"]
    assert "FedAvg |" not in table.split("\n", 2)[2]


def test_paired_table_without_the_reference_says_so():
    entries = [metrics_entry("c", "FedCME(0.01)", LOW, 0.5)]

    assert paired_table(entries, LOW) == "_No FedAvg run in this setting to pair with._\n"


def test_where_fedcme_does_not_win_lists_losses_and_unproven_wins():
    entries = grid_entries()
    entries[3]["final_accuracy"] = 0.64  # FedProx seed 1 now beats FedCME on average (0.575 vs 0.57)

    text = where_fedcme_does_not_win(entries)

    loss = f"- {LOW}: FedCME(0.01) vs FedProx(0.01): -0.50 ± 3.54 points, won 1 of 2 seeds, n<3, no p-value"
    unproven = f"- {LOW}: FedCME(0.01) vs FedAvg: +2.00 ± 1.41 points, won 2 of 2 seeds, n<3, no p-value"
    assert loss in text.split("Ahead on average")[0]
    assert unproven in text.split("Ahead on average")[1]
    assert f"- {HIGH}: FedCME(0.01) vs FedAvg: +2.38 points, won 1 of 1 seeds, n<3, no p-value" in text


def test_where_fedcme_does_not_win_when_it_wins_everywhere_significantly():
    entries = [metrics_entry(f"a{s}", "FedAvg", LOW, 0.5 + s / 100, s) for s in range(3)]
    entries += [metrics_entry(f"c{s}", "FedCME(0.01)", LOW, 0.6 + s / 100 + (s == 1) / 1000, s) for s in range(3)]

    text = where_fedcme_does_not_win(entries)

    assert text == "In every setting with both, the best FedCME variant is ahead of every other method on average.\n"


def test_ablation_entries_put_fedcme_references_first():
    entries = [*grid_entries(), metrics_entry("z-ablation", "FedCME w/o exchange", LOW, 0.55, group="ablation")]

    methods = [(entry["method"], entry["setting"]) for entry in ablation_entries(entries)]

    assert methods == [("FedCME(0.01)", LOW), ("FedCME(0.01)", LOW), ("FedCME w/o exchange", LOW)]


def test_summary_csv_has_one_row_per_experiment_with_the_named_columns():
    rows = list(csv.DictReader(io.StringIO(summary_csv(grid_entries(), "default"))))

    assert tuple(rows[0]) == CSV_COLUMNS
    assert len(rows) == 8
    first = rows[0]
    assert (first["grid"], first["method"], first["label"], first["seed"]) == ("default", "fedavg", "FedAvg", "0")
    assert float(first["final_accuracy"]) == 0.5 and float(first["accuracy_at_2T5"]) == 0.35
    assert (first["alpha"], first["num_clients"], first["clients_per_round"], first["rounds"]) == ("0.1", "50", "20", "10")
    assert first["partition"] == first["classifier_layers"] == first["align_loss"] == ""  # no grid file's configs given
    assert first["compute"] == first["device"] == first["machine"] == ""  # not recorded by these entries


def test_summary_csv_and_report_name_the_compute_each_run_records():
    entries = grid_entries()
    entries[0] = {**entries[0], "compute": "channels_last+fp32", "device": "cpu", "machine": "Intel Xeon"}
    entries[1] = {**entries[1], "compute": "channels_last+fp32", "device": "cpu", "machine": "Intel Xeon"}

    rows = {row["experiment"] if "experiment" in row else i: row
            for i, row in enumerate(csv.DictReader(io.StringIO(summary_csv(entries, "default"))))}
    recorded = [row for row in rows.values() if row["compute"]]

    assert [(row["compute"], row["device"], row["machine"]) for row in recorded] == [
        ("channels_last+fp32", "cpu", "Intel Xeon")] * 2
    assert compute_description(entries) == (
        "Computed with (layout and precision, device, machine): channels_last+fp32 on cpu (Intel Xeon): 2 runs; "
        "not recorded in the run (see the grid's NOTE): 6 runs.\n")


def test_summary_csv_says_what_trained_each_row_from_the_grid_files_cell_configs():
    values = yaml.safe_load((REPO_ROOT / "params.yaml").read_text(encoding="utf-8"))
    values["methods"]["fedcme-l2"] = {"name": "fedcme", "mu": 0.01, "align_loss": "sample",
                                      "exchange_optimizer": "swap",
                                      "setup": {"model.classifier_layers": 2, "data.augment": "crop_flip"}}
    values["grid"].update(partitions=["a1.0", "c2"], methods=["fedavg", "fedcme-mu001", "fedcme-l2"], seeds=[0])
    params = params_from_dict(values)
    entries = []
    for cell in params.all_cells():
        entry = metrics_entry(experiment_name(*cell), cell[0], cell[2], 0.5)
        alpha = 1.0 if cell[2] == "a1.0" else None
        entries.append({**entry, "method_name": cell[0], "partition": cell[2], "alpha": alpha})

    rows = {(row["method"], row["partition"]): row
            for row in csv.DictReader(io.StringIO(summary_csv(entries, "g", cell_columns(params))))}

    readings = ("partition", "alpha", "local_epochs", "classifier_layers", "augment", "align_loss", "align_reduction",
                "exchange_optimizer", "feature_weights")
    assert [rows["fedavg", "dirichlet(1.0)"][key] for key in readings] == [
        "dirichlet(1.0)", "1.0", "2", "1", "none", "", "", "", ""]
    assert [rows["fedcme-mu001", "labels_per_client(2)"][key] for key in readings] == [
        "labels_per_client(2)", "", "2", "1", "none", "class_mean", "mean", "reset", "samples"]
    assert [rows["fedcme-l2", "dirichlet(1.0)"][key] for key in readings] == [
        "dirichlet(1.0)", "1.0", "2", "2", "crop_flip", "sample", "mean", "swap", "samples"]
    assert len(rows) == 6


def test_seed_band_is_mean_min_max_on_common_rounds():
    rounds, mean, low, high = seed_band([([1, 2, 3], [0.1, 0.2, 0.3]), ([1, 2], [0.3, 0.4])])

    assert rounds.tolist() == [1, 2]
    assert mean == pytest.approx([0.2, 0.3]) and low.tolist() == [0.1, 0.2] and high.tolist() == [0.3, 0.4]


def test_a_grid_without_fedcme_claims_no_win_and_a_lone_reference_has_nothing_to_pair():
    entries = [metrics_entry("a", "FedAvg", LOW, 0.5)]

    assert where_fedcme_does_not_win(entries) == (
        "No setting of this grid has both a FedCME run and another method's yet: nothing to compare.\n")
    assert paired_table(entries, LOW) == "_No method besides FedAvg in this setting yet._\n"


def test_every_measure_a_published_figure_may_name_is_a_column_of_the_summary_csv():
    assert set(PUBLISHED_MEASURES) == set(ACCURACY_KEYS) and set(ACCURACY_KEYS) <= set(CSV_COLUMNS)
