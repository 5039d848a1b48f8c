"""The setup screen's rule (flows.report.paper_level) and its report (tools/publish_paper_level.py)."""

from __future__ import annotations

import json

import pytest

from fedcme_core.config.params import load_params
from flows.report import paper_level as pl
from tools.publish_paper_level import main, screen_methods

from .conftest import REPO_ROOT


def run(acc40: float, final40: float | None = None) -> pl.ScreenRun:
    final = acc40 if final40 is None else final40
    return pl.ScreenRun(acc40=acc40, final40=final, best=max(acc40, final), best_round=40)


def test_a_screen_run_reads_round_40_the_last_five_rounds_and_the_best_round():
    rounds = list(range(1, 41))
    accuracies = [0.01 * r for r in rounds]
    accuracies[19] = 0.9  # round 20 is the best

    summary = pl.screen_run(rounds, accuracies)

    # rounds 36-40: 0.36 .. 0.40, mean 0.38
    assert summary.acc40 == pytest.approx(0.40) and summary.final40 == pytest.approx(0.38)
    assert (summary.best, summary.best_round) == (0.9, 20)
    with pytest.raises(ValueError, match="no test accuracy at round 36"):
        pl.screen_run(list(range(1, 36)), [0.1] * 35)


def test_a_factor_raised_fedprox_only_by_two_points_at_round_40_and_a_higher_last_five():
    today = run(0.4137, 0.40)

    assert pl.raised(today, run(0.4337, 0.41)) == "yes"  # +2.00 points exactly, in float noise
    assert pl.raised(today, run(0.4336, 0.41)) == "no"  # +1.99
    assert pl.raised(today, run(0.50, 0.39)) == "no"  # a lucky round 40 over a lower window
    assert pl.raised(None, run(0.50)) == "pending" and pl.raised(today, None) == "pending"


def test_the_closest_setup_keeps_one_learning_rate_and_waits_for_missing_runs():
    today = run(0.40)
    fedprox = {"lr0005": run(0.43), "lr002": run(0.45), "b32": run(0.41), "e5": run(0.44), "cnn64": run(0.50)}

    choice = pl.closest_setup(today, fedprox, ["lr0005", "lr002"])

    assert choice == pl.Choice(("lr002", "e5", "cnn64"), "chosen")  # lr0005 also raised, lr002 higher
    assert pl.best_single(fedprox, choice.factors) == "cnn64"
    assert pl.closest_setup(today, {**fedprox, "cdir": None}, []).missing == ("cdir",)
    assert pl.closest_setup(today, {"b32": run(0.41)}, []) == pl.Choice((), "chosen")


def test_the_combination_holds_above_today_and_near_the_best_single_factor():
    today, best = run(0.40), run(0.50)

    assert pl.combination_holds(today, best, run(0.48)) == "yes"
    assert pl.combination_holds(today, best, run(0.4799)) == "no"  # more than 2 points below the best
    assert pl.combination_holds(today, run(0.41), run(0.419)) == "no"  # not 2 points above today
    assert pl.combination_holds(today, best, None) == "pending"


def test_the_screen_grid_pairs_fedprox_and_fedcme_by_setup():
    params = load_params(REPO_ROOT / "configs" / "params-paper-screen.yaml")

    pairs = screen_methods(params)

    assert list(pairs) == ["today", "lr0005", "lr002", "lr005", "b32", "e5", "cnn64"]
    assert pairs["today"] == {"fedprox": "fedprox-mu001", "fedcme": "fedcme-mu001"}
    assert pairs["cnn64"] == {"fedprox": "fedprox-cnn64", "fedcme": "fedcme-cnn64"}
    assert params.methods["fedcme-cnn64"].setup == {"model.name": "cifar_cnn64"}


def publish_run(results, grid: str, method: str, accuracies: list[float]) -> None:
    folder = results / grid
    folder.mkdir(parents=True, exist_ok=True)
    name = f"cifar10-a0.1-k80m30-{method}-s0"
    (folder / f"{name}.json").write_text(json.dumps({"final_accuracy": sum(accuracies[-5:]) / 5}))
    lines = ["round,test_accuracy,test_loss,train_loss,round_seconds"]
    lines += [f"{r},{a},1.0,1.0,1.0" for r, a in enumerate(accuracies, start=1)]
    (folder / f"{name}.csv").write_text("\n".join(lines) + "\n")


def test_the_tool_rewrites_only_the_results_section_from_published_runs(tmp_path, capsys):
    markdown = tmp_path / "report.md"
    markdown.write_text("# Title\n\n## The rules\n\nkept as written\n\n## Results\n\nold\n")
    results = tmp_path / "results"
    publish_run(results, "paper-screen", "fedprox-mu001", [0.40] * 40)
    publish_run(results, "paper-screen", "fedcme-mu001", [0.39] * 40)
    publish_run(results, "paper-screen", "fedprox-e5", [0.45] * 40)
    publish_run(results, "paper-screen-cdir", "fedprox-mu001", [0.30] * 40)

    assert main(["--results", str(results), "--markdown", str(markdown)]) == 0

    text = markdown.read_text()
    assert text.startswith("# Title\n\n## The rules\n\nkept as written\n\n## Results\n") and "old" not in text
    assert "| today | 40.00 | 40.00 | 40.00 (round 1) | 39.00 | 39.00 | 39.00 (round 1) | -1.00 | (today) |" in text
    assert "| e5 | 45.00 | 45.00 | 45.00 (round 1) | – (not run yet) | – | – | – | yes |" in text
    assert "| cdir | 30.00 | 30.00 | 30.00 (round 1) |" in text and "| no |" in text
    assert "| the paper (its setup unstated) | 56.93 | – | – | 61.83 | – | – | +4.90 |  |" in text
    assert "Pending: the runs of lr0005, lr002, lr005, b32, cnn64 are not published yet." in text
    assert "wrote" in capsys.readouterr().out


def test_the_tool_refuses_a_report_without_its_results_heading_in_one_line(tmp_path, capsys):
    markdown = tmp_path / "report.md"
    markdown.write_text("# Title\n")

    assert main(["--results", str(tmp_path), "--markdown", str(markdown)]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0 and markdown.read_text() == "# Title\n"
