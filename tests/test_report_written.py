"""Tests of the written report: Markdown, figures, CSV, the command line and published figures (flows.report.build, flows.report.figures, flows.report.published)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flows.report.build import main, write_report
from flows.report.inputs import load_matching, matching_runs
from flows.report.figures import FIGURE_DPI, matching_png
from flows.report.published import published_table
from flows.report.tables import ablation_entries, accuracy_table, paired_table, speed_table
from flows.report.seed_stats import summary_csv
from fedcme_core.config.sections import PublishedFigure

from .conftest import REPO_ROOT
from .report_helpers import HIGH, LOW, grid_entries, matching_record, metrics_entry, table_row, write_metrics_folder


# ------------------------------------------------------------------------------- the written report
def test_write_report_writes_markdown_figures_and_csv(tmp_path):
    metrics = write_metrics_folder(tmp_path / "metrics", grid_entries())
    out = tmp_path / "reports"

    write_report(metrics, out / "results.md", out / "accuracy.png", output_csv=out / "results.csv", grid="g")

    markdown = (out / "results.md").read_text(encoding="utf-8")
    assert markdown.startswith("# FedCME results\n")
    assert "2 seeds (0, 1) in all" in markdown
    assert "## Final test accuracy (Table II form)\n\n" + accuracy_table(grid_entries(), "final_accuracy", "final_local_accuracy") in markdown
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
