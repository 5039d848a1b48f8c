"""flows.report.claims: the paper's claims checked on tiny hand-computed grids."""

from __future__ import annotations

from fedcme_core.config.sections import MethodEntry
from flows.report.build import write_report
from flows.report.claims import claims_section, method_roles

from .report_helpers import LOW, metrics_entry, write_metrics_folder

METHODS = {
    "fedavg": MethodEntry.model_validate({"name": "fedavg", "label": "FedAvg"}),
    "cme": MethodEntry.model_validate({"name": "fedcme", "mu": 0.01, "label": "FedCME(0.01)"}),
    "cme-big-mu": MethodEntry.model_validate({"name": "fedcme", "mu": 0.1, "label": "FedCME(0.1)"}),
    "plain": MethodEntry.model_validate({"name": "fedcme", "exchange": "none", "label": "w/o exchange",
                                         "group": "ablation"}),
    "unaligned": MethodEntry.model_validate({"name": "fedcme", "mu": 0.0, "label": "w/o alignment",
                                             "group": "ablation"}),
}


def entry(key: str, label: str, final: float, seed: int, group: str = "main") -> dict:
    return {**metrics_entry(f"{key}-s{seed}", label, LOW, final, seed, group=group), "method_name": key}


def grid() -> list[dict]:
    """FedAvg and FedCME(0.01) over seeds 0-1, the two ablations over seed 0."""
    return [
        entry("fedavg", "FedAvg", 0.50, 0), entry("fedavg", "FedAvg", 0.52, 1),
        entry("cme", "FedCME(0.01)", 0.53, 0), entry("cme", "FedCME(0.01)", 0.54, 1),
        entry("plain", "w/o exchange", 0.50, 0, "ablation"),
        entry("unaligned", "w/o alignment", 0.535, 0, "ablation"),
    ]


def rows(text: str) -> list[list[str]]:
    lines = [line for line in text.splitlines() if line.startswith("| ")][1:]  # past the header
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def test_methods_are_known_by_their_algorithm_section_not_their_name():
    assert method_roles(METHODS) == {"cme": "reference", "plain": "no_exchange", "unaligned": "no_alignment"}


def test_an_ablation_is_the_reference_with_one_piece_changed():
    def fedcme(**section) -> MethodEntry:
        return MethodEntry.model_validate({"name": "fedcme", **section})

    methods = {"ref": fedcme(eval_fraction=0.5), "m2o": fedcme(eval_fraction=0.5, matching="many_to_one"),
               "model": fedcme(eval_fraction=0.5, exchange="model"), "other-eval": fedcme(exchange="extractor"),
               "two-changes": fedcme(eval_fraction=0.5, mu=0.0, exchange="none")}
    assert method_roles(methods) == {"ref": "reference", "m2o": "many_to_one", "model": "exchange_model"}
    assert method_roles({"mu": fedcme(mu=0.1), "avg": MethodEntry.model_validate({"name": "fedavg"})}) == {}


def test_each_claim_by_hand():
    table = rows(claims_section(grid(), METHODS))
    # FedCME(0.01) std over seeds 0.53, 0.54: 0.71 points. Against FedAvg d = 3, 2 points: 2.50 ± 0.71,
    # two seeds give no p-value (a t on 1 df): "n<3".
    assert table == [
        ["FedCME(0.01) has the best final accuracy", LOW, "FedCME(0.01) − FedAvg", "+2.50 ± 0.71", "2",
         "not shown: ahead on average, won 2 of 2 seeds, n<3, no p-value"],
        ["classifier exchange helps", LOW, "FedCME(0.01) − w/o exchange", "+3.00", "1",
         "holds on one seed: beyond FedCME(0.01)'s seed std (0.71 points)"],
        ["feature alignment helps", LOW, "FedCME(0.01) − w/o alignment", "-0.50", "1", "does not hold (one seed)"],
        ["exchange is the main effect: removing it costs more than removing alignment", LOW,
         "w/o alignment − w/o exchange", "+3.50", "1",
         "holds on one seed: beyond FedCME(0.01)'s seed std (0.71 points)"],
    ]


def test_a_better_method_makes_the_first_claim_fail_and_a_small_gain_stays_within_the_spread():
    entries = [*grid(), entry("cme-big-mu", "FedCME(0.1)", 0.56, 0), entry("cme-big-mu", "FedCME(0.1)", 0.55, 1)]
    entries = [{**e, "final_accuracy": 0.525} if e["experiment"] == "plain-s0" else e for e in entries]
    table = {row[0]: row for row in rows(claims_section(entries, METHODS))}
    assert table["FedCME(0.01) has the best final accuracy"][2:] == [
        "FedCME(0.01) − FedCME(0.1)", "-2.00 ± 1.41", "2", "does not hold"]
    assert table["classifier exchange helps"][3:] == [
        "+0.50", "1", "not shown: one seed, within FedCME(0.01)'s seed std (0.71 points)"]


def test_a_significant_win_on_every_seed_holds():
    entries = [entry("fedavg", "FedAvg", value, seed) for seed, value in enumerate((0.50, 0.52, 0.51))]
    entries += [entry("cme", "FedCME(0.01)", value, seed) for seed, value in enumerate((0.55, 0.56, 0.56))]
    (row,) = rows(claims_section(entries, METHODS))
    assert row[3:] == ["+4.67 ± 0.58", "3", "holds"]  # d = 5, 4, 5: t = 14, p = 0.005


def test_nothing_to_check_without_fedcme_0_01_or_without_its_methods():
    without_reference = [e for e in grid() if e["method_name"] != "cme"]
    assert claims_section(without_reference, METHODS) is None
    assert claims_section(grid(), {}) is None


def test_the_report_checks_the_claims_only_with_the_grid_files_methods(tmp_path):
    metrics = write_metrics_folder(tmp_path / "metrics", grid())

    write_report(metrics, tmp_path / "with.md", tmp_path / "with.png", methods=METHODS)
    write_report(metrics, tmp_path / "without.md", tmp_path / "without.png")

    with_methods = (tmp_path / "with.md").read_text(encoding="utf-8")
    assert "## The paper's claims here\n\n" + claims_section(grid(), METHODS) in with_methods
    assert with_methods.index("## The paper's claims here") < with_methods.index("## Where FedCME does not win")
    assert "## The paper's claims here" not in (tmp_path / "without.md").read_text(encoding="utf-8")
