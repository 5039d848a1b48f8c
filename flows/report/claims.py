"""A paper's claims, checked against a grid's runs.

An algorithm's config class names the claims of its paper that a grid can check
(:class:`fedcme_core.algorithms.PaperClaims`: FedCME's, Nie et al., arXiv:2307.08574, Sec. IV): the
paper's reference setting of the algorithm (the reference, e.g. FedCME(0.01)), its ablations (the
reference with one piece changed) and each claim as the role it puts ahead of another. Each claim is a
paired difference over the seeds both runs share, d_s = acc_better(s) - acc_worse(s) of the final
accuracy, with the verdict

    holds:          mean d > 0, d_s > 0 on every seed and paired t-test p < 0.05 (2+ seeds), or
                    d > the reference's std over seeds (one seed: an ablation);
    not shown:      mean d > 0 but not the above;
    does not hold:  mean d <= 0.

The methods are known by their algorithm section (``methods`` of the grid file), not their names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fedcme_core.algorithms import BaseAlgorithmConfig
from fedcme_core.config.sections import MethodEntry

from flows.report.tables import difference_text, markdown_table, unique_in_order
from flows.report.seed_stats import (
    SIGNIFICANCE, PairedDifference, SeedStats, cells_by_seed, p_phrase, p_text, paired_difference, seed_stats,
)



@dataclass(frozen=True)
class ClaimCheck:
    claim: str
    setting: str
    ahead: str  # the method the claim puts ahead (its label)
    behind: str
    difference: PairedDifference

    def verdict(self, spread: float | None, reference: str) -> str:
        """`spread`: the reference's std over seeds in this setting (None with one seed); `reference`: its
        label (FedCME(0.01))."""
        d = self.difference
        if d.mean <= 0:
            return "does not hold" + (" (one seed)" if d.n == 1 else "")
        if d.n == 1:
            if spread is None:
                return "ahead on one seed, no seed spread to judge it by"
            if d.mean > spread:
                return f"holds on one seed: beyond {reference}'s seed std ({100 * spread:.2f} points)"
            return f"not shown: one seed, within {reference}'s seed std ({100 * spread:.2f} points)"
        if d.demonstrated:
            return "holds"
        return f"not shown: ahead on average, won {d.wins} of {d.n} seeds, {p_phrase(d)}"


def paper_reference(methods: Mapping[str, MethodEntry]) -> tuple[str, BaseAlgorithmConfig] | None:
    """The first method of a grid file's methods that is its paper's reference setting (FedCME(0.01)),
    with its algorithm section; None when there is none."""
    return next(((key, entry.algorithm) for key, entry in methods.items() if entry.algorithm.is_paper_reference()),
                None)


def method_roles(methods: Mapping[str, MethodEntry]) -> dict[str, str]:
    """{method key: role} for the paper's reference (the first such method) and its ablations among a grid
    file's methods."""
    found = paper_reference(methods)
    if found is None:
        return {}
    key, reference = found
    variants = {reference.model_copy(update=change): role for role, change in reference.paper.ablations.items()}
    roles = {key: "reference"}
    for other, entry in methods.items():
        if entry.algorithm in variants:
            roles[other] = variants[entry.algorithm]
    return roles


def setting_checks(cells: Mapping[str, Mapping[int, Mapping[str, Any]]], roles: Mapping[str, str],
                   setting: str, claims: Sequence[tuple[str, str, str]]) -> tuple[list[ClaimCheck], SeedStats | None]:
    """The `claims` (text, role ahead, role behind) one setting's runs can check ({method key: {seed:
    entry}}), and the reference's final accuracy."""
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
    for claim, ahead, behind in claims:
        if ahead in by_role and behind in by_role:
            difference = paired_difference(finals[by_role[ahead]], finals[by_role[behind]])
            if difference is not None:
                checks.append(ClaimCheck(claim, setting, label[by_role[ahead]], label[by_role[behind]], difference))
    return checks, finals[by_role["reference"]]


def claims_section(entries: Sequence[Mapping[str, Any]], methods: Mapping[str, MethodEntry]) -> str | None:
    """A table of the paper's claims this grid's runs can check, with their verdicts; None when it can check none."""
    roles = method_roles(methods)
    found = paper_reference(methods)
    if found is None:
        return None
    reference, paper = found[1].label(), found[1].paper
    rows = []
    for setting in unique_in_order([entry["setting"] for entry in entries]):
        in_setting = [entry for entry in entries if entry["setting"] == setting]
        cells = {next(iter(by_seed.values()))["method_name"]: by_seed
                 for by_seed in cells_by_seed(in_setting).values()}
        checks, finals = setting_checks(cells, roles, setting, paper.claims)
        spread = None if finals is None else finals.std
        for check in checks:
            rows.append((check.claim, [(check.setting, None), (f"{check.ahead} − {check.behind}", None),
                                       (difference_text(check.difference), None), (str(check.difference.n), None),
                                       (check.verdict(spread, reference), None)]))
    if not rows:
        return None
    header = ["Claim", "Setting", "Comparison", "Δ final accuracy (points)", "Seeds", "Verdict"]
    against_others = [f"; '{claim}' compares it with the grid's best other method"
                      for claim, _, behind in paper.claims if behind == "others"][:1]
    return (
        "Each claim of the paper that this grid's runs can check: the final accuracy of the run the claim "
        "puts ahead minus the other's, paired seed by seed (mean ± std over the seeds both ran). It holds "
        f"when ahead on every seed at p < {SIGNIFICANCE} (paired t), or, with one seed (the ablations), by more "
        f"than {reference}'s std over seeds{''.join(against_others)}.\n\n"
        + markdown_table(header, rows, [False] * (len(header) - 1))
    )
