"""The sensitivity study's analysis: each factor of ``report.factors`` against today's readings, paired by seed.

A factor is FedCME with one reading (or setup) changed beside its no-exchange twin, and for a setup
factor the FedAvg of that setup (:mod:`fedcme_core.config.factors`). For each factor, over the seeds
both sides ran (:func:`flows.report.seed_stats.paired_difference`), of the final accuracy (mean of the last
rounds, ``final_accuracy``):

- (a) FedCME with this reading minus today's FedCME;
- (b) the exchange minus no exchange under this reading (FedCME minus its twin);
- (c) FedCME minus FedAvg (the setup's own FedAvg for a setup factor);
- (d) FedCME minus FedRS (the reference grid's; for a setup factor FedRS ran under today's setup).

Today's readings get (b), (c) and (d) too (the factor "reference"). A factor "moved" on seed 0 when
|a| or |b - today's b| is MOVE_POINTS or more; those train seeds 1 and 2. A reading (not a setup factor)
"helped" when, in the means over its seeds, a > 0 and b >= today's b: FedCME gained and the exchange lost
nothing; the readings that helped are combined at T=100. Everything here is a pure
function of loaded metrics entries ({grid: entries}, :func:`flows.report.inputs.load_metrics`); a
run not there yet is missing, never an error. Fractions in, percentage points in the Markdown.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fedcme_core.config.sections import ReportSection
from fedcme_core.config.factors import ReportFactor
from fedcme_core.config.partition_tags import entry_partition_tag

from flows.report.tables import MISSING_CELL, markdown_text
from flows.report.seed_stats import MIN_SEEDS_FOR_P, PairedDifference, SeedStats, p_text, paired_difference

MEASURE = "final_accuracy"
MOVE_POINTS = 1.5  # percentage points on seed 0 that send a factor to seeds 1 and 2
REFERENCE = "reference"  # the factor name of today's readings in the tables and the CSV
COMPARISONS = {
    "a": "FedCME with this reading − today's FedCME",
    "b": "exchange − no exchange under this reading (FedCME − its twin)",
    "c": "FedCME − FedAvg (the setup's own FedAvg for a setup factor)",
    "d": "FedCME − FedRS (the reference grid's FedRS, trained under today's setup)",
}
CSV_COLUMNS = ("factor", "label", "kind", "comparison", "description", "minuend_grid", "minuend_method",
               "subtrahend_grid", "subtrahend_method", "measure", "n", "seeds", "mean", "std", "wins", "losses",
               "p_value", "by_seed", "moved", "helped")


@dataclass(frozen=True)
class Side:
    """The runs of one method in one grid (and partition tag, None: any) over their seeds."""

    grid: str
    method: str
    partition: str | None = None


@dataclass(frozen=True)
class Comparison:
    """One row: `minuend` - `subtrahend` of a factor under comparison `code` (a-d), paired by seed."""

    factor: str
    code: str
    minuend: Side
    subtrahend: Side
    difference: PairedDifference | None


@dataclass(frozen=True)
class Move:
    """Seed 0 of a factor: (a), (b) - today's (b) (fractions, None: a run missing) and the verdict."""

    factor: str
    a: float | None
    b_shift: float | None
    status: str  # "moved" | "did not move" | "pending"


def side_accuracies(entries_by_grid: Mapping[str, Sequence[Mapping[str, Any]]], side: Side,
                    key: str = MEASURE) -> SeedStats | None:
    """entry[key] by seed of the side's runs; None when it has none. Two runs of one seed: ValueError naming both."""
    by_seed: dict[int, float] = {}
    names: dict[int, str] = {}
    for entry in entries_by_grid.get(side.grid, ()):
        if entry.get("method_name") != side.method or entry.get(key) is None:
            continue
        if side.partition is not None and entry_partition_tag(entry) != side.partition:
            continue
        seed = int(entry["seed"])
        if seed in by_seed:
            raise ValueError(f"experiments {names[seed]!r} and {entry['experiment']!r} are both {side.method} "
                             f"with seed {seed} in the {side.grid} grid")
        by_seed[seed], names[seed] = float(entry[key]), entry["experiment"]
    return SeedStats(dict(sorted(by_seed.items()))) if by_seed else None


def compare(entries_by_grid: Mapping[str, Sequence[Mapping[str, Any]]], minuend: Side,
            subtrahend: Side) -> PairedDifference | None:
    """minuend - subtrahend over the seeds both ran; None when either has no run or they share no seed."""
    a, b = side_accuracies(entries_by_grid, minuend), side_accuracies(entries_by_grid, subtrahend)
    return None if a is None or b is None else paired_difference(a, b)


def reference_sides(report: ReportSection, partition: str | None) -> dict[str, Side]:
    """Today's readings in the reference grid: {fedavg, fedrs, fedcme, twin: Side}."""
    return {role: Side(report.name, method, partition) for role, method in report.references.model_dump().items()}


def factor_sides(report: ReportSection, factor: ReportFactor, partition: str | None) -> dict[str, Side]:
    """A factor's runs {fedcme, twin, fedavg: Side}, in its grid and setting (default: the reference partition)."""
    grid = report.factor_grid(factor)
    tag = factor.setting or (partition if grid == report.name else None)
    return {role: Side(grid, method, tag) for role, method in factor.methods(report.references).items()}


def is_setup(report: ReportSection, factor: ReportFactor) -> bool:
    return factor.is_setup(report.references, report.name)


def comparisons(report: ReportSection, entries_by_grid: Mapping[str, Sequence[Mapping[str, Any]]],
                partition: str | None = None) -> list[Comparison]:
    """Today's (b), (c), (d) (factor REFERENCE), then every factor's (a)-(d), in the order of `report.factors`;
    `partition` is the tag of the reference runs (None: any)."""
    today = reference_sides(report, partition)
    rows = [Comparison(REFERENCE, code, today["fedcme"], today[other],
                       compare(entries_by_grid, today["fedcme"], today[other]))
            for code, other in (("b", "twin"), ("c", "fedavg"), ("d", "fedrs"))]
    for factor in report.factors:
        sides = factor_sides(report, factor, partition)
        for code, (minuend, subtrahend) in {"a": (sides["fedcme"], today["fedcme"]),
                                            "b": (sides["fedcme"], sides["twin"]),
                                            "c": (sides["fedcme"], sides["fedavg"]),
                                            "d": (sides["fedcme"], today["fedrs"])}.items():
            rows.append(Comparison(factor.name, code, minuend, subtrahend,
                                   compare(entries_by_grid, minuend, subtrahend)))
    return rows


def find(rows: Sequence[Comparison], factor: str, code: str) -> Comparison | None:
    return next((row for row in rows if row.factor == factor and row.code == code), None)


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
    """A reading over all its seeds: (a) and (b) in the mean, today's (b) in the mean (None: missing), the verdict."""

    factor: str
    a: float | None
    b: float | None
    today_b: float | None
    status: str  # "helped" | "did not help" | "pending"


def readings_that_helped(rows: Sequence[Comparison], readings: Sequence[str]) -> list[Help]:
    """Whether each reading helped: a > 0 and b >= today's b in the means over their seeds ("helped"); both
    known and not ("did not help"); else "pending" (a run still missing)."""
    today = find(rows, REFERENCE, "b").difference
    helps = []
    for factor in readings:
        a, b = find(rows, factor, "a").difference, find(rows, factor, "b").difference
        means = [None if d is None else d.mean for d in (a, b, today)]
        if None in means:
            status = "pending"
        else:
            status = "helped" if means[0] > 0 and means[1] >= means[2] else "did not help"
        helps.append(Help(factor, *means, status))
    return helps


def help_table(helps: Sequence[Help]) -> str:
    return table(["Reading", "(a), mean (points)", "(b), mean (points)", "today's (b), mean (points)", "Helped?"],
                 [[h.factor, points_text(h.a), points_text(h.b), points_text(h.today_b), h.status] for h in helps],
                 numeric=(1, 2, 3))


def exchange_helps(rows: Sequence[Comparison], factor: str) -> bool:
    """The exchange beat no exchange: (b) positive on every seed it has."""
    b = find(rows, factor, "b").difference
    return b is not None and b.wins == b.n


def fedcme_best(rows: Sequence[Comparison], factor: str) -> bool:
    """FedCME ahead of FedAvg and of FedRS: (c) and (d) positive in the mean."""
    c, d = find(rows, factor, "c").difference, find(rows, factor, "d").difference
    return c is not None and d is not None and c.mean > 0 and d.mean > 0


SCREEN = "n<3: a screen, not a demonstration"  # what a difference over fewer than MIN_SEEDS_FOR_P seeds is


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
    measured = [f for f in candidates if all(find(rows, f, code).difference is not None for code in "bcd")]
    pending = [f for f in factors if f not in measured]
    if not measured:
        return "No factor has its runs yet, so nothing can be said.\n"
    best = [f for f in measured if fedcme_best(rows, f)]
    exchange = [f for f in measured if exchange_helps(rows, f)]
    both = [f for f in best if f in exchange]
    if both:
        parts = []
        for f in both:
            b, d = find(rows, f, "b").difference, find(rows, f, "d").difference
            parts.append(f"{f} (b on {b.wins}/{b.n} seeds, {_caveat(b)}; d {difference_text(d)}, {_caveat(d)})")
        text = (f"Both claims held under {len(both)} of the {len(measured)} readings with runs (today's and the "
                "factors): " + "; ".join(parts) + ".")
    else:
        text = (f"No reading did: under none of the {len(measured)} readings with runs (today's and the factors) was "
                "FedCME ahead of both FedAvg and FedRS ((c) > 0 and (d) > 0 in the mean) while the exchange beat no "
                "exchange on every seed ((b) > 0).")
    text += (f" FedCME ahead of FedAvg and FedRS: {', '.join(best) or 'under none'}. The exchange ahead of no "
             f"exchange on every seed: {', '.join(exchange) or 'under none'}.\n")
    if pending:
        text += f"\nStill without the runs of (b), (c) and (d): {', '.join(pending)}.\n"
    return text


def points_text(value: float | None, signed: bool = True) -> str:
    return MISSING_CELL if value is None else f"{100.0 * value:{'+' if signed else ''}.2f}"


def difference_text(difference: PairedDifference | None) -> str:
    """"+1.23 ± 0.45 (3)" in points; one seed: "+1.23 (1)"; none: an en dash."""
    if difference is None:
        return MISSING_CELL
    spread = "" if difference.std is None else f" ± {100.0 * difference.std:.2f}"
    return f"{points_text(difference.mean)}{spread} ({difference.n})"


def stats_text(stats: SeedStats | None) -> str:
    """"53.37 ± 0.45 (3)" in percent; none: "– (not run yet)"."""
    if stats is None:
        return f"{MISSING_CELL} (not run yet)"
    spread = "" if stats.std is None else f" ± {100.0 * stats.std:.2f}"
    return f"{100.0 * stats.mean:.2f}{spread} ({stats.n})"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[int] = ()) -> str:
    """A Markdown table, every cell escaped; the columns whose index is in `numeric` right-aligned."""
    lines = ["| " + " | ".join(markdown_text(name) for name in header) + " |",
             "|" + "|".join("---:" if index in numeric else "---" for index in range(len(header))) + "|"]
    lines += ["| " + " | ".join(markdown_text(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def side_text(side: Side, own_grid: str) -> str:
    """"fedavg", or "fedavg (sensitivity-c2)" for a run of another grid."""
    return side.method if side.grid == own_grid else f"{side.method} ({side.grid})"


def comparison_table(rows: Sequence[Comparison], code: str, setup: Sequence[str] = (), own_grid: str = "") -> str:
    """One comparison's rows: factor, what minus what, the difference in points, seeds won, p."""
    body = []
    for row in (row for row in rows if row.code == code):
        difference = row.difference
        won = MISSING_CELL if difference is None else f"{difference.wins}/{difference.n}"
        name = f"{row.factor} (setup)" if row.factor in setup else row.factor
        body.append([name, f"{side_text(row.minuend, own_grid)} − {side_text(row.subtrahend, own_grid)}",
                     difference_text(difference), won, p_text(difference)])
    return table(["Factor", "Runs", "Δ final accuracy (points), mean ± std (n)", "Seeds won", "p (paired t)"], body,
                 numeric=(2, 3, 4))


def moves_table(moves: Sequence[Move]) -> str:
    return table(["Factor", "(a) on seed 0 (points)", "(b) − today's (b) on seed 0 (points)", "Seeds 1 and 2?"],
                 [[move.factor, points_text(move.a), points_text(move.b_shift),
                   {"moved": "yes (moved)", "did not move": "no", "pending": "pending"}[move.status]]
                  for move in moves], numeric=(1, 2))


def factors_csv(rows: Sequence[Comparison], labels: Mapping[str, str], kinds: Mapping[str, str],
                moves: Sequence[Move], helps: Sequence[Help] = (),
                descriptions: Mapping[str, str] = COMPARISONS) -> str:
    """One row per factor and comparison (CSV_COLUMNS), differences as fractions; p_value "n<3" below 3 seeds;
    moved: the seed-0 verdict, helped: a reading's verdict over all its seeds (empty for others); `descriptions`:
    {code: what the comparison is} of every row's code."""
    moved = {move.factor: move.status for move in moves}
    helped = {h.factor: h.status for h in helps}
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        d = row.difference
        p_value = "" if d is None or (d.n >= MIN_SEEDS_FOR_P and d.p_value is None) else (
            "n<3" if d.n < MIN_SEEDS_FOR_P else repr(d.p_value))
        writer.writerow([
            row.factor, labels.get(row.factor, ""), kinds.get(row.factor, ""), row.code, descriptions[row.code],
            row.minuend.grid, row.minuend.method, row.subtrahend.grid, row.subtrahend.method, MEASURE,
            0 if d is None else d.n, "" if d is None else ";".join(map(str, d.by_seed)),
            "" if d is None else repr(d.mean), "" if d is None or d.std is None else repr(d.std),
            "" if d is None else d.wins, "" if d is None else d.losses, p_value,
            "" if d is None else ";".join(f"{seed}:{value!r}" for seed, value in d.by_seed.items()),
            moved.get(row.factor, ""), helped.get(row.factor, ""),
        ])
    return buffer.getvalue()
