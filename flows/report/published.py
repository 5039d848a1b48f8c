"""Our figures beside the ones others published for the same setting (``report.published`` of a grid file).

Each published figure (for example NIID-Bench's FedAvg on CIFAR-10 Dir(0.5), 68.2%) is set beside
ours for the same method and setting, over our seeds: mean ± std (n), the gap in points, and
whether the gap is within the bound a reproduction is held to here,

    |ours - published| <= max(2 std, 2.5 points)   (one seed: 2.5 points).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedcme_core.config.params import ParamsFile

from fedcme_core.config.sections import PublishedFigure
from fedcme_core.config.partition_tags import entry_partition_tag

from flows.report.tables import MISSING_CELL, markdown_table, stats_cell
from flows.report.seed_stats import ACCURACY_KEYS, SeedStats, cells_by_seed, seed_stats

BOUND_POINTS = 2.5
MEASURE_NAMES = {"final_accuracy": "final (mean of the last rounds)", "accuracy_at_2T5": "at 2T/5",
                 "best_accuracy": "best round"}
Published = tuple[str, PublishedFigure]  # (the method's label, the figure)


def published_figures(params: ParamsFile) -> list[Published]:
    """The grid file's ``report.published``, each figure with its method's label."""
    return [(params.label(figure.method), figure) for figure in params.report.published]


def figure_runs(entries: Sequence[Mapping[str, Any]], figure: PublishedFigure) -> list[Mapping[str, Any]]:
    """Our experiments of the figure's method (the grid file's key) and setting."""
    return [entry for entry in entries
            if (entry["method_name"], entry["dataset"], entry_partition_tag(entry), int(entry["num_clients"]),
                int(entry["clients_per_round"])) == (figure.method, *figure.setting)]


def bound_points(ours: SeedStats) -> float:
    return max(2 * 100 * ours.std, BOUND_POINTS) if ours.std is not None else BOUND_POINTS


def verdict(gap: float, bound: float) -> str:
    if abs(gap) <= bound:
        return "yes"
    return f"no: {'above' if gap > 0 else 'below'} by more than {bound:.2f}"


def published_row(entries: Sequence[Mapping[str, Any]], label: str, figure: PublishedFigure) -> list[str]:
    runs = figure_runs(entries, figure)
    setting = runs[0]["setting"] if runs else figure.setting_label
    ours: SeedStats | None = None
    if runs:
        by_seed = next(iter(cells_by_seed(runs).values()))
        ours = seed_stats(by_seed, ACCURACY_KEYS[figure.measure])
    if ours is None:
        gap_text, within = MISSING_CELL, "not run yet"
    else:
        gap = 100 * ours.mean - figure.accuracy
        gap_text, within = f"{gap:+.2f}", verdict(gap, bound_points(ours))
    return [label, setting, MEASURE_NAMES[figure.measure], stats_cell(ours)[0], f"{figure.accuracy:.2f}",
            gap_text, within, figure.source]


def published_table(entries: Sequence[Mapping[str, Any]], figures: Sequence[Published]) -> str:
    """One row per published figure: ours (mean ± std (n)), theirs, the gap and whether it is within the bound."""
    header = ["Method", "Setting", "Measure", "Ours", "Published", "Ours − published (points)",
              f"within max(2 std, {BOUND_POINTS} points)", "Source"]
    rows = []
    for label, figure in figures:
        cells = published_row(entries, label, figure)
        rows.append((cells[0], [(text, None) for text in cells[1:]]))  # nothing bold: a figure a row
    return markdown_table(header, rows, [False] * (len(header) - 1))
