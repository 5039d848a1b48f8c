"""The results report's Markdown tables, each cell a statistic over seeds (:mod:`flows.report.seed_stats`).

Table II form (final accuracy, methods x settings), Table III form (accuracy at fractions of T
and rounds to target, one setting), the paired differences against FedAvg, and the "where FedCME
does not win" text computed from the paired statistics (FedCME: Nie et al., arXiv:2307.08574).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flows.report.seed_stats import (
    REFERENCE_METHOD, SIGNIFICANCE, PairedDifference, SeedStats, cells_by_seed, p_phrase, p_text, paired_difference, seed_stats,
)

FEDCME_PREFIX = "FedCME"
MISSING_CELL = "–"  # en dash
Cell = tuple[str, float | None]  # (text, the value bold compares; None: never bold)


def unique_in_order(values: Sequence[Any]) -> list[Any]:
    """`values` without repeats, in order of first appearance."""
    return list(dict.fromkeys(values))


def markdown_text(text: str) -> str:
    """A name safe inside a Markdown table cell."""
    return str(text).replace("|", "\\|")


def stats_cell(summary: SeedStats | None, scale: float = 100.0, decimals: int = 2) -> Cell:
    """"68.20 ± 0.45 (3)"; one seed: "68.20 (1)"; no run: an en dash."""
    if summary is None:
        return MISSING_CELL, None
    mean = float(f"{scale * summary.mean:.{decimals}f}")
    spread = "" if summary.std is None else f" ± {scale * summary.std:.{decimals}f}"
    return f"{mean:.{decimals}f}{spread} ({summary.n})", mean


def markdown_table(header: Sequence[str], rows: Sequence[tuple[str, Sequence[Cell]]],
                   smaller_is_better: Sequence[bool]) -> str:
    """A Markdown table; in each column every cell whose value equals the best is bold (ties all bold).
    A column of values is right-aligned, one of text alone (every value None) left-aligned; every
    name and cell is escaped (:func:`markdown_text`)."""
    best = []
    for column, smaller in enumerate(smaller_is_better):
        present = [cells[column][1] for _, cells in rows if cells[column][1] is not None]
        best.append(None if not present else (min(present) if smaller else max(present)))
    aligned = ["---:" if any(cells[column][1] is not None for _, cells in rows) else "---"  # numbers right
               for column in range(len(header) - 1)]
    lines = ["| " + " | ".join(markdown_text(name) for name in header) + " |", "|---|" + "|".join(aligned) + "|"]
    for name, cells in rows:
        texts = [f"**{markdown_text(text)}**" if value is not None and value == best[column] else markdown_text(text)
                 for column, (text, value) in enumerate(cells)]
        lines.append("| " + " | ".join([markdown_text(name), *texts]) + " |")
    return "\n".join(lines) + "\n"


def accuracy_table(entries: Sequence[Mapping[str, Any]], key: str, local_key: str | None = None) -> str:
    """Methods x settings, entry[key] in percent (each setting's header says so), mean ± std (n) over seeds
    (Table II form); with `local_key`, each setting's column is followed by entry[local_key]'s ("local (%)"),
    an en dash where no seed of the cell has it (runs written before the local accuracy)."""
    if not entries:
        return "_No experiments._\n"
    cells = cells_by_seed(entries)
    settings = unique_in_order([entry["setting"] for entry in entries])
    keys = [key] if local_key is None else [key, local_key]
    rows = [
        (method, [stats_cell(seed_stats(cells[(method, setting)], measure)) if (method, setting) in cells
                  else (MISSING_CELL, None) for setting in settings for measure in keys])
        for method in unique_in_order([entry["method"] for entry in entries])
    ]
    header = [f"{setting} {'local ' if measure == local_key else ''}(%)" for setting in settings for measure in keys]
    return markdown_table(["Method", *header], rows, [False] * len(header))


def fraction_column_name(fraction_key: str) -> str:
    """"2/5" -> "2/5 T"; "5/5" -> "last round (T)": the accuracy after that round alone (not the final
    accuracy, which is the mean of the last rounds)."""
    numerator, denominator = fraction_key.split("/")
    return "last round (T)" if numerator == denominator else f"{fraction_key} T"


def rounds_to_target_cell(by_seed: Mapping[int, Mapping[str, Any]]) -> Cell:
    """The mean rounds to target over the seeds that reach it; "(r/n)" when only r of n do."""
    reached = [entry["rounds_to_target"] for entry in by_seed.values() if entry["rounds_to_target"] is not None]
    if not reached:
        return MISSING_CELL, None
    mean = float(f"{sum(reached) / len(reached):.1f}")
    text = f"{mean:g}" if len(reached) == len(by_seed) else f"{mean:g} ({len(reached)}/{len(by_seed)})"
    return text, (mean if len(reached) == len(by_seed) else None)


def speed_table(entries: Sequence[Mapping[str, Any]], setting: str) -> str:
    """Table III form for one setting: accuracy at k/5 T (mean ± std (n)) and rounds to target."""
    selected = [entry for entry in entries if entry["setting"] == setting]
    if not selected:
        return "_No experiments._\n"
    cells = cells_by_seed(selected)
    fraction_keys = unique_in_order([key for entry in selected for key in entry["accuracy_at"]])
    rows = []
    for method in unique_in_order([entry["method"] for entry in selected]):
        by_seed = cells[(method, setting)]
        row = [stats_cell(seed_stats(by_seed, f"accuracy_at/{key}")) for key in fraction_keys]
        rows.append((method, [*row, rounds_to_target_cell(by_seed)]))
    header = ["Method", *(f"{fraction_column_name(key)} (%)" for key in fraction_keys), "rounds to target"]
    return markdown_table(header, rows, [False] * len(fraction_keys) + [True])


def paired_differences(entries: Sequence[Mapping[str, Any]], setting: str, reference: str,
                       key: str = "final_accuracy") -> dict[str, PairedDifference]:
    """{method: method - reference over their common seeds} for the methods of one setting."""
    cells = cells_by_seed([entry for entry in entries if entry["setting"] == setting])
    if (reference, setting) not in cells:
        return {}
    base = seed_stats(cells[(reference, setting)], key)
    result = {}
    for (method, _), by_seed in cells.items():
        difference = None if method == reference else paired_difference(seed_stats(by_seed, key), base)
        if difference is not None:
            result[method] = difference
    return result


def difference_text(difference: PairedDifference) -> str:
    spread = "" if difference.std is None else f" ± {100 * difference.std:.2f}"
    return f"{100 * difference.mean:+.2f}{spread}"


def paired_table(entries: Sequence[Mapping[str, Any]], setting: str, reference: str = REFERENCE_METHOD) -> str:
    """Final accuracy minus the reference's, seed by seed: mean ± std (points), wins, seeds, paired t-test p."""
    differences = paired_differences(entries, setting, reference)
    if not differences:
        methods = {entry["method"] for entry in entries if entry["setting"] == setting}
        if reference in methods:
            return f"_No method besides {reference} in this setting yet._\n"
        return f"_No {reference} run in this setting to pair with._\n"
    lines = [f"| Method | Δ final accuracy vs {reference} (points) | seeds won | seeds | p (paired t) |",
             "|---|---:|---:|---:|---:|"]
    for method, difference in differences.items():
        lines.append(f"| {markdown_text(method)} | {difference_text(difference)} | {difference.wins} | "
                     f"{difference.n} | {p_text(difference)} |")
    return "\n".join(lines) + "\n"


def where_fedcme_does_not_win(entries: Sequence[Mapping[str, Any]]) -> str:
    """For each setting, the best FedCME variant (by mean final accuracy) against every other method, paired.

    A bullet where the other method is at least as good on average (FedCME does not win), and a
    bullet where FedCME is ahead on average but not on every seed or not at p < 0.05.
    """
    cells = cells_by_seed(entries)
    losses, unsure, compared = [], [], 0
    for setting in unique_in_order([entry["setting"] for entry in entries]):
        in_setting = {method: seed_stats(by_seed, "final_accuracy")
                      for (method, cell_setting), by_seed in cells.items() if cell_setting == setting}
        fedcme = {method: value for method, value in in_setting.items() if method.startswith(FEDCME_PREFIX)}
        if not fedcme or len(fedcme) == len(in_setting):
            continue
        best = max(fedcme, key=lambda method: fedcme[method].mean)
        compared += 1
        for method, other in in_setting.items():
            difference = None if method in fedcme else paired_difference(fedcme[best], other)
            if difference is None:
                continue
            text = (f"- {setting}: {best} vs {method}: {difference_text(difference)} points, "
                    f"won {difference.wins} of {difference.n} seeds, {p_phrase(difference)}")
            if difference.mean <= 0:
                losses.append(text)
            elif not difference.demonstrated:
                unsure.append(text)
    if compared == 0:
        return "No setting of this grid has both a FedCME run and another method's yet: nothing to compare.\n"
    parts = []
    if losses:
        parts.append("The best FedCME variant of the setting is not ahead of these methods on average "
                     "(paired over seeds, final accuracy):\n\n" + "\n".join(losses) + "\n")
    else:
        parts.append("In every setting with both, the best FedCME variant is ahead of every other method on average.\n")
    if unsure:
        parts.append(f"Ahead on average, but not on every seed or not at p < {SIGNIFICANCE} "
                     "(so not a demonstrated win):\n\n" + "\n".join(unsure) + "\n")
    return "\n".join(parts)


def ablation_entries(entries: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The FedCME reference rows (group main) of every setting with ablation rows, then the ablation rows."""
    ablations = [entry for entry in entries if entry["group"] == "ablation"]
    settings = {entry["setting"] for entry in ablations}
    references = [entry for entry in entries if entry["group"] == "main"
                  and entry["method"].startswith(FEDCME_PREFIX) and entry["setting"] in settings]
    return references + ablations
