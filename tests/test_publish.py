"""tools/publish_results.py: a campaign's metrics committed under docs/results/<grid>/, in the split form."""

from __future__ import annotations

import json
import sys

from fedcme_core.metrics import with_content_hash
from flows.report import load_metrics

from .conftest import REPO_ROOT
from .test_report import LOW, metrics_entry, write_metrics_folder

sys.path.insert(0, str(REPO_ROOT / "tools"))
from publish_results import publish  # noqa: E402


def test_publish_splits_one_piece_files_and_keeps_what_was_published(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    earlier = with_content_hash(metrics_entry("a-fedavg-s0", "FedAvg", LOW, 0.5))
    write_metrics_folder(tmp_path / "docs" / "results" / "g", [earlier])
    campaign = tmp_path / "campaign"
    newer = with_content_hash(metrics_entry("a-fedavg-s1", "FedAvg", LOW, 0.6, seed=1))
    write_metrics_folder(campaign, [newer])
    (campaign / f"{newer['experiment']}.json").write_text(json.dumps(newer))  # written in one piece
    (campaign / "about" / f"{newer['experiment']}.json").unlink()

    assert publish("g", campaign, note="from the campaign") == ["a-fedavg-s1"]

    target = tmp_path / "docs" / "results" / "g"
    results = json.loads((target / "a-fedavg-s1.json").read_text())
    assert "method" not in results and results["final_accuracy"] == 0.6
    assert json.loads((target / "about" / "a-fedavg-s1.json").read_text())["content_sha256"] == newer["content_sha256"]
    assert load_metrics(target) == [earlier, newer]
    assert (target / "a-fedavg-s1.csv").read_text() == (campaign / "a-fedavg-s1.csv").read_text()
    report = (tmp_path / "docs" / "results-g.md").read_text()
    assert "from the campaign" in report and "| FedAvg |" in report and "(2)" in report
    assert len((tmp_path / "docs" / "results" / "g.csv").read_text().splitlines()) == 3
