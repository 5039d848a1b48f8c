"""Tests of flows.report: Table II / III Markdown forms, figures and the written report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedcme_core.metrics import history_csv, with_content_hash
from flows.report import (
    ablation_table,
    load_metrics,
    main,
    results_table,
    settings_where_fedcme_does_not_win,
    speed_table,
    write_report,
)

LOW_ALPHA = "FMNIST a=0.1 K=50 M=20"
HIGH_ALPHA = "FMNIST a=0.5 K=50 M=20"


def metrics_entry(
    experiment: str,
    method: str,
    setting: str,
    final_accuracy: float,
    accuracy_at: list[float] | None = None,
    rounds_to_target: int | None = None,
    group: str = "main",
) -> dict:
    """A metrics file's content: summarize() keys for a 10-round run plus the identifying keys."""
    accuracy_at = accuracy_at or [final_accuracy] * 5
    return {
        "experiment": experiment,
        "method": method,
        "setting": setting,
        "group": group,
        "rounds": 10,
        "final_window": 5,
        "final_accuracy": final_accuracy,
        "final_loss": 1.0,
        "best_accuracy": max(accuracy_at),
        "best_round": 10,
        "accuracy_at": {f"{k}/5": value for k, value in enumerate(accuracy_at, start=1)},
        "target_accuracy": 0.6,
        "rounds_to_target": rounds_to_target,
        "total_seconds": 20.0,
    }


def grid_entries() -> list[dict]:
    """3 methods x 2 settings; FedProx(0.01) is not run in HIGH_ALPHA; a tie in LOW_ALPHA."""
    return [
        metrics_entry("a-fedavg-low", "FedAvg", LOW_ALPHA, 0.5, [0.2, 0.35, 0.42, 0.48, 0.5]),
        metrics_entry("b-fedprox-low", "FedProx(0.01)", LOW_ALPHA, 0.6183, [0.3, 0.45, 0.55, 0.6, 0.62], 8),
        metrics_entry("c-fedcme-low", "FedCME(0.01)", LOW_ALPHA, 0.6183, [0.35, 0.5, 0.58, 0.61, 0.62], 7),
        metrics_entry("d-fedavg-high", "FedAvg", HIGH_ALPHA, 0.7012),
        metrics_entry("e-fedcme-high", "FedCME(0.01)", HIGH_ALPHA, 0.725, rounds_to_target=2),
    ]


def write_metrics_folder(folder: Path, entries: list[dict]) -> Path:
    """Each entry as <experiment>.json plus a 5-round <experiment>.csv along its accuracy_at."""
    folder.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        (folder / f"{entry['experiment']}.json").write_text(json.dumps(entry), encoding="utf-8")
        history = [
            {"round": index, "test_accuracy": accuracy, "test_loss": 1.0, "train_loss": 0.5, "round_seconds": 1.0}
            for index, accuracy in enumerate(entry["accuracy_at"].values())
        ]
        (folder / f"{entry['experiment']}.csv").write_text(history_csv(history), encoding="utf-8")
    return folder


def test_results_table_in_table_ii_form():
    # Prepare
    entries = grid_entries()

    # Execute
    table = results_table(entries)

    # Assert
    assert table == (
        "| Method | FMNIST a=0.1 K=50 M=20 | FMNIST a=0.5 K=50 M=20 |\n"
        "|---|---:|---:|\n"
        "| FedAvg | 50.00 | 70.12 |\n"
        "| FedProx(0.01) | **61.83** | – |\n"
        "| FedCME(0.01) | **61.83** | **72.50** |\n"
    )


def test_results_table_keeps_only_its_group():
    # Prepare
    entries = [*grid_entries(), metrics_entry("z-ablation", "FedCME w/o exchange", LOW_ALPHA, 0.9, group="ablation")]

    # Execute
    table = results_table(entries)

    # Assert
    assert table == results_table(grid_entries())


def test_results_table_rejects_two_runs_of_one_cell():
    # Prepare
    entries = [*grid_entries(), metrics_entry("f-fedavg-again", "FedAvg", LOW_ALPHA, 0.4)]

    # Execute / Assert
    with pytest.raises(ValueError, match="a-fedavg-low.*f-fedavg-again"):
        results_table(entries)


def test_speed_table_in_table_iii_form():
    # Prepare
    entries = grid_entries()

    # Execute
    table = speed_table(entries, LOW_ALPHA)

    # Assert
    assert table == (
        "| Method | 1/5 T | 2/5 T | 3/5 T | 4/5 T | T | rounds to target |\n"
        "|---|---:|---:|---:|---:|---:|---:|\n"
        "| FedAvg | 20.00 | 35.00 | 42.00 | 48.00 | 50.00 | – |\n"
        "| FedProx(0.01) | 30.00 | 45.00 | 55.00 | 60.00 | **62.00** | 8 |\n"
        "| FedCME(0.01) | **35.00** | **50.00** | **58.00** | **61.00** | **62.00** | **7** |\n"
    )


def test_speed_table_without_any_target_reached_has_no_bold_rounds():
    # Prepare
    entries = [
        metrics_entry("a", "FedAvg", LOW_ALPHA, 0.5),
        metrics_entry("b", "FedCME(0.01)", LOW_ALPHA, 0.5),
    ]

    # Execute
    table = speed_table(entries, LOW_ALPHA)

    # Assert
    assert table.splitlines()[2] == "| FedAvg | **50.00** | **50.00** | **50.00** | **50.00** | **50.00** | – |"
    assert table.splitlines()[3].endswith("| **50.00** | – |")


def test_ablation_table_puts_fedcme_references_beside_ablations():
    # Prepare
    entries = [*grid_entries(), metrics_entry("z-ablation", "FedCME w/o exchange", LOW_ALPHA, 0.55, group="ablation")]

    # Execute
    table = ablation_table(entries)

    # Assert
    assert table == (
        "| Method | FMNIST a=0.1 K=50 M=20 |\n"
        "|---|---:|\n"
        "| FedCME(0.01) | **61.83** |\n"
        "| FedCME w/o exchange | 55.00 |\n"
    )


def test_no_does_not_win_bullet_when_fedcme_wins_or_ties():
    # Prepare
    entries = grid_entries()

    # Execute
    bullets = settings_where_fedcme_does_not_win(entries)

    # Assert
    assert bullets == []


def test_does_not_win_bullet_when_a_baseline_beats_every_fedcme_row():
    # Prepare
    entries = grid_entries()
    entries[3]["final_accuracy"] = 0.73  # FedAvg in HIGH_ALPHA, above FedCME(0.01)'s 0.725

    # Execute
    bullets = settings_where_fedcme_does_not_win(entries)

    # Assert
    assert bullets == ["- FMNIST a=0.5 K=50 M=20: FedAvg 73.00 vs best FedCME, FedCME(0.01), 72.50"]


def test_write_report_writes_markdown_and_png(tmp_path):
    # Prepare
    metrics = write_metrics_folder(tmp_path / "metrics", grid_entries())
    markdown_path = tmp_path / "reports" / "results.md"
    png_path = tmp_path / "reports" / "accuracy.png"

    # Execute
    write_report(metrics, markdown_path, png_path)

    # Assert
    png = png_path.read_bytes()
    assert png.startswith(b"\x89PNG")
    assert len(png) > 10_000
    markdown = markdown_path.read_text(encoding="utf-8")
    assert markdown.startswith("# FedCME results\n")
    assert "## Final test accuracy (Table II form)\n\n" + results_table(grid_entries()) in markdown
    assert f"## Accuracy at fractions of T: {LOW_ALPHA} (Table III form)" in markdown
    assert f"## Accuracy at fractions of T: {HIGH_ALPHA} (Table III form)" in markdown
    assert speed_table(grid_entries(), LOW_ALPHA) in markdown
    assert "![accuracy](accuracy.png)" in markdown
    assert "mean test accuracy of the last 5 rounds" in markdown
    assert "## Ablations" not in markdown
    assert "## Where FedCME does not win" in markdown
    assert not [line for line in markdown.splitlines() if line.startswith("- ")]
    assert sorted(path.name for path in (tmp_path / "reports").iterdir()) == ["accuracy.png", "results.md"]


def test_write_report_lists_where_fedcme_does_not_win(tmp_path):
    # Prepare
    entries = grid_entries()
    entries[3]["final_accuracy"] = 0.73
    metrics = write_metrics_folder(tmp_path / "metrics", entries)

    # Execute
    write_report(metrics, tmp_path / "results.md", tmp_path / "accuracy.png", title="Grid")

    # Assert
    markdown = (tmp_path / "results.md").read_text(encoding="utf-8")
    assert markdown.startswith("# Grid\n")
    bullets = [line for line in markdown.splitlines() if line.startswith("- ")]
    assert bullets == ["- FMNIST a=0.5 K=50 M=20: FedAvg 73.00 vs best FedCME, FedCME(0.01), 72.50"]


def test_write_report_with_ablations_writes_and_links_their_figure(tmp_path):
    # Prepare
    entries = [*grid_entries(), metrics_entry("z-ablation", "FedCME w/o exchange", LOW_ALPHA, 0.55, group="ablation")]
    metrics = write_metrics_folder(tmp_path / "metrics", entries)

    # Execute
    write_report(metrics, tmp_path / "out" / "results.md", tmp_path / "out" / "accuracy.png")

    # Assert
    markdown = (tmp_path / "out" / "results.md").read_text(encoding="utf-8")
    assert "## Ablations\n" in markdown
    assert ablation_table(entries) in markdown
    assert "![ablation](accuracy-ablation.png)" in markdown
    assert (tmp_path / "out" / "accuracy-ablation.png").read_bytes().startswith(b"\x89PNG")


def test_command_line_writes_the_report(tmp_path):
    # Prepare
    metrics = write_metrics_folder(tmp_path / "metrics", grid_entries())
    arguments = [
        "--metrics", str(metrics),
        "--markdown", str(tmp_path / "results.md"),
        "--png", str(tmp_path / "accuracy.png"),
        "--title", "CLI",
    ]  # fmt: skip

    # Execute
    exit_code = main(arguments)

    # Assert
    assert exit_code == 0
    assert (tmp_path / "results.md").read_text(encoding="utf-8").startswith("# CLI\n")
    assert (tmp_path / "accuracy.png").is_file()


def test_load_metrics_reads_files_sorted_by_name(tmp_path):
    # Prepare
    entries = grid_entries()
    write_metrics_folder(tmp_path, list(reversed(entries)))

    # Execute
    loaded = load_metrics(tmp_path)

    # Assert
    assert loaded == entries


def test_load_metrics_names_a_file_that_is_not_json(tmp_path):
    # Prepare
    write_metrics_folder(tmp_path, grid_entries())
    (tmp_path / "broken.json").write_text("{not json", encoding="utf-8")

    # Execute / Assert
    with pytest.raises(ValueError, match="broken.json"):
        load_metrics(tmp_path)


def test_load_metrics_names_the_file_and_the_missing_key(tmp_path):
    # Prepare
    entry = metrics_entry("no-method", "FedAvg", LOW_ALPHA, 0.5)
    del entry["method"]
    (tmp_path / "no-method.json").write_text(json.dumps(entry), encoding="utf-8")

    # Execute / Assert
    with pytest.raises(ValueError, match=r"no-method\.json.*'method'"):
        load_metrics(tmp_path)


def test_load_metrics_names_an_edited_file_by_its_content_hash(tmp_path):
    entry = with_content_hash(metrics_entry("edited", "FedAvg", LOW_ALPHA, 0.5))
    (tmp_path / "intact.json").write_text(json.dumps(entry), encoding="utf-8")
    assert load_metrics(tmp_path) == [entry]

    (tmp_path / "edited.json").write_text(json.dumps({**entry, "final_accuracy": 0.99}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"edited\.json: content hash mismatch"):
        load_metrics(tmp_path)
