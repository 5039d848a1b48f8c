"""The sensitivity study's combination at T=100: `report.combination`, its paired comparisons and verdict, the tool."""

from __future__ import annotations

import csv
import io
import shutil
import statistics

import pytest
import yaml

from fedcme_core.config.files import ConfigError
from fedcme_core.config.params import load_params
from fedcme_core.config.sections import ReportSection
from flows.report import combination as rc
from flows.report.factors import Study, load_study
from flows.report import sensitivity as rs
from flows.report import verdicts

from .conftest import REPO_ROOT
from .sensitivity_helpers import (
    SEEDS3, SENSITIVITY, T100, accuracy, config_changes, main, publish_copy, real_results, runs, sensitivity_values,
    write_grid,
)

from publish_sensitivity import combination_part  # noqa: E402  (tools/ is on sys.path from the module above)

COMBINATION = {"readings": ["f1"], "grid": "t100", "fedcme": "c001", "strong": "c01", "twin": "c01-nx",
               "against": "today", "fedavg": "avg", "fedrs": "rs", "today": "cme001", "today_strong": "cme01"}


def report_with(combination: dict) -> Study:
    return Study.model_validate({
        "name": "main", "references": {"fedavg": "fedavg", "fedrs": "fedrs", "fedcme": "fedcme", "twin": "twin"},
        "factors": [{"name": "f1", "label": "reading one", "fedcme": "f1", "twin": "f1-nx"},
                    {"name": "e4", "label": "setup E=4", "fedcme": "e4", "twin": "e4-nx", "fedavg": "avg-e4"}],
        "combination": combination})


def hand_made(exchange_seed2: float = 0.50) -> dict[str, list[dict]]:
    return {
        "t100": [*runs("c001", {0: 0.56, 1: 0.57, 2: 0.58}), *runs("c01", {0: 0.55, 1: 0.55, 2: 0.55}),
                 *runs("c01-nx", {0: 0.54, 1: 0.53, 2: exchange_seed2})],
        "today": [*runs("avg", {0: 0.52, 1: 0.50, 2: 0.53}), *runs("rs", {0: 0.55, 1: 0.56, 2: 0.57}),
                  *runs("cme001", {0: 0.53, 1: 0.52, 2: 0.54}), *runs("cme01", {0: 0.52, 1: 0.52, 2: 0.52})],
    }


def test_the_combination_is_compared_seed_by_seed_with_the_committed_runs():
    combination = report_with(COMBINATION).combination
    rows = {row.code: row for row in rc.comparisons(combination, hand_made())}

    assert list(rows) == ["t1", "t2", "t3", "t4", "t5", "t6", "t7"]
    points = {code: {seed: round(100 * value, 6) for seed, value in row.difference.by_seed.items()}
              for code, row in rows.items()}
    assert points["t1"] == {0: 4.0, 1: 7.0, 2: 5.0}     # c001 - avg
    assert points["t2"] == {0: 1.0, 1: 1.0, 2: 1.0}     # c001 - rs
    assert points["t4"] == {0: 1.0, 1: 2.0, 2: 5.0}     # c01 - c01-nx: the exchange
    assert points["t6"] == {0: 0.0, 1: -1.0, 2: -2.0}   # c01 - rs
    assert (rows["t3"].minuend, rows["t3"].subtrahend) == (rs.Side("t100", "c001"), rs.Side("today", "cme001"))

    text = rc.verdict_text(list(rows.values()))
    assert text.startswith("FedCME best: yes for FedCME(0.01) combined, ahead of FedAvg and FedRS in the mean over "
                           "3 seeds.")  # FedCME(0.1) combined: -1 point against FedRS in the mean
    assert "The exchange (the paper's main effect) helps: it beats no exchange on every one of 3 seeds." in text


def test_the_verdict_says_no_where_a_seed_is_lost_and_waits_for_missing_runs():
    combination = report_with(COMBINATION).combination
    lost = rc.verdict_text(rc.comparisons(combination, hand_made(exchange_seed2=0.56)))   # seed 2: -1 point
    assert "helps: no; the combined FedCME(0.1) beats its no-exchange twin on 2 of 3 seeds." in lost

    entries = hand_made()
    entries["t100"] = [e for e in entries["t100"] if e["method_name"] != "c01-nx"]
    assert rc.verdict_text(rc.comparisons(combination, entries)).startswith("The combination's runs are not all")
    losing = hand_made()
    for e in losing["t100"]:
        e["final_accuracy"] -= 0.05
    assert rc.verdict_text(rc.comparisons(combination, losing)).startswith("FedCME best: no; neither combined")


@pytest.mark.parametrize(("change", "message"), [
    (lambda c: c.update(readings=["e4"]), r"combination\.readings: e4 is not a reading factor of report\.factors "
                                          r"\(readings: f1\)"),
    (lambda c: c.update(readings=[]), r"combination\.readings"),
    (lambda c: c.pop("twin"), r"combination\.twin"),
])
def test_a_bad_combination_is_refused(change, message):
    combination = dict(COMBINATION)
    change(combination)
    with pytest.raises(ValueError, match=message):
        report_with(combination)


def test_the_combination_names_methods_of_the_grid_files_beside_it(tmp_path):
    values = sensitivity_values()
    shutil.copy(REPO_ROOT / "configs" / "params-cifar10-t100.yaml", tmp_path)
    t100 = yaml.safe_load((REPO_ROOT / "configs" / "params-sensitivity-t100.yaml").read_text())
    del t100["methods"]["combined-mu01-nx"]
    t100["grid"]["methods"].remove("combined-mu01-nx")
    write_grid(tmp_path, t100, "params-sensitivity-t100.yaml")

    with pytest.raises(ConfigError, match=r"report\.combination\.twin: combined-mu01-nx not defined in methods of "
                                          r"the sensitivity-t100 grid \(.*params-sensitivity-t100\.yaml\)$"):
        load_study(write_grid(tmp_path, values))


def test_the_shipped_combination_changes_only_the_readings_it_combines():
    params = load_params(SENSITIVITY)
    study = load_study(SENSITIVITY, params)
    combination = study.combination
    today, combined = (load_params(REPO_ROOT / "configs" / f"params-{grid}.yaml")
                       for grid in (combination.against, combination.grid))
    factors = {factor.name: factor for factor in study.factors}
    cell = ("cifar10", "a0.1", 50, 20, 0)

    for reading in combination.readings:
        screen = params.cell_config(factors[reading].fedcme, *cell).model_dump(mode="json")
        reference = params.cell_config(study.references.fedcme, *cell).model_dump(mode="json")
        combined_config = combined.cell_config(combination.fedcme, *cell).model_dump(mode="json")
        today_config = today.cell_config(combination.today, *cell).model_dump(mode="json")
        assert set(config_changes(reference, screen)) <= set(config_changes(today_config, combined_config))
    assert combined.cell_config(combination.strong, *cell).algorithm.mu == 0.1
    assert combined.cell_config(combination.twin, *cell).algorithm.exchange == "none"
    assert combined.base.federation.rounds == today.base.federation.rounds == 100


def test_the_tool_writes_the_combination_section_and_its_csv_rows(tmp_path):
    results = real_results(tmp_path)
    shutil.copytree(T100, results / "cifar10-t100")
    run = "cifar10-a0.1-k50m20-{}-s{}"
    for seed in SEEDS3:
        for source, method in (("fedprox-mu001", "combined-mu001"), ("fedrs-a01", "combined-mu01"),
                               ("fedprox-mu0001", "combined-mu01-nx")):
            publish_copy(run.format(source, seed), results, "sensitivity-t100", method, seed)

    assert main(["--params", str(SENSITIVITY), "--results", str(results)]) == 0

    report = (tmp_path / "docs" / "results-sensitivity.md").read_text()
    assert "## The combination at T=100" in report and ("Combined: classifier2, class-counts (algorithm.feature_weights: samples → "
                                                   "class_counts; model.classifier_layers: 1 → 2)") in report
    table = list(csv.DictReader(io.StringIO((results / "sensitivity-factors.csv").read_text())))
    t1 = next(row for row in table if (row["factor"], row["comparison"]) == ("combination", "t1"))
    expected = [accuracy(run.format("fedprox-mu001", seed)) - accuracy(run.format("fedavg", seed)) for seed in SEEDS3]
    assert (t1["n"], t1["minuend_grid"], t1["subtrahend_grid"]) == ("3", "sensitivity-t100", "cifar10-t100")
    assert float(t1["mean"]) == pytest.approx(sum(expected) / 3)
    assert t1["description"] == "T=100: FedCME(0.01) combined − FedAvg" and t1["kind"] == "combination"
    wins, spread = sum(value > 0 for value in expected), 100 * statistics.stdev(expected)
    assert (f"| FedCME(0.01) combined − FedAvg | {100 * sum(expected) / 3:+.2f} ± {spread:.2f} (3) | {wins}/3 |"
            in report)


def test_the_report_says_so_where_the_rule_comes_to_give_other_readings_than_those_combined():
    study = load_study(SENSITIVITY)
    rows = rc.comparisons(study.combination, {})

    def part(statuses: dict[str, str]) -> str:
        helps = [verdicts.Help(name, 0.0, 0.0, 0.0, status) for name, status in statuses.items()]
        return "".join(combination_part(study, {}, {}, helps, rows))

    combined = study.combination.readings            # classifier2, class-counts
    helped = dict.fromkeys(combined, "helped")
    assert "the grid files are not both here" in part(helped)
    assert "The rule now gives" not in part({**helped, "sample-mean": "did not help"})
    assert "The rule now gives" not in part({**helped, combined[0]: "did not help", "sample-sum": "pending"})
    assert f"The rule now gives {combined[1]}, sample-mean, not the readings combined." in part(
        {**helped, combined[0]: "did not help", "sample-mean": "helped"})
    assert "The rule now gives no reading, not the readings combined." in part(dict.fromkeys(combined, "did not help"))


def test_the_combination_has_a_panel_whose_roles_the_figure_draws():
    from flows.report.sensitivity_figure import ROLE_STYLES

    panel = rc.panel_sides(report_with(COMBINATION).combination)
    assert panel["strong_twin"] == rs.Side("t100", "c01-nx") and panel["today_fedcme"] == rs.Side("today", "cme001")
    assert len(panel) == 7 and set(panel) <= set(ROLE_STYLES)


def test_the_niid_bench_check_sets_our_runs_beside_the_published_figure(tmp_path):
    results = real_results(tmp_path)
    run = "cifar10-a0.1-k50m20-fedavg-s{}"
    for seed in SEEDS3:
        publish_copy(run.format(seed), results, "niid-bench-c2", "fedavg", seed, "c2", (10, 10))

    assert main(["--params", str(SENSITIVITY), "--results", str(results)]) == 0

    report = (tmp_path / "docs" / "results-sensitivity.md").read_text()
    ours = [100 * accuracy(run.format(seed)) for seed in SEEDS3]
    mean, spread = sum(ours) / 3, statistics.stdev(ours)
    assert "## The niid-bench-c2 check: ours beside the published figures" in report
    assert (f"| FedAvg | CIFAR-10 #C=2 K=10 M=10 | final (mean of the last rounds) | {mean:.2f} ± {spread:.2f} (3) "
            f"| 49.80 | {mean - 49.8:+.2f} |") in report


def test_a_check_names_a_grid():
    with pytest.raises(ValueError, match=r"checks\.0"):
        ReportSection.model_validate({"name": "main", "checks": ["NIID bench"]})
    assert ReportSection.model_validate({"name": "main", "checks": ["niid-bench-c2"]}).other_grids() == ["niid-bench-c2"]
    assert report_with(COMBINATION).other_grids() == ["t100", "today"]  # a study reads its own grids beside the checks


def test_the_answer_in_words_heads_the_rules_answer_where_it_is_written(tmp_path):
    results = real_results(tmp_path)
    assert main(["--params", str(SENSITIVITY), "--results", str(results)]) == 0
    report = (tmp_path / "docs" / "results-sensitivity.md").read_text()
    assert "By the two rules" not in report and "## The answer\n\n| Reading |" in report

    (results / "sensitivity" / "ANSWER.md").write_text("No: under no reading did FedCME win.\n")
    assert main(["--params", str(SENSITIVITY), "--results", str(results)]) == 0
    report = (tmp_path / "docs" / "results-sensitivity.md").read_text()
    assert ("## The answer\n\nNo: under no reading did FedCME win.\n\nBy the two rules, in the order they were "
            "written, computed from the published runs:\n\n| Reading |") in report
