"""tools/publish_results.py: a campaign's metrics committed under docs/results/<grid>/, in the split form."""

from __future__ import annotations

import csv
import io
import json
import sys

import pytest

from fedcme_core.config.schema import ConfigError
from fedcme_core.results.metrics import with_content_hash
from flows.report.inputs import load_metrics

from .conftest import REPO_ROOT
from .report_helpers import LOW, metrics_entry, write_metrics_folder

sys.path.insert(0, str(REPO_ROOT / "tools"))
from publish_results import publish  # noqa: E402


def test_publish_splits_one_piece_files_keeps_what_was_published_and_leaves_other_grids_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    earlier = with_content_hash(metrics_entry("fmnist-a1.0-k10m10-fedavg-s0", "FedAvg", LOW, 0.5))
    write_metrics_folder(tmp_path / "docs" / "results" / "g", [earlier])
    campaign = tmp_path / "campaign"
    newer = with_content_hash(metrics_entry("fmnist-a1.0-k10m10-fedavg-s1", "FedAvg", LOW, 0.6, seed=1))
    other_grid = with_content_hash(metrics_entry("cifar10-a0.5-k10m10-fedavg-raw-s0", "FedAvg raw", LOW, 0.7))
    write_metrics_folder(campaign, [newer, other_grid])
    (campaign / f"{newer['experiment']}.json").write_text(json.dumps(newer))  # written in one piece
    (campaign / "about" / f"{newer['experiment']}.json").unlink()

    grid_file = tmp_path / "configs" / "params-g.yaml"
    grid_file.parent.mkdir()
    grid_file.write_text((REPO_ROOT / "params.yaml").read_text())

    assert publish("g", campaign, note="from the campaign") == ["fmnist-a1.0-k10m10-fedavg-s1"]

    target = tmp_path / "docs" / "results" / "g"
    results = json.loads((target / "fmnist-a1.0-k10m10-fedavg-s1.json").read_text())
    assert "method" not in results and results["final_accuracy"] == 0.6
    assert json.loads((target / "about" / "fmnist-a1.0-k10m10-fedavg-s1.json").read_text())["content_sha256"] == newer["content_sha256"]
    assert load_metrics(target) == [earlier, newer]
    assert (target / "fmnist-a1.0-k10m10-fedavg-s1.csv").read_text() == (campaign / "fmnist-a1.0-k10m10-fedavg-s1.csv").read_text()
    report = (tmp_path / "docs" / "results-g.md").read_text()
    assert "from the campaign" in report and "| FedAvg |" in report and "(2)" in report
    rows = list(csv.DictReader(io.StringIO((tmp_path / "docs" / "results" / "g.csv").read_text())))
    assert [(row["seed"], row["partition"], row["classifier_layers"], row["augment"], row["align_loss"]) for row in rows] == [
        ("0", "dirichlet(1.0)", "1", "none", ""), ("1", "dirichlet(1.0)", "1", "none", "")]
    assert not list(target.rglob("*fedavg-raw*")) and "FedAvg raw" not in report  # another grid's experiment


def test_publish_without_the_grid_file_is_one_line_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    campaign = write_metrics_folder(tmp_path / "campaign", [with_content_hash(metrics_entry("fmnist-a1.0-k10m10-fedavg-s0", "FedAvg", LOW, 0.5))])

    with pytest.raises(ConfigError, match=r"^configs/params-g\.yaml: config file not found$"):
        publish("g", campaign, note=None)

    assert not (tmp_path / "docs").exists()


def test_publish_opens_the_report_with_the_grids_committed_note_unless_given_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    campaign = write_metrics_folder(tmp_path / "campaign", [with_content_hash(metrics_entry("fmnist-a1.0-k10m10-fedavg-s0", "FedAvg", LOW, 0.5))])
    (tmp_path / "params.yaml").write_text((REPO_ROOT / "params.yaml").read_text())
    note = tmp_path / "docs" / "results" / "default" / "NOTE.md"
    note.parent.mkdir(parents=True)
    note.write_text("Where the runs come from.\n\n## How the setting differs\n\n- no normalisation there\n")

    publish("default", campaign, note=None)
    committed = (tmp_path / "docs" / "results-default.md").read_text()
    publish("default", campaign, note="given on the command line")
    given = (tmp_path / "docs" / "results-default.md").read_text()

    assert committed.startswith("# FedCME results: the default grid\n\nWhere the runs come from.\n\n## How the setting")
    assert "- no normalisation there\n" in committed and "Where the runs come from" not in given
    assert "given on the command line" in given


def test_publish_keeps_the_partition_tag_of_a_new_run_out_of_the_dvc_metric(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    entry = with_content_hash({**metrics_entry("fmnist-a1.0-k10m10-fedcme-mu001-s0", "FedCME(0.01)", LOW, 0.5),
                               "method_name": "fedcme-mu001", "partition": "a1.0", "alpha": 1.0})
    (tmp_path / "params.yaml").write_text((REPO_ROOT / "params.yaml").read_text())

    publish("default", write_metrics_folder(tmp_path / "campaign", [entry]), note=None)

    target = tmp_path / "docs" / "results" / "default"
    results = json.loads((target / "fmnist-a1.0-k10m10-fedcme-mu001-s0.json").read_text())
    about = json.loads((target / "about" / "fmnist-a1.0-k10m10-fedcme-mu001-s0.json").read_text())
    assert "partition" not in results and about["partition"] == "a1.0"
    assert load_metrics(target) == [entry]
    (row,) = csv.DictReader(io.StringIO((tmp_path / "docs" / "results" / "default.csv").read_text()))
    assert (row["partition"], row["align_loss"], row["align_reduction"], row["exchange_optimizer"],
            row["feature_weights"]) == ("dirichlet(1.0)", "class_mean", "mean", "reset", "samples")
