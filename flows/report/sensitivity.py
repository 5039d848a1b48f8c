"""The sensitivity study's analysis: each factor of ``report.factors`` against today's readings, paired by seed.

A factor is FedCME with one reading (or setup) changed beside its no-exchange twin, and for a setup
factor the FedAvg of that setup (:mod:`flows.report.factors`). For each factor, over the seeds
both sides ran (:func:`flows.report.seed_stats.paired_difference`), of the final accuracy (mean of the last
rounds, ``final_accuracy``):

- (a) FedCME with this reading minus today's FedCME;
- (b) the exchange minus no exchange under this reading (FedCME minus its twin);
- (c) FedCME minus FedAvg (the setup's own FedAvg for a setup factor);
- (d) FedCME minus FedRS of the same setup (today's FedRS for a reading factor, the setup's own FedRS for a
  setup factor; a setup factor whose FedRS has not run has no (d): a baseline of another setup is no
  comparison);
- (e) FedCME minus FedProx of the same setup, in the same way, where the grid names a FedProx.

Today's readings get (b)-(e) too (the factor "reference"). What the rows decide (which factors
moved on seed 0, which readings helped, the answer to the paper's claims) is :mod:`flows.report.verdicts`.
Everything here is a pure function of loaded metrics entries ({grid: entries},
:func:`flows.report.inputs.load_metrics`); a run not there yet is missing, never an error. Fractions in,
percentage points in the Markdown.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fedcme_core.config.partition_tags import entry_partition_tag

from flows.report import tables
from flows.report.factors import ReportFactor, Study
from flows.report.tables import MISSING_CELL, markdown_text
from flows.report.seed_stats import MIN_SEEDS_FOR_P, PairedDifference, SeedStats, p_text, paired_difference

MEASURE = "final_accuracy"
REFERENCE = "reference"  # the factor name of today's readings in the tables and the CSV
COMPARISONS = {
    "a": "FedCME with this reading − today's FedCME",
    "b": "exchange − no exchange under this reading (FedCME − its twin)",
    "c": "FedCME − FedAvg (the setup's own FedAvg for a setup factor)",
    "d": "FedCME − FedRS of the same setup (a setup factor's own FedRS)",
    "e": "FedCME − FedProx of the same setup (a setup factor's own FedProx)",
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
class Sides:
    """The runs of a factor (or of today's readings) by role, the grid file's roles: FedCME with the
    reading, its no-exchange twin, and the baselines of the same setup (None: the setup has none)."""

    fedcme: Side
    twin: Side
    fedavg: Side
    fedrs: Side | None = None
    fedprox: Side | None = None

    def roles(self) -> dict[str, Side]:
        """{role: Side} of the roles it has, in order."""
        return {item.name: getattr(self, item.name) for item in dataclasses.fields(self)
                if getattr(self, item.name) is not None}

    def baselines(self) -> dict[str, Side]:
        """{comparison code: what FedCME is compared with}: (b) its twin, (c) FedAvg, (d) FedRS and (e)
        FedProx, where the setup has them."""
        codes = {"b": self.twin, "c": self.fedavg, "d": self.fedrs, "e": self.fedprox}
        return {code: side for code, side in codes.items() if side is not None}


@dataclass(frozen=True)
class Comparison:
    """One row: `minuend` - `subtrahend` of a factor under comparison `code` (a-d), paired by seed."""

    factor: str
    code: str
    minuend: Side
    subtrahend: Side
    difference: PairedDifference | None


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


def reference_sides(study: Study, partition: str | None) -> Sides:
    """Today's readings in the reference grid."""
    return Sides(**{role: Side(study.name, method, partition) for role, method in study.references.named().items()})


def factor_sides(study: Study, factor: ReportFactor, partition: str | None) -> Sides:
    """A factor's runs, in its grid and setting (default: the reference partition): FedCME, its twin and
    FedAvg, and FedRS and FedProx where the setup has them (a reading factor's are today's: trained under
    the same setup; a setup factor's only its own, since a baseline of another setup is no comparison)."""
    grid = study.factor_grid(factor)
    tag = factor.setting or (partition if grid == study.name else None)
    own = {role: Side(grid, method, tag) for role, method in factor.methods(study.references).items()}
    today = {} if is_setup(study, factor) else reference_sides(study, partition).roles()
    return Sides(**{**today, **own})


def is_setup(study: Study, factor: ReportFactor) -> bool:
    return factor.is_setup(study.references, study.name)


def comparisons(study: Study, entries_by_grid: Mapping[str, Sequence[Mapping[str, Any]]],
                partition: str | None = None) -> list[Comparison]:
    """Today's (b)-(e) (factor REFERENCE), then every factor's (a)-(e), in the order of `study.factors`;
    `partition` is the tag of the reference runs (None: any). A comparison with a baseline that the setup
    lacks (FedProx where none is named, FedRS of a setup factor that names none) is no row."""
    today = reference_sides(study, partition)
    rows = [Comparison(REFERENCE, code, today.fedcme, other, compare(entries_by_grid, today.fedcme, other))
            for code, other in today.baselines().items()]
    for factor in study.factors:
        sides = factor_sides(study, factor, partition)
        subtrahends = {"a": today.fedcme, **sides.baselines()}
        rows += [Comparison(factor.name, code, sides.fedcme, other, compare(entries_by_grid, sides.fedcme, other))
                 for code, other in subtrahends.items()]
    return rows


def find(rows: Sequence[Comparison], factor: str, code: str) -> Comparison | None:
    return next((row for row in rows if row.factor == factor and row.code == code), None)


def points_text(value: float | None, signed: bool = True) -> str:
    return MISSING_CELL if value is None else f"{100.0 * value:{'+' if signed else ''}.2f}"


def difference_text(difference: PairedDifference | None) -> str:
    """"+1.23 ± 0.45 (3)" in points; one seed: "+1.23 (1)"; none: an en dash."""
    return MISSING_CELL if difference is None else f"{tables.difference_text(difference)} ({difference.n})"


def stats_text(stats: SeedStats | None) -> str:
    """"53.37 ± 0.45 (3)" in percent; none: "– (not run yet)"."""
    return f"{MISSING_CELL} (not run yet)" if stats is None else tables.stats_cell(stats)[0]


def table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[int] = ()) -> str:
    """A Markdown table, every cell escaped; the columns whose index is in `numeric` right-aligned."""
    lines = ["| " + " | ".join(markdown_text(name) for name in header) + " |",
             "|" + "|".join("---:" if index in numeric else "---" for index in range(len(header))) + "|"]
    lines += ["| " + " | ".join(markdown_text(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def side_text(side: Side, own_grid: str) -> str:
    """"fedavg", or "fedavg (sensitivity-c2)" for a run of another grid."""
    return side.method if side.grid == own_grid else f"{side.method} ({side.grid})"


DIFFERENCE_COLUMNS = ("Δ final accuracy (points), mean ± std (n)", "Seeds won", "p (paired t)")


def difference_cells(difference: PairedDifference | None) -> list[str]:
    """The cells of DIFFERENCE_COLUMNS: "+1.23 ± 0.45 (3)", "2/3", "0.057"; en dashes when there is none."""
    won = MISSING_CELL if difference is None else f"{difference.wins}/{difference.n}"
    return [difference_text(difference), won, p_text(difference)]


def comparison_table(rows: Sequence[Comparison], code: str, setup: Sequence[str] = (), own_grid: str = "") -> str:
    """One comparison's rows: factor, what minus what, then DIFFERENCE_COLUMNS."""
    body = [[f"{row.factor} (setup)" if row.factor in setup else row.factor,
             f"{side_text(row.minuend, own_grid)} − {side_text(row.subtrahend, own_grid)}",
             *difference_cells(row.difference)] for row in rows if row.code == code]
    return table(["Factor", "Runs", *DIFFERENCE_COLUMNS], body, numeric=(2, 3, 4))


def factors_csv(rows: Sequence[Comparison], labels: Mapping[str, str], kinds: Mapping[str, str],
                moved: Mapping[str, str], helped: Mapping[str, str] = {},
                descriptions: Mapping[str, str] = COMPARISONS) -> str:
    """One row per factor and comparison (CSV_COLUMNS), differences as fractions; p_value "n<3" below 3 seeds;
    moved: {factor: its seed-0 verdict}, helped: {reading: its verdict over all its seeds} (others empty), as
    :func:`flows.report.verdicts.statuses` gives them; `descriptions`: {code: what the comparison is} of every
    row's code."""
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
