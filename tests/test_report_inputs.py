"""Tests of what the report reads and what DVC shows (flows.report.inputs, flows.report.compare)."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest

from fedcme_core.results.metrics import with_content_hash
from flows.report.build import write_report
from flows.report.inputs import load_metrics
from flows.report.compare import compare_table, curve_tables, dependency_filter, method_labels, summary_metrics
from flows.report.published import published_table
from flows.report.seed_stats import summary_csv
from fedcme_core.config.sections import PublishedFigure

from .conftest import REPO_ROOT
from .report_helpers import LOW, grid_entries, metrics_entry, table_row, write_metrics_folder


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
    lines = compare_table(COMPARE_CSV, {"fedavg": "FedAvg", "fedcme-mu001": "FedCME(0.01)"}).splitlines()

    assert lines[0].startswith("Not shown: main: no results in that commit (reports/ is not committed")
    assert lines[1].split() == ["Experiment", "Created", "FedAvg", "(%)", "FedCME(0.01)", "(%)",
                                "base.training.batch_size"]
    assert lines[2].split() == ["workspace", "-", "70.12", "71.23", "32"]
    assert lines[3].split() == ["exp-1a2b3", "2026-12-05", "21:00", "69.00", "70.00", "16"]
    assert len(lines) == 4



def test_make_compare_heads_a_method_by_its_label_and_a_method_the_grid_file_lacks_by_its_key():
    header = compare_table(COMPARE_CSV, {"fedavg": "FedAvg"}).splitlines()[1]

    assert header.split()[2:6] == ["FedAvg", "(%)", "fedcme-mu001", "(%)"]



def test_make_compare_drops_the_columns_that_name_a_top_level_file_or_folder_a_dependency(tmp_path):
    (tmp_path / "tuning").mkdir()
    (tmp_path / "dvc.yaml").write_text("")
    drop, pattern = dependency_filter(tmp_path)

    assert drop == "--drop" and pattern == r"^(dvc\.yaml|tuning)$"
    assert [name for name in ("tuning", "dvc.yaml", "base.training.batch_size", "tuning.rounds")
            if re.match(pattern, name)] == ["tuning", "dvc.yaml"]

def test_method_labels_are_the_grid_files_labels_else_the_algorithms_display_name(tmp_path):
    smoke = (REPO_ROOT / "configs" / "params-smoke.yaml").read_text(encoding="utf-8")
    unlabelled = smoke.replace("{name: fedcme, mu: 0.01, label: FedCME(0.01)}", "{name: fedcme, mu: 0.01}")
    assert unlabelled != smoke
    (tmp_path / "params.yaml").write_text(unlabelled, encoding="utf-8")

    assert method_labels(tmp_path / "params.yaml") == {
        "fedavg": "FedAvg", "fedcme-mu001": "FedCME(0.01)", "scaffold": "SCAFFOLD",
        "fedcme-no-exchange": "FedCME w/o exchange"}

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
