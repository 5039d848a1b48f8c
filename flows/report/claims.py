"""The paper's claims, checked against a grid's runs (FedCME: Nie et al., arXiv:2307.08574, Sec. IV).

The paper claims that FedCME(0.01) (alignment weight mu = 0.01, classifier exchange, pairwise
matching) beats every other method (Table II), that the exchange is its main effect (ablation),
that pairwise matching beats many-to-one, and that exchanging the classifier beats exchanging the
whole model or the feature extractor. Each claim is a paired difference over the seeds both runs
share, d_s = acc_better(s) - acc_worse(s) of the final accuracy, with the verdict

    holds:          mean d > 0, d_s > 0 on every seed and paired t-test p < 0.05 (2+ seeds), or
                    d > FedCME(0.01)'s std over seeds (one seed: an ablation);
    not shown:      mean d > 0 but not the above;
    does not hold:  mean d <= 0.

The methods are known by their algorithm section (``methods`` of the grid file), not their names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fedcme_core.algorithms.fedcme import FedCMEConfig
from fedcme_core.config.sections import MethodEntry

from flows.report.tables import difference_text, markdown_table, unique_in_order
from flows.report.seed_stats import (
    SIGNIFICANCE, PairedDifference, SeedStats, cells_by_seed, p_phrase, p_text, paired_difference, seed_stats,
)

REFERENCE = {"mu": 0.01, "exchange": "classifier", "matching": "pairwise"}  # the paper's FedCME(0.01)
VARIANTS = {  # the ablations: the reference with one piece changed, the rest of its section the same
    "no_exchange": {"exchange": "none"},
    "no_alignment": {"mu": 0.0},
    "many_to_one": {"matching": "many_to_one"},
    "exchange_model": {"exchange": "model"},
    "exchange_extractor": {"exchange": "extractor"},
}
# (claim, the role expected ahead, the role expected behind); "reference" is FedCME(0.01), "others" the best
# other method of the setting.
CLAIMS = (
    ("FedCME(0.01) has the best final accuracy", "reference", "others"),
    ("classifier exchange helps", "reference", "no_exchange"),
    ("feature alignment helps", "reference", "no_alignment"),
    ("exchange is the main effect: removing it costs more than removing alignment", "no_alignment", "no_exchange"),
    ("pairwise matching beats many-to-one", "reference", "many_to_one"),
    ("exchanging the classifier beats exchanging the whole model", "reference", "exchange_model"),
    ("exchanging the classifier beats exchanging the extractor", "reference", "exchange_extractor"),
)


@dataclass(frozen=True)
class ClaimCheck:
    claim: str
    setting: str
    ahead: str  # the method the claim puts ahead (its label)
    behind: str
    difference: PairedDifference

    def verdict(self, spread: float | None) -> str:
        """`spread`: FedCME(0.01)'s std over seeds in this setting (None with one seed)."""
        d = self.difference
        if d.mean <= 0:
            return "does not hold" + (" (one seed)" if d.n == 1 else "")
        if d.n == 1:
            if spread is None:
                return "ahead on one seed, no seed spread to judge it by"
            if d.mean > spread:
                return f"holds on one seed: beyond FedCME(0.01)'s seed std ({100 * spread:.2f} points)"
            return f"not shown: one seed, within FedCME(0.01)'s seed std ({100 * spread:.2f} points)"
        if d.demonstrated:
            return "holds"
        return f"not shown: ahead on average, won {d.wins} of {d.n} seeds, {p_phrase(d)}"


def method_roles(methods: Mapping[str, MethodEntry]) -> dict[str, str]:
    """{method key: role} for FedCME(0.01) (the first such method) and its ablations among a grid file's methods."""
    references = [key for key, entry in methods.items() if isinstance(entry.algorithm, FedCMEConfig)
                  and all(getattr(entry.algorithm, field) == value for field, value in REFERENCE.items())]
    if not references:
        return {}
    reference = methods[references[0]].algorithm
    variants = {reference.model_copy(update=change): role for role, change in VARIANTS.items()}
    roles = {references[0]: "reference"}
    for key, entry in methods.items():
        if entry.algorithm in variants:
            roles[key] = variants[entry.algorithm]
    return roles


def setting_checks(cells: Mapping[str, Mapping[int, Mapping[str, Any]]], roles: Mapping[str, str],
                   setting: str) -> tuple[list[ClaimCheck], SeedStats | None]:
    """The claims one setting's runs can check ({method key: {seed: entry}}), and FedCME(0.01)'s final accuracy."""
    by_role = {roles[key]: key for key in cells if key in roles}
    if "reference" not in by_role:
        return [], None
    finals = {key: seed_stats(by_seed, "final_accuracy") for key, by_seed in cells.items()}
    label = {key: next(iter(by_seed.values()))["method"] for key, by_seed in cells.items()}
    others = [key for key, by_seed in cells.items() if key != by_role["reference"]
              and next(iter(by_seed.values()))["group"] == "main"]
    if others:
        by_role["others"] = max(others, key=lambda key: finals[key].mean)
    checks = []
    for claim, ahead, behind in CLAIMS:
        if ahead in by_role and behind in by_role:
            difference = paired_difference(finals[by_role[ahead]], finals[by_role[behind]])
            if difference is not None:
                checks.append(ClaimCheck(claim, setting, label[by_role[ahead]], label[by_role[behind]], difference))
    return checks, finals[by_role["reference"]]


def claims_section(entries: Sequence[Mapping[str, Any]], methods: Mapping[str, MethodEntry]) -> str | None:
    """A table of the paper's claims this grid's runs can check, with their verdicts; None when it can check none."""
    roles = method_roles(methods)
    rows = []
    for setting in unique_in_order([entry["setting"] for entry in entries]):
        in_setting = [entry for entry in entries if entry["setting"] == setting]
        cells = {next(iter(by_seed.values()))["method_name"]: by_seed
                 for by_seed in cells_by_seed(in_setting).values()}
        checks, reference = setting_checks(cells, roles, setting)
        spread = None if reference is None else reference.std
        for check in checks:
            rows.append((check.claim, [(check.setting, None), (f"{check.ahead} − {check.behind}", None),
                                       (difference_text(check.difference), None), (str(check.difference.n), None),
                                       (check.verdict(spread), None)]))
    if not rows:
        return None
    header = ["Claim", "Setting", "Comparison", "Δ final accuracy (points)", "Seeds", "Verdict"]
    return (
        "Each claim of the paper that this grid's runs can check: the final accuracy of the run the claim "
        "puts ahead minus the other's, paired seed by seed (mean ± std over the seeds both ran). It holds "
        f"when ahead on every seed at p < {SIGNIFICANCE} (paired t), or, with one seed (the ablations), by more "
        "than FedCME(0.01)'s std over seeds; 'FedCME(0.01) has the best final accuracy' compares it with "
        "the grid's best other method.\n\n"
        + markdown_table(header, rows, [False] * (len(header) - 1))
    )
