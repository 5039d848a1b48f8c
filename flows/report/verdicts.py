"""The sensitivity study's verdicts, read from its paired comparisons (:func:`flows.report.sensitivity.comparisons`).

- A factor "moved" on seed 0 when |a| or |b - today's b| is MOVE_POINTS or more; those train seeds 1 and 2.
- A reading (not a setup factor) "helped" when, in the means over its seeds, a > 0 and b >= today's b
  (today's over the same seeds): FedCME gained and the exchange lost nothing. The readings that helped are
  combined at T=100 (:mod:`flows.report.combination`).
- The answer, under two rules, in the order they were written:
  1. the study's first rule (FIRST_RULE, committed before any result): the exchange ahead of no exchange on
     every seed ((b) > 0) while FedCME is ahead of FedAvg in the mean ((c) > 0);
  2. the stricter rule added after results were in (SECOND_RULE): the paper's two claims (FedCME: Nie et
     al., arXiv:2307.08574), FedCME best ((c) > 0 and (d) > 0 in the mean, (d) against the FedRS of the
     same setup) and the exchange the main effect ((b) > 0 on every seed).

Pure functions of the comparison rows; a run not there yet makes a verdict "pending", never an error.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from flows.report.sensitivity import REFERENCE, Comparison, difference_text, find, points_text, table
from flows.report.tables import MISSING_CELL
from flows.report.seed_stats import MIN_SEEDS_FOR_P, PairedDifference, p_text

FIRST_RULE = ("4f727db", "2026-12-05 20:11 UTC")  # commit and time the first rule was committed
SECOND_RULE = ("d91dd6c", "2026-12-06 08:40 UTC")  # commit and time (d) > 0 was added to it
MOVE_POINTS = 1.5  # percentage points on seed 0 that send a factor to seeds 1 and 2
SCREEN = "n<3: a screen, not a demonstration"  # what a difference over fewer than MIN_SEEDS_FOR_P seeds is


@dataclass(frozen=True)
class Move:
    """Seed 0 of a factor: (a), (b) - today's (b) (fractions, None: a run missing) and the verdict."""

    factor: str
    a: float | None
    b_shift: float | None
    status: str  # "moved" | "did not move" | "pending"


def _seed(difference: PairedDifference | None, seed: int) -> float | None:
    return None if difference is None else difference.by_seed.get(seed)


def _at_least(value: float, points: float) -> bool:
    # 0.5337 - 0.5187 is 0.015000000000000013 or 0.01499999...: compare in points, rounded
    return round(abs(100.0 * value), 9) >= points


def seed0_moves(rows: Sequence[Comparison], factors: Sequence[str], seed: int = 0,
                points: float = MOVE_POINTS) -> list[Move]:
    """Whether each factor moved on `seed`: |a| >= points or |b - today's b| >= points ("moved"); both known
    and below ("did not move"); else "pending" (a run still missing)."""
    today_b = _seed(find(rows, REFERENCE, "b").difference, seed)
    moves = []
    for factor in factors:
        a = _seed(find(rows, factor, "a").difference, seed)
        b = _seed(find(rows, factor, "b").difference, seed)
        shift = None if b is None or today_b is None else b - today_b
        known = [value for value in (a, shift) if value is not None]
        if any(_at_least(value, points) for value in known):
            status = "moved"
        else:
            status = "did not move" if len(known) == 2 else "pending"
        moves.append(Move(factor, a, shift, status))
    return moves


@dataclass(frozen=True)
class Help:
    """A reading over its seeds: (a) in the mean; (b) and today's (b) in the means over the seeds both have
    (None: missing); the verdict."""

    factor: str
    a: float | None
    b: float | None
    today_b: float | None
    status: str  # "helped" | "did not help" | "pending"


def readings_that_helped(rows: Sequence[Comparison], readings: Sequence[str]) -> list[Help]:
    """Whether each reading helped: a > 0 in the mean over its seeds, and b >= today's b in the means over
    the seeds both have, so that a reading screened on seed 0 alone is held against today's seed 0
    ("helped"); both known and not ("did not help"); else "pending" (a run still missing)."""
    today = find(rows, REFERENCE, "b").difference
    helps = []
    for factor in readings:
        a, b = find(rows, factor, "a").difference, find(rows, factor, "b").difference
        seeds = [] if b is None or today is None else [seed for seed in b.by_seed if seed in today.by_seed]
        if a is None or not seeds:
            helps.append(Help(factor, None if a is None else a.mean, None, None, "pending"))
            continue
        b_mean, today_mean = (statistics.fmean(d.by_seed[seed] for seed in seeds) for d in (b, today))
        status = "helped" if a.mean > 0 and b_mean >= today_mean else "did not help"
        helps.append(Help(factor, a.mean, b_mean, today_mean, status))
    return helps


def help_table(helps: Sequence[Help]) -> str:
    return table(["Reading", "(a), mean (points)", "(b), mean (points)", "today's (b) on the same seeds, mean (points)",
                  "Helped?"],
                 [[h.factor, points_text(h.a), points_text(h.b), points_text(h.today_b), h.status] for h in helps],
                 numeric=(1, 2, 3))


def _difference(rows: Sequence[Comparison], factor: str, code: str) -> PairedDifference | None:
    """The factor's comparison `code`; None when it has no such row or the row's runs are missing."""
    row = find(rows, factor, code)
    return None if row is None else row.difference


def exchange_helps(rows: Sequence[Comparison], factor: str) -> bool:
    """The exchange beat no exchange: (b) positive on every seed it has."""
    b = _difference(rows, factor, "b")
    return b is not None and b.wins == b.n


def fedcme_ahead_of_fedavg(rows: Sequence[Comparison], factor: str) -> bool:
    """(c) positive in the mean."""
    c = _difference(rows, factor, "c")
    return c is not None and c.mean > 0


def fedcme_best(rows: Sequence[Comparison], factor: str) -> bool:
    """FedCME ahead of FedAvg and of the same setup's FedRS: (c) and (d) positive in the mean."""
    d = _difference(rows, factor, "d")
    return fedcme_ahead_of_fedavg(rows, factor) and d is not None and d.mean > 0


@dataclass(frozen=True)
class RuleVerdict:
    """One reading (or setup) under both rules: "yes", "no" or "pending" (a run of the rule missing)."""

    factor: str
    first: str
    second: str


def rule_verdicts(rows: Sequence[Comparison], factors: Sequence[str]) -> list[RuleVerdict]:
    """Today's readings (REFERENCE) and each factor under the first rule ((b) > 0 on every seed and (c) > 0)
    and the second ((b) > 0 on every seed, (c) > 0 and (d) > 0)."""
    verdicts = []
    for factor in (REFERENCE, *factors):
        known = {code: _difference(rows, factor, code) is not None for code in "bcd"}
        first = ("yes" if exchange_helps(rows, factor) and fedcme_ahead_of_fedavg(rows, factor) else "no") \
            if known["b"] and known["c"] else "pending"
        second = ("yes" if exchange_helps(rows, factor) and fedcme_best(rows, factor) else "no") \
            if all(known.values()) else "pending"
        verdicts.append(RuleVerdict(factor, first, second))
    return verdicts


def rules_table(rows: Sequence[Comparison], verdicts: Sequence[RuleVerdict]) -> str:
    """Each reading's (b) seeds won, (c) and (d) means and its verdict under each rule."""
    body = []
    for verdict in verdicts:
        b, c, d = (_difference(rows, verdict.factor, code) for code in "bcd")
        body.append([verdict.factor, MISSING_CELL if b is None else f"{b.wins}/{b.n}",
                     points_text(None if c is None else c.mean), points_text(None if d is None else d.mean),
                     verdict.first, verdict.second])
    return table(["Reading", "(b) > 0: seeds", "(c), mean (points)", "(d), mean (points)",
                  f"First rule ({FIRST_RULE[0]})", f"Second rule ({SECOND_RULE[0]})"], body, numeric=(1, 2, 3))


def first_rule_text(verdicts: Sequence[RuleVerdict]) -> str:
    """The answer under the first rule, in one paragraph: the readings where it held, and those pending."""
    measured = [v for v in verdicts if v.first != "pending"]
    held = [v.factor for v in measured if v.first == "yes"]
    pending = [v.factor for v in verdicts if v.first == "pending"]
    text = (f"Under the first rule ({FIRST_RULE[0]}, committed {FIRST_RULE[1]}, before any result: the exchange "
            "ahead of no exchange on every seed, (b) > 0, while FedCME is ahead of FedAvg in the mean, (c) > 0), "
            f"the answer is yes under {len(held)} of the {len(measured)} readings with runs"
            + (f": {', '.join(held)}." if held else "."))
    if pending:
        text += f" Still without the runs of (b) and (c): {', '.join(pending)}."
    return text + "\n"


def _caveat(difference: PairedDifference) -> str:
    if difference.n < MIN_SEEDS_FOR_P:
        return SCREEN
    return f"p = {p_text(difference)}" + (", demonstrated" if difference.demonstrated else
                                          ", not demonstrated at p < 0.05")


def answer_text(rows: Sequence[Comparison], factors: Sequence[str]) -> str:
    """The automatic answer to the paper's two claims, under today's readings and each factor with runs of
    (b), (c) and (d): FedCME best (ahead of FedAvg and FedRS in the mean) and the exchange helping (ahead of
    no exchange on every seed); where both held, with their seeds and p; else that none did; what is missing."""
    candidates = [REFERENCE, *factors]
    measured = [f for f in candidates if all(_difference(rows, f, code) is not None for code in "bcd")]
    pending = [f for f in factors if f not in measured]
    heading = (f"Under the second rule ({SECOND_RULE[0]}, added {SECOND_RULE[1]}, after the first factors' runs "
               "were in, to judge the paper's claim that FedCME is best: (d) > 0 against the FedRS of the same setup "
               "as well): ")
    if not measured:
        return heading + "no factor has its runs yet, so nothing can be said.\n"
    best = [f for f in measured if fedcme_best(rows, f)]
    exchange = [f for f in measured if exchange_helps(rows, f)]
    both = [f for f in best if f in exchange]
    if both:
        parts = []
        for f in both:
            b, d = _difference(rows, f, "b"), _difference(rows, f, "d")
            parts.append(f"{f} (b on {b.wins}/{b.n} seeds, {_caveat(b)}; d {difference_text(d)}, {_caveat(d)})")
        text = heading + (f"both claims held under {len(both)} of the {len(measured)} readings with runs (today's and the "
                "factors): " + "; ".join(parts) + ".")
    else:
        text = heading + (f"no reading did: under none of the {len(measured)} readings with runs (today's and the factors) was "
                "FedCME ahead of both FedAvg and FedRS ((c) > 0 and (d) > 0 in the mean) while the exchange beat no "
                "exchange on every seed ((b) > 0).")
    text += (f" FedCME ahead of FedAvg and FedRS: {', '.join(best) or 'under none'}. The exchange ahead of no "
             f"exchange on every seed: {', '.join(exchange) or 'under none'}.\n")
    if pending:
        text += f"\nStill without the runs of (b), (c) and (d): {', '.join(pending)}.\n"
    return text


def moves_table(moves: Sequence[Move]) -> str:
    return table(["Factor", "(a) on seed 0 (points)", "(b) − today's (b) on seed 0 (points)", "Seeds 1 and 2?"],
                 [[move.factor, points_text(move.a), points_text(move.b_shift),
                   {"moved": "yes (moved)", "did not move": "no", "pending": "pending"}[move.status]]
                  for move in moves], numeric=(1, 2))


def statuses(verdicts: Iterable[Move | Help]) -> dict[str, str]:
    """{factor: status} of moves or helps, as the factors' CSV takes them."""
    return {verdict.factor: verdict.status for verdict in verdicts}
