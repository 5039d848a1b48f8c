"""The setup screen at the paper's quoted point and its rule (docs/results-paper-level.md, "The rules").

FedCME (Nie et al., arXiv:2307.08574) quotes one point: CIFAR-10, alpha=0.1, (K, M) = (80, 30), round 40
(2T/5 of T=100), FedProx(0.01) 56.93% and FedCME(0.01) 61.83%. The screen trains FedProx(0.01) and
FedCME(0.01) on seed 0 at T=40 under today's setup and under one factor at a time. Per run:

- acc40: the test accuracy at round 40 (SCREEN_ROUND);
- final40: the mean test accuracy of rounds 36-40 (the last FINAL_WINDOW rounds);
- the best round and its accuracy.

The rule, committed before any screen run: a factor *raised* FedProx when its FedProx acc40 is at least
RAISE_POINTS above today's and its final40 above today's; the closest setup combines every factor that
raised it, with at most one learning rate (the one with the highest acc40); the combination *holds* when its
FedProx acc40 is also at least RAISE_POINTS above today's and at most RAISE_POINTS below the best single
factor's, else the closest setup is that best single factor. Pure functions of per-round accuracies
(fractions in, percentage points in the texts); a run not there yet is None, and its verdict "pending".
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

SCREEN_ROUND = 40
FINAL_WINDOW = 5
RAISE_POINTS = 2.0
PAPER_FEDPROX, PAPER_FEDCME = 56.93, 61.83  # the paper's FedProx(0.01) and FedCME(0.01) at round 40, percent
TODAY = "today"


@dataclass(frozen=True)
class ScreenRun:
    """One run of the screen: acc40, final40, the best accuracy and its round (fractions)."""

    acc40: float
    final40: float
    best: float
    best_round: int


def screen_run(rounds: Sequence[int], accuracies: Sequence[float], at_round: int = SCREEN_ROUND,
               window: int = FINAL_WINDOW) -> ScreenRun:
    """A run's ScreenRun from its per-round test accuracies (rounds 1..T, T >= `at_round`): acc40 at
    `at_round`, final40 the mean of the `window` rounds ending there, the best over all rounds.
    ValueError when the curve stops before `at_round`."""
    by_round = dict(zip(rounds, accuracies, strict=True))
    needed = range(at_round - window + 1, at_round + 1)
    missing = [r for r in needed if r not in by_round]
    if missing:
        raise ValueError(f"the run has no test accuracy at round {missing[0]} (it needs rounds "
                         f"{needed.start}-{at_round})")
    best_round = max(by_round, key=lambda r: (by_round[r], -r))
    return ScreenRun(acc40=by_round[at_round], final40=statistics.fmean(by_round[r] for r in needed),
                     best=by_round[best_round], best_round=best_round)


def _points(value: float) -> float:
    # 0.5337 - 0.5137 is 0.019999999999999574: compare in points, rounded
    return round(100.0 * value, 9)


def raised(today: ScreenRun | None, run: ScreenRun | None, points: float = RAISE_POINTS) -> str:
    """"yes" when `run`'s acc40 is at least `points` above `today`'s and its final40 above today's, "no"
    when not, "pending" when either run is missing."""
    if today is None or run is None:
        return "pending"
    higher = _points(run.acc40 - today.acc40) >= points and run.final40 > today.final40
    return "yes" if higher else "no"


@dataclass(frozen=True)
class Choice:
    """The closest setup by the rule: its factors (empty: today's setup), or pending with what is missing."""

    factors: tuple[str, ...]
    status: str  # "chosen" | "pending"
    missing: tuple[str, ...] = ()


def closest_setup(today: ScreenRun | None, fedprox: Mapping[str, ScreenRun | None],
                  learning_rates: Sequence[str]) -> Choice:
    """The factors that raised FedProx (`fedprox`: factor -> its FedProx run), with at most one of
    `learning_rates` (the one with the highest acc40), in the order of `fedprox`; pending while a run is
    missing."""
    missing = tuple(name for name, run in ((TODAY, today), *fedprox.items()) if run is None)
    if missing:
        return Choice((), "pending", missing)
    up = [name for name, run in fedprox.items() if raised(today, run) == "yes"]
    rates = [name for name in up if name in learning_rates]
    if len(rates) > 1:
        best_rate = max(rates, key=lambda name: fedprox[name].acc40)
        up = [name for name in up if name not in learning_rates or name == best_rate]
    return Choice(tuple(up), "chosen")


def combination_holds(today: ScreenRun | None, best_single: ScreenRun | None, combined: ScreenRun | None,
                      points: float = RAISE_POINTS) -> str:
    """"yes" when the combination's FedProx acc40 is at least `points` above today's and at most `points`
    below the best single factor's, "no" when not, "pending" when a run is missing."""
    if today is None or best_single is None or combined is None:
        return "pending"
    holds = (_points(combined.acc40 - today.acc40) >= points
             and _points(best_single.acc40 - combined.acc40) <= points)
    return "yes" if holds else "no"


def best_single(fedprox: Mapping[str, ScreenRun | None], factors: Sequence[str]) -> str | None:
    """The factor of `factors` whose FedProx acc40 is highest (None when there is none)."""
    known = [name for name in factors if fedprox.get(name) is not None]
    return max(known, key=lambda name: fedprox[name].acc40) if known else None
