"""Tests of the results report (flows.report.build, flows.report.tables, flows.report.seed_stats, flows.report.figures)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedcme_core.results.metrics import history_csv, split_summary, with_content_hash
from flows.report.build import main, write_report
from flows.report.inputs import load_matching, load_metrics, matching_runs
from flows.report.compare import compare_table, curve_tables, summary_metrics
from flows.report.figures import FIGURE_DPI, matching_png, seed_band
from flows.report.published import published_table
from flows.report.tables import (
    ablation_entries,
    accuracy_table,
    paired_table,
    speed_table,
    where_fedcme_does_not_win,
)
from flows.report.build import cell_columns
from flows.report.seed_stats import ACCURACY_KEYS, CSV_COLUMNS, PairedDifference, SeedStats, p_text, summary_csv
from flows.names import experiment_name
from fedcme_core.config.params import params_from_dict
from fedcme_core.config.sections import PUBLISHED_MEASURES, PublishedFigure

from .conftest import REPO_ROOT

LOW = "FMNIST a=0.1 K=50 M=20"
HIGH = "FMNIST a=0.5 K=50 M=20"


def metrics_entry(experiment: str, method: str, setting: str, final_accuracy: float, seed: int = 0,
                  accuracy_at: list[float] | None = None, rounds_to_target: int | None = None,
                  group: str = "main") -> dict:
    """A metrics file's content: summarize() keys for a 10-round run plus the identity keys."""
    accuracy_at = accuracy_at or [final_accuracy] * 5
    return {
        "experiment": experiment, "method": method, "setting": setting, "group": group, "seed": seed,
        "method_name": method.lower(), "dataset": "fmnist", "alpha": 0.1 if setting == LOW else 0.5,
        "num_clients": 50, "clients_per_round": 20, "local_epochs": 2,
        "rounds": 10, "final_window": 5, "final_accuracy": final_accuracy, "final_loss": 1.0,
        "best_accuracy": max(accuracy_at), "best_round": 10,
        "accuracy_at": {f"{k}/5": value for k, value in enumerate(accuracy_at, start=1)},
        "target_accuracy": 0.6, "rounds_to_target": rounds_to_target, "total_seconds": 20.0,
    }


def grid_entries() -> list[dict]:
    """3 methods x 2 seeds in LOW, 2 methods x 1 seed in HIGH (FedProx not run there)."""
    return [
        metrics_entry("a-fedavg-low-s0", "FedAvg", LOW, 0.50, 0, [0.2, 0.35, 0.42, 0.48, 0.50]),
        metrics_entry("a-fedavg-low-s1", "FedAvg", LOW, 0.60, 1, [0.2, 0.45, 0.52, 0.58, 0.60], 5),
        metrics_entry("b-fedprox-low-s0", "FedProx(0.01)", LOW, 0.51, 0, [0.3, 0.45, 0.55, 0.60, 0.62], 4),
        metrics_entry("b-fedprox-low-s1", "FedProx(0.01)", LOW, 0.62, 1, [0.3, 0.45, 0.55, 0.60, 0.62], 4),
        metrics_entry("c-fedcme-low-s0", "FedCME(0.01)", LOW, 0.53, 0, [0.35, 0.5, 0.58, 0.61, 0.62], 3),
        metrics_entry("c-fedcme-low-s1", "FedCME(0.01)", LOW, 0.61, 1, [0.35, 0.5, 0.58, 0.61, 0.62], 5),
        metrics_entry("d-fedavg-high-s0", "FedAvg", HIGH, 0.7012, 0),
        metrics_entry("e-fedcme-high-s0", "FedCME(0.01)", HIGH, 0.725, 0, rounds_to_target=2),
    ]


def write_metrics_folder(folder: Path, entries: list[dict]) -> Path:
    """Each entry as the train stage writes it (<experiment>.json and about/<experiment>.json) plus a
    5-round <experiment>.csv along its accuracy_at."""
    (folder / "about").mkdir(parents=True, exist_ok=True)
    for entry in entries:
        results, about = split_summary(entry)
        (folder / f"{entry['experiment']}.json").write_text(json.dumps(results), encoding="utf-8")
        (folder / "about" / f"{entry['experiment']}.json").write_text(json.dumps(about), encoding="utf-8")
        history = [
            {"round": index, "test_accuracy": accuracy, "test_loss": 1.0, "train_loss": 0.5, "round_seconds": 1.0}
            for index, accuracy in enumerate(entry["accuracy_at"].values())
        ]
        (folder / f"{entry['experiment']}.csv").write_text(history_csv(history), encoding="utf-8")
    return folder


def matching_record(entry: dict, pairs_per_round: list[list[list[int]]]) -> dict:
    rounds = [{"round": r + 1, "pairs": pairs, "matched_cosine": 0.5 if pairs else None,
               "random_cosine": 0.8 if pairs else None} for r, pairs in enumerate(pairs_per_round)]
    return {key: entry[key] for key in ("experiment", "method", "setting", "group", "seed")} | {
        "class_counts": np.arange(40).reshape(4, 10).tolist(), "rounds": rounds}


def table_row(table: str, name: str) -> list[str]:
    row = next(line for line in table.splitlines() if line.startswith(f"| {name} |"))
    return [cell.strip() for cell in row.strip("|").split("|")][1:]


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


# ------------------------------------------------------------------------------- the written report
def test_write_report_writes_markdown_figures_and_csv(tmp_path):
    metrics = write_metrics_folder(tmp_path / "metrics", grid_entries())
    out = tmp_path / "reports"

    write_report(metrics, out / "results.md", out / "accuracy.png", output_csv=out / "results.csv", grid="g")

    markdown = (out / "results.md").read_text(encoding="utf-8")
    assert markdown.startswith("# FedCME results\n")
    assert "2 seeds (0, 1) in all" in markdown
    assert "## Final test accuracy (Table II form)\n\n" + accuracy_table(grid_entries(), "final_accuracy") in markdown
    assert speed_table(grid_entries(), LOW) in markdown and paired_table(grid_entries(), LOW) in markdown
    assert "![accuracy](accuracy.png)" in markdown
    assert "## Ablations" not in markdown and "![matching]" not in markdown
    assert "## Where FedCME does not win" in markdown
    # No ablation runs and no matching records: no figure for either (no placeholder).
    assert sorted(path.name for path in out.iterdir()) == ["accuracy.png", "results.csv", "results.md"]
    assert (out / "results.csv").read_text(encoding="utf-8") == summary_csv(grid_entries(), "g")
    assert (out / "accuracy.png").read_bytes().startswith(b"\x89PNG")


def test_a_figure_left_from_an_earlier_grid_with_nothing_to_draw_now_is_removed(tmp_path):
    metrics = write_metrics_folder(tmp_path / "metrics", grid_entries())
    stale = tmp_path / "accuracy-ablation.png"
    stale.write_bytes(b"\x89PNG old")

    write_report(metrics, tmp_path / "results.md", tmp_path / "accuracy.png")

    assert not stale.exists() and (tmp_path / "accuracy.png").is_file()


def test_accuracy_figure_is_at_least_1200_px_per_panel(tmp_path):
    metrics = write_metrics_folder(tmp_path / "metrics", grid_entries())

    write_report(metrics, tmp_path / "results.md", tmp_path / "accuracy.png")

    header = (tmp_path / "accuracy.png").read_bytes()[16:24]
    width, height = int.from_bytes(header[:4], "big"), int.from_bytes(header[4:], "big")
    assert width >= 2 * 1200 and height >= 800  # two settings side by side, legend outside


def test_write_report_with_ablations_links_their_figure(tmp_path):
    entries = [*grid_entries(), metrics_entry("z-ablation", "FedCME w/o exchange", LOW, 0.55, group="ablation")]
    metrics = write_metrics_folder(tmp_path / "metrics", entries)

    write_report(metrics, tmp_path / "out" / "results.md", tmp_path / "out" / "accuracy.png")

    markdown = (tmp_path / "out" / "results.md").read_text(encoding="utf-8")
    assert "## Ablations\n" in markdown and "![ablation](accuracy-ablation.png)" in markdown
    assert accuracy_table(ablation_entries(entries), "final_accuracy") in markdown


def test_matching_picture_uses_the_first_fedcme_method_and_setting_over_its_seeds(tmp_path):
    entries = grid_entries()
    metrics = write_metrics_folder(tmp_path / "metrics", entries)
    (metrics / "matching").mkdir()
    by_name = {entry["experiment"]: entry for entry in entries}
    for name, pairs in (("c-fedcme-low-s1", [[], [[0, 1]], [[2, 3]]]), ("c-fedcme-low-s0", [[], [[1, 2]], [[0, 3]]]),
                        ("e-fedcme-high-s0", [[], [[0, 1]]]), ("a-fedavg-low-s0", [[], []])):
        (metrics / "matching" / f"{name}.json").write_text(json.dumps(matching_record(by_name[name], pairs)))

    runs = matching_runs(load_matching(metrics), entries)
    write_report(metrics, tmp_path / "results.md", tmp_path / "accuracy.png")

    assert [run["experiment"] for run in runs] == ["c-fedcme-low-s0", "c-fedcme-low-s1"]
    markdown = (tmp_path / "results.md").read_text(encoding="utf-8")
    assert "## What the matching does" in markdown and "![matching](accuracy-matching.png)" in markdown
    picture = (tmp_path / "accuracy-matching.png").read_bytes()
    assert len(picture) > 50_000
    assert int.from_bytes(picture[16:20], "big") == 1200  # fits 1,200 px wide


def test_the_matching_picture_draws_at_most_five_pairs_a_round(tmp_path):
    entry = grid_entries()[4]
    many = [[[a, b] for a, b in zip(range(0, 30, 2), range(1, 30, 2))]]  # 15 pairs, as M=30 gives
    record = matching_record(entry, [[], *many, *many]) | {"class_counts": np.ones((30, 10)).tolist()}
    few = matching_record(entry, [[], [[0, 1]] * 5, [[2, 3]] * 5])

    header = matching_png([record])[16:24]
    width = int.from_bytes(header[:4], "big")

    assert width == int.from_bytes(matching_png([few])[16:20], "big")  # as wide as 5 pairs
    assert width <= 5 * 2.4 * FIGURE_DPI


def test_load_matching_names_a_record_without_its_rounds(tmp_path):
    (tmp_path / "matching").mkdir()
    (tmp_path / "matching" / "x.json").write_text(json.dumps({"experiment": "x", "method": "m", "setting": "s",
                                                              "seed": 0, "class_counts": []}))

    with pytest.raises(ValueError, match=r"x\.json: lacks the required key 'rounds'"):
        load_matching(tmp_path)


def test_command_line_writes_the_report_and_csv(tmp_path):
    metrics = write_metrics_folder(tmp_path / "metrics", grid_entries())
    arguments = ["--metrics", str(metrics), "--markdown", str(tmp_path / "results.md"),
                 "--png", str(tmp_path / "accuracy.png"), "--csv", str(tmp_path / "r.csv"), "--grid", "niid-bench"]

    assert main(arguments) == 0

    assert (tmp_path / "results.md").read_text(encoding="utf-8").startswith("# FedCME results: the niid-bench grid\n")
    assert (tmp_path / "r.csv").read_text(encoding="utf-8").splitlines()[1].startswith("niid-bench,fedavg,FedAvg,")


def test_command_line_names_a_bad_folder_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--metrics", str(tmp_path / "absent"), "--markdown", str(tmp_path / "r.md"), "--png", str(tmp_path / "a.png")])

    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'absent'}: metrics folder not found\n"
    assert not (tmp_path / "r.md").exists()


def figure(method: str, alpha: float, accuracy: float, measure: str = "final_accuracy") -> tuple[str, PublishedFigure]:
    """(label, figure): the label is the method's, as the grid file's methods section gives it."""
    return method.upper(), PublishedFigure(method=method, dataset="fmnist", partition=f"a{alpha}", clients=(50, 20),
                                           measure=measure, accuracy=accuracy, source=f"paper of {method}")


def test_published_figures_sit_beside_ours_with_the_gap_and_the_bound():
    table = published_table(grid_entries(), [
        figure("fedavg", 0.1, 68.2),  # ours 55.00 ± 7.07 (2): bound max(14.14, 2.5)
        figure("fedcme(0.01)", 0.5, 76.0),  # ours 72.50 (1): bound 2.5
        figure("fedprox(0.01)", 0.1, 44.0, "accuracy_at_2T5"),  # ours at round 2/5: 45.00 ± 0.00 (2)
        figure("fedprox(0.01)", 0.5, 70.0),  # FedProx did not run in HIGH
    ])

    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| Method")]
    assert table_row(table, "FEDAVG") == [LOW, "final (mean of the last rounds)", "55.00 ± 7.07 (2)", "68.20",
                                          "-13.20", "yes", "paper of fedavg"]
    assert table_row(table, "FEDCME(0.01)")[2:6] == ["72.50 (1)", "76.00", "-3.50", "no: below by more than 2.50"]
    assert rows[2].split(" | ")[1:7] == [LOW, "at 2T/5", "45.00 ± 0.00 (2)", "44.00", "+1.00", "yes"]
    assert rows[3].split(" | ")[:4] == ["| FEDPROX(0.01)", HIGH.replace("a=", "α="), "final (mean of the last rounds)", "–"]
    assert "not run yet" in rows[3]


def test_command_line_sets_the_grid_files_published_figures_beside_ours(tmp_path):
    entry = metrics_entry("cifar10-a0.5-k10m10-fedavg-s0", "FedAvg", "CIFAR-10 α=0.5 K=10 M=10", 0.6612)
    entry.update(dataset="cifar10", alpha=0.5, num_clients=10, clients_per_round=10)
    metrics = write_metrics_folder(tmp_path / "metrics", [entry])
    arguments = ["--metrics", str(metrics), "--markdown", str(tmp_path / "results.md"), "--png", str(tmp_path / "a.png"),
                 "--params", str(REPO_ROOT / "configs" / "params-niid-bench.yaml")]

    assert main(arguments) == 0

    report = (tmp_path / "results.md").read_text(encoding="utf-8")
    section = report.split("## Beside the published figures\n")[1].split("\n## ")[0]
    assert table_row(section, "FedAvg")[2:6] == ["66.12 (1)", "68.20", "-2.08", "yes"]
    assert "| SCAFFOLD | CIFAR-10 α=0.5 K=10 M=10 |" in section and "69.80 | – | not run yet" in section


def test_a_report_without_published_figures_has_no_such_section(tmp_path):
    write_report(write_metrics_folder(tmp_path / "m", grid_entries()), tmp_path / "r.md", tmp_path / "a.png")

    assert "published" not in (tmp_path / "r.md").read_text(encoding="utf-8")


# ------------------------------------------------------------------------------- reading metrics
def test_load_metrics_reads_files_sorted_by_name(tmp_path):
    entries = grid_entries()
    write_metrics_folder(tmp_path, list(reversed(entries)))

    assert load_metrics(tmp_path) == entries


def test_a_results_file_holds_numbers_only_and_reads_back_joined_with_its_about_file(tmp_path):
    entry = with_content_hash(metrics_entry("split", "FedAvg", LOW, 0.5, rounds_to_target=3))
    write_metrics_folder(tmp_path, [entry])

    results = json.loads((tmp_path / "split.json").read_text())
    about = json.loads((tmp_path / "about" / "split.json").read_text())
    # Only what compares in `dvc metrics show`: four columns; the rest is in the about file.
    assert results == {"final_accuracy": 0.5, "best_accuracy": entry["best_accuracy"],
                       "rounds_to_target": 3, "accuracy_at": {"2/5": entry["accuracy_at"]["2/5"]}}
    assert about["method"] == "FedAvg" and about["content_sha256"] == entry["content_sha256"]
    assert about["accuracy_at"] == entry["accuracy_at"] and "final_accuracy" not in about
    assert load_metrics(tmp_path) == [entry]


def test_a_metrics_file_written_in_one_piece_reads_as_before(tmp_path):
    entry = with_content_hash(metrics_entry("whole", "FedAvg", LOW, 0.5))
    (tmp_path / "whole.json").write_text(json.dumps(entry), encoding="utf-8")

    assert load_metrics(tmp_path) == [entry]


def test_a_results_file_without_its_about_file_is_named(tmp_path):
    write_metrics_folder(tmp_path, [metrics_entry("orphan", "FedAvg", LOW, 0.5)])
    (tmp_path / "about" / "orphan.json").unlink()

    with pytest.raises(ValueError, match=r"orphan\.json: lacks the required key 'experiment' \(and .*about/orphan\.json is missing\)"):
        load_metrics(tmp_path)


def test_an_edited_about_file_is_named_by_the_content_hash(tmp_path):
    write_metrics_folder(tmp_path, [with_content_hash(metrics_entry("moved", "FedAvg", LOW, 0.5))])
    about = tmp_path / "about" / "moved.json"
    about.write_text(about.read_text().replace('"seed": 0', '"seed": 1'), encoding="utf-8")

    with pytest.raises(ValueError, match=r"moved\.json: content hash mismatch"):
        load_metrics(tmp_path)


# ------------------------------------------------------------------------------- what DVC shows
def test_the_summary_metric_is_each_methods_mean_accuracies_as_fractions_in_the_experiments_columns():
    summary = summary_metrics(grid_entries())

    # FedAvg: (0.50 + 0.60 + 0.7012) / 3; FedProx: (0.51 + 0.62) / 2; FedCME: (0.53 + 0.61 + 0.725) / 3.
    assert {name: row["final_accuracy"] for name, row in summary.items()} == {
        "fedavg": 0.600400, "fedprox(0.01)": 0.565, "fedcme(0.01)": 0.621667}
    assert all(set(row) <= {"final_accuracy", "best_accuracy", "accuracy_at"} for row in summary.values())


def test_write_report_writes_one_summary_file_per_method_and_removes_stale_ones(tmp_path):
    metrics = write_metrics_folder(tmp_path / "metrics", grid_entries())
    (tmp_path / "summary").mkdir()
    (tmp_path / "summary" / "gone.json").write_text("{}")

    write_report(metrics, tmp_path / "r.md", tmp_path / "a.png", output_summary=tmp_path / "summary")

    assert sorted(path.name for path in (tmp_path / "summary").iterdir()) == [
        "fedavg.json", "fedcme(0.01).json", "fedprox(0.01).json"]
    assert json.loads((tmp_path / "summary" / "fedavg.json").read_text())["final_accuracy"] == 0.6004


COMPARE_CSV = """Experiment,rev,Created,reports/summary/fedavg.json:final_accuracy,reports/summary/fedcme-mu001.json:final_accuracy,base.training.batch_size
,workspace,,0.7012,0.71234,32
,main,2026-12-05T20:15:35,!,!,64
exp-1a2b3,1a2b3c4,2026-12-05T21:00:00,0.69,0.7,16
"""


def test_make_compare_shows_each_method_in_percent_and_says_why_a_commit_has_no_row():
    lines = compare_table(COMPARE_CSV).splitlines()

    assert lines[0].startswith("Not shown: main: no results in that commit (reports/ is not committed")
    assert lines[1].split() == ["Experiment", "Created", "fedavg", "(%)", "fedcme-mu001", "(%)",
                                "base.training.batch_size"]
    assert lines[2].split() == ["workspace", "-", "70.12", "71.23", "32"]
    assert lines[3].split() == ["exp-1a2b3", "2026-12-05", "21:00", "69.00", "70.00", "16"]
    assert len(lines) == 4


def test_the_overlay_tables_give_each_setting_every_method_per_round_in_percent(tmp_path):
    entries = grid_entries() + [metrics_entry("f-noexchange-low-s0", "FedCME w/o exchange", LOW, 0.5,
                                              accuracy_at=[0.1, 0.2, 0.3, 0.4, 0.5], group="ablation")]
    tables = curve_tables(entries, write_metrics_folder(tmp_path, entries))

    assert sorted(tables) == ["fmnist-a0.1-k50m20-ablation.csv", "fmnist-a0.1-k50m20.csv", "fmnist-a0.5-k50m20.csv"]
    rows = list(csv.DictReader(io.StringIO(tables["fmnist-a0.1-k50m20.csv"])))
    assert [row["method"] for row in rows] == ["FedAvg"] * 5 + ["FedProx(0.01)"] * 5 + ["FedCME(0.01)"] * 5
    second = rows[1]  # FedAvg round 2: seeds 0.35 and 0.45
    assert (second["round"], float(second["accuracy"]), float(second["accuracy_min"]),
            float(second["accuracy_max"]), second["seeds"]) == ("2", 40.0, 35.0, 45.0, "2")
    assert {row["setting"] for row in rows} == {LOW}  # the chart's title: the setting in words
    ablation = list(csv.DictReader(io.StringIO(tables["fmnist-a0.1-k50m20-ablation.csv"])))
    assert sorted({row["method"] for row in ablation}) == ["FedCME w/o exchange", "FedCME(0.01)"]
    assert [float(row["accuracy"]) for row in ablation if row["method"] == "FedCME w/o exchange"] == [
        10.0, 20.0, 30.0, 40.0, 50.0]


def test_a_labels_per_client_run_is_named_by_its_tag_in_the_tables_and_beside_published_figures(tmp_path):
    entry = {**metrics_entry("fmnist-c2-k50m20-fedavg-s0", "FedAvg", "FMNIST #C=2 K=50 M=20", 0.4),
             "partition": "c2", "alpha": None}
    published = ("FedAvg", PublishedFigure(method="fedavg", dataset="fmnist", partition="c2", clients=(50, 20),
                                           accuracy=49.8, source="NIID-Bench"))

    tables = curve_tables([entry], write_metrics_folder(tmp_path, [entry]))
    row = table_row(published_table([entry], [published]), "FedAvg")

    assert sorted(tables) == ["fmnist-c2-k50m20.csv"]
    assert row[:2] == ["FMNIST #C=2 K=50 M=20", "final (mean of the last rounds)"] and row[4] == "-9.80"
    assert list(csv.DictReader(io.StringIO(summary_csv([entry], "g"))))[0]["alpha"] == ""


def test_load_metrics_names_a_file_that_is_not_json(tmp_path):
    write_metrics_folder(tmp_path, grid_entries())
    (tmp_path / "broken.json").write_text("{not json", encoding="utf-8")

    with pytest.raises(ValueError, match="broken.json"):
        load_metrics(tmp_path)


@pytest.mark.parametrize("key", ["method", "seed"])
def test_load_metrics_names_the_file_and_the_missing_key(tmp_path, key):
    entry = metrics_entry("incomplete", "FedAvg", LOW, 0.5)
    del entry[key]
    (tmp_path / "incomplete.json").write_text(json.dumps(entry), encoding="utf-8")

    with pytest.raises(ValueError, match=rf"incomplete\.json.*'{key}'"):
        load_metrics(tmp_path)


def test_load_metrics_names_an_edited_file_by_its_content_hash(tmp_path):
    entry = with_content_hash(metrics_entry("edited", "FedAvg", LOW, 0.5))
    (tmp_path / "intact.json").write_text(json.dumps(entry), encoding="utf-8")
    assert load_metrics(tmp_path) == [entry]

    (tmp_path / "edited.json").write_text(json.dumps({**entry, "final_accuracy": 0.99}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"edited\.json: content hash mismatch"):
        load_metrics(tmp_path)


def test_a_grid_without_fedcme_claims_no_win_and_a_lone_reference_has_nothing_to_pair():
    entries = [metrics_entry("a", "FedAvg", LOW, 0.5)]

    assert where_fedcme_does_not_win(entries) == (
        "No setting of this grid has both a FedCME run and another method's yet: nothing to compare.\n")
    assert paired_table(entries, LOW) == "_No method besides FedAvg in this setting yet._\n"


def test_every_measure_a_published_figure_may_name_is_a_column_of_the_summary_csv():
    assert set(PUBLISHED_MEASURES) == set(ACCURACY_KEYS) and set(ACCURACY_KEYS) <= set(CSV_COLUMNS)
