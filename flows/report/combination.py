"""The sensitivity study's combination: the readings that helped, combined and trained at T=100, beside the
committed T=100 runs of today's readings (``report.combination``, :mod:`flows.report.factors`).

Paired seed by seed over the seeds both runs have (:func:`flows.report.sensitivity.compare`), of the final
accuracy (the mean of the last rounds):

- the combined FedCME(0.01) against FedAvg, FedRS and today's FedCME(0.01);
- the combined FedCME(0.1) against its no-exchange twin (what the exchange is worth), FedAvg, FedRS and
  today's FedCME(0.1).

The paper's claims under the combination, judged as for the factors: a combined FedCME ahead of FedAvg
and FedRS in the mean (FedCME best), and the exchange ahead of no exchange on every seed. Pure functions of
loaded metrics entries ({grid: entries}); a run not there yet is missing, never an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flows.report import sensitivity as rs
from flows.report import verdicts
from flows.report.factors import ROLE as R
from flows.report.factors import ReportCombination
from flows.report.seed_stats import MIN_SEEDS_FOR_P

FACTOR = "combination"  # the factor name of these rows in the factors' CSV
ROLES = ReportCombination.role_labels()  # role: the label of its runs in the tables
COMPARISONS = {  # code: (minuend role, subtrahend role)
    "t1": (R.fedcme, R.fedavg), "t2": (R.fedcme, R.fedrs), "t3": (R.fedcme, R.today),
    "t4": (R.strong, R.twin), "t5": (R.strong, R.fedavg), "t6": (R.strong, R.fedrs), "t7": (R.strong, R.today_strong),
}
DESCRIPTIONS = {code: f"T=100: {ROLES[minuend]} − {ROLES[subtrahend]}" for code, (minuend, subtrahend)
                in COMPARISONS.items()}
# The combination's roles in its figure panel (flows.report.sensitivity_figure's roles), where they differ.
PANEL_ROLES = {R.twin: "strong_twin", R.today: "today_fedcme"}


def sides(combination: ReportCombination) -> dict[str, rs.Side]:
    """{role: Side} of every run set the combination names."""
    return {role: rs.Side(grid, method) for grid, roles in combination.methods_by_grid().items()
            for role, method in roles.items()}


def panel_sides(combination: ReportCombination) -> dict[str, rs.Side]:
    """{figure role: Side} of the combination's panel (:mod:`flows.report.sensitivity_figure`'s roles)."""
    return {PANEL_ROLES.get(role, role): side for role, side in sides(combination).items()}


def comparisons(combination: ReportCombination,
                entries_by_grid: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[rs.Comparison]:
    """The rows t1-t7, paired by seed (a difference is None until both sides have a common seed)."""
    by_role = sides(combination)
    return [rs.Comparison(FACTOR, code, by_role[minuend], by_role[subtrahend],
                          rs.compare(entries_by_grid, by_role[minuend], by_role[subtrahend]))
            for code, (minuend, subtrahend) in COMPARISONS.items()]


def verdict_text(rows: Sequence[rs.Comparison]) -> str:
    """Whether the paper's two claims hold under the combination, from the rows of `comparisons`, judged as
    for the factors (:func:`flows.report.verdicts.answer_text`): a combined FedCME ahead of FedAvg and
    FedRS in the mean, and the exchange ahead of no exchange on every seed."""
    by_code = {row.code: row for row in rows}
    if any(by_code[code].difference is None for code in ("t1", "t2", "t4", "t5", "t6")):
        return "The combination's runs are not all trained yet, so its verdict is open.\n"
    n = min(by_code[code].difference.n for code in ("t1", "t2", "t4", "t5", "t6"))
    screen = "" if n >= MIN_SEEDS_FOR_P else f" ({verdicts.SCREEN})"
    best = [name for name, codes in (("FedCME(0.01) combined", ("t1", "t2")), ("FedCME(0.1) combined", ("t5", "t6")))
            if all(by_code[code].difference.mean > 0 for code in codes)]
    exchange = by_code["t4"].difference
    claim_best = (f"FedCME best: yes for {' and '.join(best)}, ahead of FedAvg and FedRS in the mean over {n} "
                  f"seeds{screen}." if best else
                  "FedCME best: no; neither combined FedCME is ahead of both FedAvg and FedRS in the mean.")
    claim_exchange = (f"The exchange (the paper's main effect) helps: it beats no exchange on every one of {n} "
                      f"seeds{screen}." if exchange.wins == exchange.n else
                      f"The exchange (the paper's main effect) helps: no; the combined FedCME(0.1) beats its "
                      f"no-exchange twin on {exchange.wins} of {exchange.n} seeds.")
    return f"{claim_best} {claim_exchange}\n"


def section(combination: ReportCombination, entries_by_grid: Mapping[str, Sequence[Mapping[str, Any]]],
            rows: Sequence[rs.Comparison], changes: str) -> str:
    """The report's Markdown section: what was combined (`changes`: the config keys that differ from today's
    FedCME(0.01) at T=100), the final accuracies, the paired differences and the verdict."""
    by_role = sides(combination)
    accuracy = [[ROLES[role], f"{side.method} ({side.grid})", rs.stats_text(rs.side_accuracies(entries_by_grid, side))]
                for role, side in by_role.items()]
    return "\n".join([
        "## The combination at T=100\n",
        f"Combined: {', '.join(combination.readings)} ({changes}), trained at the headline setting (T=100) as "
        f"FedCME(0.01), FedCME(0.1) and FedCME(0.1) without exchange in the {combination.grid} grid, beside the "
        f"committed runs of today's readings in the {combination.against} grid (the same partitions, made from the "
        "same seeds).\n",
        rs.table(["Runs", "Method (grid)", "Final accuracy (%), mean ± std (n)"], accuracy, numeric=(2,)),
        _differences_table(rows),
        verdict_text(rows),
    ])


def _differences_table(rows: Sequence[rs.Comparison]) -> str:
    body = [[DESCRIPTIONS[row.code].removeprefix("T=100: "), *rs.difference_cells(row.difference)] for row in rows]
    return rs.table(["Comparison", *rs.DIFFERENCE_COLUMNS], body, numeric=(1, 2, 3))
