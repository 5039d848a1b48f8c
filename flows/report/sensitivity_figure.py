"""The sensitivity study's curves: test accuracy per round, one panel per factor.

Each panel draws the factor's FedCME and its no-exchange twin, today's FedCME and twin, and the
factor's FedAvg (the reference FedAvg for a reading factor); the combination's panel (T=100) also its
FedCME(0.1) and twin, today's FedCME(0.1) and FedRS. Each is the mean over the seeds it has (the
legend's line styles are the same in every panel; (n) in the panel's title counts the seeds per run).
A run without runs yet is left out of its panel, a panel without any says so. The figure is at most
MAX_WIDTH_PX wide.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fedcme_core.config.partition_tags import entry_partition_tag

from flows.report.factors import ROLE
from flows.report.figures import read_accuracy_curve, seed_band
from flows.report.sensitivity import Side

MAX_WIDTH_PX = 1200
DPI = 100
PANEL_HEIGHT_INCHES = 3.2
# role -> (legend label, colour, line style): the study's roles (flows.report.factors.ROLE) and today's runs'
ROLE_STYLES = {
    ROLE.fedcme: ("FedCME(0.01), this reading", "tab:red", "-"),
    ROLE.twin: ("its no-exchange twin", "tab:red", "--"),
    "today_fedcme": ("FedCME(0.01), today's readings", "tab:blue", "-."),
    "today_twin": ("today's no-exchange twin", "tab:blue", ":"),
    ROLE.fedavg: ("FedAvg (this setup)", "black", (0, (6, 2))),
    # the combination's panel (T=100): FedCME(0.1) and its twin, today's FedCME(0.1), FedRS
    ROLE.strong: ("FedCME(0.1), this reading", "tab:orange", "-"),
    "strong_twin": ("FedCME(0.1)'s no-exchange twin", "tab:orange", "--"),
    ROLE.today_strong: ("FedCME(0.1), today's readings", "tab:cyan", "-."),
    ROLE.fedrs: ("FedRS (this setup)", "tab:gray", (0, (6, 2))),
    ROLE.fedprox: ("FedProx (this setup)", "tab:green", (0, (2, 2))),
}
LEGEND_COLUMNS = 5


def side_curves(entries_by_grid: Mapping[str, Sequence[Mapping[str, Any]]], folders: Mapping[str, Path],
                side: Side) -> list[tuple[list[int], list[float]]]:
    """The per-round (rounds, test accuracies) of each seed of a side that has its per-round CSV."""
    curves = []
    for entry in entries_by_grid.get(side.grid, ()):
        if entry.get("method_name") != side.method:
            continue
        if side.partition is not None and entry_partition_tag(entry) != side.partition:
            continue
        path = Path(folders[side.grid]) / f"{entry['experiment']}.csv"
        if path.is_file():
            curves.append(read_accuracy_curve(path))
    return curves


def factor_panels_png(panels: Sequence[tuple[str, Mapping[str, Side]]],
                      entries_by_grid: Mapping[str, Sequence[Mapping[str, Any]]],
                      folders: Mapping[str, Path]) -> bytes:
    """PNG bytes: one panel per (title, {role: Side}) of test accuracy (%) per round, two panels a row."""
    columns = 2 if len(panels) > 1 else 1
    rows = max(1, math.ceil(len(panels) / columns))
    figure = Figure(figsize=(MAX_WIDTH_PX / DPI, PANEL_HEIGHT_INCHES * rows + 0.6), layout="constrained")
    axes_grid = figure.subplots(rows, columns, squeeze=False)
    for axes in axes_grid.flat[len(panels):]:
        axes.set_axis_off()
    handles: dict[str, Any] = {}
    for (title, sides), axes in zip(panels, axes_grid.flat):
        counts = []
        for role, side in sides.items():
            curves = side_curves(entries_by_grid, folders, side)
            counts.append(f"{role.replace('today_', 'today ')} {len(curves)}")
            if not curves:
                continue
            rounds, mean, _, _ = seed_band(curves)
            label, color, style = ROLE_STYLES[role]
            (line,) = axes.plot(rounds, 100 * mean, color=color, linestyle=style, linewidth=1.5)
            handles.setdefault(label, line)
        if not axes.lines:
            axes.text(0.5, 0.5, "no runs yet", ha="center", va="center", transform=axes.transAxes)
        axes.set_title(f"{title}\n(seeds: {', '.join(counts)})", fontsize=8)
        axes.set_xlabel("round")
        axes.set_ylabel("test accuracy (%)")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.grid(alpha=0.3)
    labels = [label for label, _, _ in ROLE_STYLES.values() if label in handles]
    if labels:
        figure.legend([handles[label] for label in labels], labels, loc="outside upper center",
                      ncol=min(len(labels), LEGEND_COLUMNS),
                      fontsize=8, title="mean over the seeds each run has", title_fontsize=8)
    return png_at(figure)


def png_at(figure: Figure) -> bytes:
    """PNG bytes at DPI (so MAX_WIDTH_PX wide), without the Software stamp (the same figure, the same bytes)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()
