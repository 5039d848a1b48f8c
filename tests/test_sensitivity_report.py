"""The sensitivity study's report: the paired comparisons (a)-(d), the seed-0 moves, the verdicts, the tool end to end."""

from __future__ import annotations

import csv
import io
import struct

import pytest

from flows.report.factors import Study
from flows.report import combination as rc
from flows.report import sensitivity as rs
from flows.report import verdicts
from flows.report.inputs import load_metrics
from flows.report.seed_stats import PairedDifference

from .conftest import REPO_ROOT
from .sensitivity_helpers import (
    SENSITIVITY,
    accuracy,
    config_changes,
    entry,
    main,
    publish_sensitivity,
    real_results,
    runs,
)


REPORT = Study.model_validate({
    "name": "main",
    "references": {"fedavg": "fedavg", "fedrs": "fedrs", "fedcme": "fedcme", "twin": "twin"},
    "factors": [
        {"name": "f1", "label": "reading one", "fedcme": "f1", "twin": "f1-nx"},
        {"name": "f2", "label": "reading two", "fedcme": "f2", "twin": "f2-nx"},
        {"name": "f3", "label": "reading three", "fedcme": "f3", "twin": "f3-nx"},
        {"name": "e4", "label": "setup E=4", "fedcme": "cme-e4", "twin": "cme-e4-nx", "fedavg": "avg-e4"},
        {"name": "c2", "label": "setup #C=2", "fedcme": "fedcme", "twin": "twin", "fedavg": "fedavg",
         "grid": "other", "setting": "c2"},
    ],
})
FACTORS = ["f1", "f2", "f3", "e4", "c2"]


def hand_made() -> dict[str, list[dict]]:
    main_grid = [
        *runs("fedcme", {0: 0.50, 1: 0.52, 2: 0.54}),
        *runs("twin", {0: 0.49, 1: 0.52, 2: 0.55}),      # today's b: +1, 0, -1 points
        *runs("fedavg", {0: 0.48, 1: 0.50, 2: 0.50}),    # today's c: +2, +2, +4
        *runs("fedrs", {0: 0.51, 1: 0.51, 2: 0.51}),     # today's d: -1, +1, +3
        *runs("f1", {0: 0.53, 1: 0.50}),                 # a: +3, -2 (two seeds)
        *runs("f1-nx", {0: 0.52, 1: 0.49}),              # b: +1, +1
        *runs("f2", {0: 0.515}),                         # a: +1.5 exactly, b: +2.5 (b - today's b: +1.5)
        *runs("f2-nx", {0: 0.49}),
        *runs("f3", {0: 0.5149}),                        # a: +1.49, b: +1.0 (shift 0): did not move
        *runs("f3-nx", {0: 0.5049}),
        *runs("cme-e4", {0: 0.47}), *runs("avg-e4", {0: 0.45}),  # e4's twin not run yet
        entry("fedavg", 0, 0.99, partition="a0.5"),      # another setting of the grid: left out
    ]
    other_grid = runs("fedcme", {0: 0.30}, "c2") + runs("fedavg", {0: 0.20}, "c2")  # c2's twin not run yet
    return {"main": main_grid, "other": other_grid}


def rows():
    return rs.comparisons(REPORT, hand_made(), "a0.1")


def difference(factor: str, code: str) -> PairedDifference | None:
    return rs.find(rows(), factor, code).difference


def rounded(d: PairedDifference) -> dict[int, float]:
    return {seed: round(100 * value, 6) for seed, value in d.by_seed.items()}


def test_reference_differences_are_paired_seed_by_seed_with_a_p_value_at_three_seeds():
    b, c, d = (difference(rs.REFERENCE, code) for code in "bcd")

    assert rounded(b) == {0: 1.0, 1: 0.0, 2: -1.0} and (b.wins, b.losses) == (1, 1)
    assert rounded(c) == {0: 2.0, 1: 2.0, 2: 4.0} and c.wins == 3
    assert rounded(d) == {0: -1.0, 1: 1.0, 2: 3.0}
    # c: mean 2.667, std 1.155 points, t = 4 with 2 degrees of freedom: p = 1 - 4 / sqrt(18) = 0.0572
    assert rs.difference_text(c) == "+2.67 ± 1.15 (3)" and rs.p_text(c) == "0.057"
    assert rs.p_text(b) == "1.000"


def test_factor_differences_name_their_runs_and_give_n_below_3_instead_of_p():
    a, b, c, d = (difference("f1", code) for code in "abcd")

    assert rounded(a) == {0: 3.0, 1: -2.0} and (a.wins, a.n) == (1, 2)
    assert rounded(b) == {0: 1.0, 1: 1.0} and b.wins == 2
    assert rounded(c) == {0: 5.0, 1: 0.0} and c.wins == 1
    assert rounded(d) == {0: 2.0, 1: -1.0}
    assert rs.difference_text(a) == "+0.50 ± 3.54 (2)" and rs.p_text(a) == "n<3" and rs.p_text(b) == "n<3"
    row = rs.find(rows(), "f1", "d")
    assert (row.minuend, row.subtrahend) == (rs.Side("main", "f1", "a0.1"), rs.Side("main", "fedrs", "a0.1"))


def test_setup_factors_use_their_own_fedavg_and_grid_and_missing_runs_are_none():
    assert rounded(difference("e4", "c")) == {0: 2.0}           # cme-e4 - avg-e4, not - fedavg
    assert difference("e4", "b") is None                          # its twin has not run
    assert rounded(difference("c2", "c")) == {0: 10.0}           # the other grid's fedavg on c2
    assert rounded(difference("c2", "a")) == {0: -20.0}          # c2's FedCME - today's FedCME
    assert rs.is_setup(REPORT, REPORT.factors[3]) and rs.is_setup(REPORT, REPORT.factors[4])
    assert not rs.is_setup(REPORT, REPORT.factors[0])
    assert rs.difference_text(None) == "–" and rs.p_text(None) == "–"


def test_seed0_moves_use_a_and_b_minus_todays_b_at_one_and_a_half_points():
    moves = {move.factor: move for move in verdicts.seed0_moves(rows(), FACTORS)}

    assert {name: move.status for name, move in moves.items()} == {
        "f1": "moved", "f2": "moved", "f3": "did not move", "e4": "moved", "c2": "moved"}
    assert round(100 * moves["f1"].b_shift, 6) == 0.0 and round(100 * moves["f2"].b_shift, 6) == 1.5
    assert round(100 * moves["f3"].a, 6) == 1.49
    assert moves["e4"].b_shift is None  # e4 moved on (a) alone: -3 points
    assert verdicts.seed0_moves(rows(), ["f3"], points=1.4)[0].status == "moved"


def test_a_factor_with_a_run_missing_and_a_small_a_is_pending():
    entries = hand_made()
    entries["main"] = [e for e in entries["main"] if e["method_name"] != "f3-nx"]

    (move,) = verdicts.seed0_moves(rs.comparisons(REPORT, entries, "a0.1"), ["f3"])

    assert move.status == "pending" and move.b_shift is None


def test_a_reading_helps_against_todays_b_on_its_own_seeds_not_todays_mean_over_more():
    entries = hand_made()  # today's b: +1, 0, -1 points on seeds 0-2 (mean 0)
    entries["main"] = [{**e, "final_accuracy": 0.5069} if e["method_name"] == "f3-nx" else e for e in entries["main"]]

    helps = {h.factor: h for h in verdicts.readings_that_helped(rs.comparisons(REPORT, entries, "a0.1"),
                                                                ["f1", "f2", "f3"])}

    # f3 on seed 0 alone: a +1.49, b +0.80 against today's +1 on seed 0 (not today's mean of 0 over 3 seeds)
    assert helps["f3"].status == "did not help"
    assert (round(100 * helps["f3"].b, 6), round(100 * helps["f3"].today_b, 6)) == (0.8, 1.0)
    # f1 on seeds 0 and 1: b +1, +1 against today's +1, 0 on those seeds (mean +0.5)
    assert helps["f1"].status == "helped" and round(100 * helps["f1"].today_b, 6) == 0.5
    assert helps["f2"].status == "helped"  # a +1.5, b +2.5 against +1


def test_a_reading_without_a_common_seed_with_todays_twin_is_pending():
    entries = hand_made()
    entries["main"] = [e for e in entries["main"] if not (e["method_name"] == "twin" and e["seed"] == 0)]

    (help_,) = verdicts.readings_that_helped(rs.comparisons(REPORT, entries, "a0.1"), ["f2"])  # f2: seed 0 alone

    assert (help_.status, help_.b, help_.today_b) == ("pending", None, None) and round(100 * help_.a, 6) == 1.5


def test_the_answer_names_the_readings_where_fedcme_was_best_and_its_exchange_won_every_seed():
    text = verdicts.answer_text(rows(), FACTORS)

    # today: b +1, 0, -1 (not every seed), c +2.67, d +1; f1: b +1, +1, c +2.5, d +0.5;
    # f2: b +2.5 (1 seed), c +3.5, d +0.5; f3: b +1, c +3.49, d +0.49.
    assert text.startswith("Under the second rule (d91dd6c, added 2026-12-06 08:40 UTC, after the first factors' runs "
                           "were in")
    assert "both claims held under 3 of the 4 readings with runs (today's and the factors): " in text
    assert "f1 (b on 2/2 seeds, n<3: a screen, not a demonstration; d +0.50 ± 2.12 (2), n<3: a screen" in text
    assert "f2 (b on 1/1 seeds" in text and "reference (" not in text
    assert "FedCME ahead of FedAvg and FedRS: reference, f1, f2, f3. The exchange ahead of no exchange on every " \
           "seed: f1, f2, f3." in text
    assert "Still without the runs of (b), (c) and (d): e4, c2." in text


def test_the_answer_says_plainly_when_no_reading_did_or_nothing_ran():
    entries = hand_made()
    for e in entries["main"]:
        if e["method_name"] in ("f1-nx", "f2-nx", "f3-nx"):
            e["final_accuracy"] = 0.9  # every twin beats its FedCME
    no_exchange = verdicts.answer_text(rs.comparisons(REPORT, entries, "a0.1"), FACTORS)
    for e in entries["main"]:
        if e["method_name"] == "fedrs":
            e["final_accuracy"] = 0.9  # and FedRS beats every FedCME
    neither = verdicts.answer_text(rs.comparisons(REPORT, entries, "a0.1"), FACTORS)

    assert "no reading did: under none of the 4 readings with runs" in no_exchange
    assert "FedCME ahead of FedAvg and FedRS: reference, f1, f2, f3. The exchange ahead of no exchange on every seed: " \
           "under none." in no_exchange
    assert "FedCME ahead of FedAvg and FedRS: under none." in neither
    assert "no factor has its runs yet" in verdicts.answer_text(rs.comparisons(REPORT, {}, "a0.1"), FACTORS)


def test_both_rules_judge_every_reading_in_the_order_they_were_written():
    judged = {v.factor: (v.first, v.second) for v in verdicts.rule_verdicts(rows(), FACTORS)}

    # today: b +1, 0, -1 (not every seed): no under both. f1: b +1, +1, c +2.5, d +0.5: yes under both.
    # e4: its twin is not run: pending. c2: no twin, no FedRS of its own: pending under both.
    assert judged == {"reference": ("no", "no"), "f1": ("yes", "yes"), "f2": ("yes", "yes"), "f3": ("yes", "yes"),
                      "e4": ("pending", "pending"), "c2": ("pending", "pending")}
    text = verdicts.first_rule_text(verdicts.rule_verdicts(rows(), FACTORS))
    assert text.startswith("Under the first rule (4f727db, committed 2026-12-05 20:11 UTC, before any result")
    assert "yes under 3 of the 4 readings with runs: f1, f2, f3." in text
    assert "Still without the runs of (b) and (c): e4, c2." in text
    table = verdicts.rules_table(rows(), verdicts.rule_verdicts(rows(), FACTORS))
    assert "| f1 | 2/2 | +2.50 | +0.50 | yes | yes |" in table and "| e4 | – | +2.00 | – | pending | pending |" in table


def test_the_first_rule_can_say_yes_where_the_second_says_no():
    entries = hand_made()
    for e in entries["main"]:
        if e["method_name"] == "fedrs":
            e["final_accuracy"] = 0.9  # FedRS beats every FedCME: (d) < 0 everywhere
    judged = {v.factor: (v.first, v.second) for v in verdicts.rule_verdicts(rs.comparisons(REPORT, entries, "a0.1"),
                                                                            FACTORS)}

    assert judged["f1"] == ("yes", "no") and judged["f3"] == ("yes", "no")


def test_a_setup_factor_is_compared_with_baselines_of_its_own_setup_only():
    report = Study.model_validate({
        **REPORT.model_dump(exclude_none=True),
        "references": {**REPORT.references.model_dump(exclude_none=True), "fedprox": "fedprox"},
        "factors": [{"name": "e4", "label": "setup E=4", "fedcme": "cme-e4", "twin": "cme-e4-nx",
                     "fedavg": "avg-e4", "fedrs": "rs-e4"},
                    {"name": "f1", "label": "reading one", "fedcme": "f1", "twin": "f1-nx"}],
    })
    entries = hand_made()
    entries["main"] += runs("rs-e4", {0: 0.44}) + runs("fedprox", {0: 0.505})
    table = rs.comparisons(report, entries, "a0.1")

    e4_d, f1_d, f1_e = rs.find(table, "e4", "d"), rs.find(table, "f1", "d"), rs.find(table, "f1", "e")
    assert e4_d.subtrahend.method == "rs-e4" and rounded(e4_d.difference) == {0: 3.0}  # 0.47 - 0.44
    assert f1_d.subtrahend.method == "fedrs" and f1_e.subtrahend.method == "fedprox"
    assert rounded(f1_e.difference) == {0: 2.5}  # 0.53 - 0.505
    # e4 names no FedProx of its own: no (e) against today's, trained under another setup.
    assert rs.find(table, "e4", "e") is None


def test_two_runs_of_one_method_and_seed_are_one_error_naming_both():
    entries = {"main": [entry("fedcme", 0, 0.5), {**entry("fedcme", 0, 0.6), "experiment": "copy"}]}

    with pytest.raises(ValueError, match=r"'cifar10-a0\.1-k50m20-fedcme-s0' and 'copy' are both fedcme with seed 0"):
        rs.side_accuracies(entries, rs.Side("main", "fedcme"))


def test_factors_csv_has_a_row_per_factor_and_comparison_in_fractions():
    table = list(csv.DictReader(io.StringIO(rs.factors_csv(rows(), {"f1": "reading one"}, {"f1": "reading"},
                                                           verdicts.statuses(verdicts.seed0_moves(rows(), FACTORS))))))

    # today: b, c, d (no FedProx named); the readings f1-f3: a-d; the setups e4 and c2 name no FedRS of their own,
    # so they have no (d): a-c.
    assert len(table) == 3 + 4 * 3 + 3 * 2
    f1a = next(row for row in table if (row["factor"], row["comparison"]) == ("f1", "a"))
    assert (f1a["n"], f1a["seeds"], f1a["wins"], f1a["losses"], f1a["p_value"], f1a["moved"]) == (
        "2", "0;1", "1", "1", "n<3", "moved")
    assert abs(float(f1a["mean"]) - 0.005) < 1e-12 and f1a["label"] == "reading one"
    reference_c = next(row for row in table if (row["factor"], row["comparison"]) == ("reference", "c"))
    assert abs(float(reference_c["p_value"]) - 0.0572) < 1e-3
    e4b = next(row for row in table if (row["factor"], row["comparison"]) == ("e4", "b"))
    assert (e4b["n"], e4b["mean"], e4b["p_value"], e4b["subtrahend_method"]) == ("0", "", "", "cme-e4-nx")


# ----------------------------------------------------------------------------- the tool, end to end
def test_the_tool_writes_the_report_and_the_factor_csv_from_published_metrics(tmp_path):
    results = real_results(tmp_path)
    assert len(load_metrics(results / "sensitivity")) == 12

    written = publish_sensitivity(SENSITIVITY, results)

    docs = tmp_path / "docs"
    assert set(written) == {docs / "results-sensitivity.md", results / "sensitivity-factors.csv",
                            docs / "results-sensitivity-factors.png"}
    table = list(csv.DictReader(io.StringIO((results / "sensitivity-factors.csv").read_text())))
    assert len(table) == 4 + 5 * 11 + len(rc.COMPARISONS)  # today's b-e, 11 factors' a-e, the combination
    by_key = {(row["factor"], row["comparison"]): row for row in table}
    sample_mean_a = by_key[("sample-mean", "a")]
    expected = accuracy("cifar10-a0.1-k50m20-fedcme-mu01-s0") - accuracy("cifar10-a0.1-k50m20-fedcme-mu001-s0")
    assert (sample_mean_a["n"], sample_mean_a["seeds"], sample_mean_a["p_value"]) == ("1", "0", "n<3")
    assert float(sample_mean_a["mean"]) == pytest.approx(expected)
    today_c = by_key[("reference", "c")]
    assert (today_c["n"], today_c["seeds"]) == ("3", "0;1;2") and float(today_c["p_value"]) > 0
    assert float(by_key[("c2", "c")]["mean"]) == pytest.approx(
        accuracy("cifar10-a0.1-k50m20-moon-mu1-s0") - accuracy("cifar10-a0.1-k50m20-fedprox-mu001-s0"))
    assert (by_key[("c2", "c")]["minuend_grid"], by_key[("c2", "b")]["n"]) == ("sensitivity-c2", "0")
    assert by_key[("e4", "a")]["n"] == "0" and by_key[("e4", "a")]["moved"] == "pending"
    run = "cifar10-a0.1-k50m20-{}-s0"
    a, b, today_b = (accuracy(run.format(x)) - accuracy(run.format(y)) for x, y in (
        ("fedcme-mu01", "fedcme-mu001"), ("fedcme-mu01", "fedcme-no-alignment"), ("fedcme-mu001", "fedcme-no-exchange")))
    verdict = "helped" if a > 0 and b >= today_b else "did not help"
    assert by_key[("sample-mean", "a")]["helped"] == verdict and by_key[("e4", "a")]["helped"] == ""

    report = (docs / "results-sensitivity.md").read_text()
    for text in ("## The factors", "| sample-mean | reading | alignment per sample, mean over dimensions | "
                 "algorithm.align_loss: class_mean → sample |", "## (a) FedCME with this reading − today's FedCME",
                 "## Which factors moved on seed 0", "## The readings that helped: the combination at T=100",
                 f"{verdict} |", "| classifier2 | – | – | ", "| pending |", "## The answer", "Still without the runs of (b), (c) and (d)",
                 "![curves per factor](results-sensitivity-factors.png)", "– (not run yet)", "n<3",
                 "| c2 (setup) | fedcme-mu001 (sensitivity-c2) − fedcme-mu001 |", "CIFAR-10 α=0.1 K=50 M=20, T=50"):
        assert text in report, text
    png = (docs / "results-sensitivity-factors.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24])[0] <= 1200


def test_the_tool_on_no_published_runs_writes_a_report_of_missing_runs(tmp_path, capsys):
    results = tmp_path / "docs" / "results"
    (results / "sensitivity").mkdir(parents=True)
    (results / "sensitivity" / "NOTE.md").write_text("note")

    assert main(["--params", str(SENSITIVITY), "--results", str(results)]) == 0

    report = (tmp_path / "docs" / "results-sensitivity.md").read_text()
    assert "no factor has its runs yet, so nothing can be said." in report and "Moved: none yet." in report
    assert "wrote" in capsys.readouterr().out


def test_the_tool_without_factors_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as raised:
        main(["--params", str(REPO_ROOT / "configs" / "params-sensitivity-c2.yaml"), "--results", str(tmp_path)])

    assert raised.value.code == 2
    assert capsys.readouterr().err.strip().endswith("report.factors: none given, nothing to compare")


def test_config_changes_lists_each_differing_dotted_key_but_the_seed():
    assert config_changes({"seed": 0, "training": {"local_epochs": 10, "lr": 0.01}},
                          {"seed": 1, "training": {"local_epochs": 4, "lr": 0.01}}) == ["training.local_epochs: 10 → 4"]
