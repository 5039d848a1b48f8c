"""The results report's figures: accuracy curves over seeds and a picture of FedCME's matching.

- :func:`curves_png`: test accuracy (%) per round, one panel per setting; each method is the mean
  over its seeds with a min-max band, and has its own colour and line style, so that two
  identical curves (FedProx(0) on FedAvg) stay visible.
- :func:`matching_png`: for one FedCME experiment, the class histograms of each matched pair in an
  early and a late round, and over the rounds the mean cosine similarity of the matched pairs'
  evaluation vectors against that of random pairs (SPEC step 2; FedCME pairs the least similar).

Accuracy panels are at least 1,200 px wide, their legend outside the curves and inside the figure (the
figure is widened by the legend's measured width); the matching figure is 1,200 px wide, every axis
labelled.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

FIGURE_DPI = 200
PANEL_INCHES = (6.0, 4.0)  # 1,200 x 800 px at FIGURE_DPI
LEGEND_MARGIN_INCHES = 0.25  # beside the legend's own width: constrained layout's pads and a margin
LINE_STYLES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 1)), (0, (5, 2, 1, 2)))
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
PAIRS_SHOWN = 5  # matched pairs drawn per round: M=30 gives 15, too many panels to read side by side


def read_accuracy_curve(path: Path) -> tuple[list[int], list[float]]:
    """(rounds, test accuracies) of a history CSV; ValueError naming the file if missing or malformed."""
    if not path.is_file():
        raise ValueError(f"{path}: per-round CSV not found")
    rounds, accuracies = [], []
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        for line_number, row in enumerate(reader, start=2):
            try:
                rounds.append(int(row["round"]))
                accuracies.append(float(row["test_accuracy"]))
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"{path}: line {line_number} lacks a valid round and test_accuracy") from None
    return rounds, accuracies


def method_styles(methods: Sequence[str]) -> dict[str, dict[str, Any]]:
    """One colour, line style and marker per method, the same in every panel."""
    colormap = matplotlib.colormaps["tab10" if len(methods) <= 10 else "tab20"]
    return {
        method: {
            "color": colormap(position % colormap.N),
            "linestyle": LINE_STYLES[position % len(LINE_STYLES)],
            "marker": MARKERS[position % len(MARKERS)],
        }
        for position, method in enumerate(methods)
    }


def seed_band(curves: Sequence[tuple[list[int], list[float]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(rounds, mean, min, max) over the seeds' curves, on the rounds every seed has."""
    common = sorted(set.intersection(*(set(rounds) for rounds, _ in curves)))
    values = np.array([[dict(zip(rounds, accuracies))[r] for r in common] for rounds, accuracies in curves])
    return np.array(common), values.mean(axis=0), values.min(axis=0), values.max(axis=0)


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=FIGURE_DPI, metadata={"Software": None})
    return buffer.getvalue()


def setting_curves(
    entries: Sequence[Mapping[str, Any]], csv_directory: Path, methods: Sequence[str]
) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]]]:
    """{setting: {method: (rounds, mean, min, max, n seeds)}} of the test accuracy (fractions), settings
    and methods in their order; a method without runs in a setting is left out of it."""
    csv_directory = Path(csv_directory)
    curves: dict[str, dict[str, Any]] = {}
    for setting in dict.fromkeys(entry["setting"] for entry in entries):
        curves[setting] = {}
        for method in methods:
            runs = [entry for entry in entries if entry["setting"] == setting and entry["method"] == method]
            if runs:
                band = seed_band([read_accuracy_curve(csv_directory / f"{entry['experiment']}.csv") for entry in runs])
                curves[setting][method] = (*band, len(runs))
    return curves


def fit_legend(figure: Figure, legend: Any, panels_inches: float) -> None:
    """Widen `figure` to `panels_inches` plus the width of `legend` (placed "outside right") as drawn at
    the figure's dpi, so that constrained layout keeps both the panels' width and the whole legend."""
    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.set_figwidth(panels_inches + legend.get_window_extent(renderer).width / figure.dpi + LEGEND_MARGIN_INCHES)


def curves_png(entries: Sequence[Mapping[str, Any]], csv_directory: Path, methods: Sequence[str]) -> bytes:
    """PNG bytes of :func:`curves_figure`."""
    return _png(curves_figure(entries, csv_directory, methods))


def curves_figure(entries: Sequence[Mapping[str, Any]], csv_directory: Path, methods: Sequence[str]) -> Figure:
    """Test accuracy (%) vs round, one panel per setting, a mean line and min-max band per method; the
    legend right of the panels, the figure as wide as both."""
    curves = setting_curves(entries, csv_directory, methods)
    columns = max(1, min(2, len(curves)))
    rows = max(1, math.ceil(len(curves) / columns))
    figure = Figure(figsize=(PANEL_INCHES[0] * columns, PANEL_INCHES[1] * rows), dpi=FIGURE_DPI, layout="constrained")
    axes_grid = figure.subplots(rows, columns, squeeze=False)
    styles = method_styles(methods)
    for axes in axes_grid.flat[len(curves):]:
        axes.set_axis_off()
    handles: dict[str, Any] = {}
    for (setting, by_method), axes in zip(curves.items(), axes_grid.flat):
        for method, (rounds, mean, low, high, seeds) in by_method.items():
            style = styles[method]
            marker_every = max(1, len(rounds) // 8)
            (line,) = axes.plot(rounds, 100 * mean, color=style["color"], linestyle=style["linestyle"],
                                marker=style["marker"], markevery=marker_every, markersize=4, linewidth=1.6)
            if seeds > 1:
                axes.fill_between(rounds, 100 * low, 100 * high, color=style["color"], alpha=0.15, linewidth=0)
            handles.setdefault(f"{method} (n={seeds})" if seeds > 1 else method, line)
        axes.set_title(setting, fontsize=10)
        axes.set_xlabel("round")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.set_ylabel("test accuracy (%)")
        axes.grid(alpha=0.3)
    if handles:
        legend = figure.legend(list(handles.values()), list(handles), loc="outside right upper", fontsize=8,
                               title="mean over seeds, band: min-max", title_fontsize=8)
        fit_legend(figure, legend, PANEL_INCHES[0] * columns)
    else:
        axes_grid[0, 0].text(0.5, 0.5, "no experiments", ha="center", va="center")
    return figure


def matching_rounds(matching: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
    """The early and the late round of a matching record: the first and the last with scored pairs."""
    scored = [record for record in matching["rounds"] if record["pairs"]]
    if not scored:
        return None
    return scored[0], scored[-1]


def matching_png(runs: Sequence[Mapping[str, Any]]) -> bytes:
    """PNG bytes: the matched pairs' class histograms (runs[0], early and late round) and the cosines over rounds.

    `runs` are the matching records (``metrics/matching/<experiment>.json``) of one method and
    setting, over its seeds; the cosine panel shows their mean with a min-max band. Each round shows
    its first PAIRS_SHOWN pairs, in the matching's order.
    """
    first = runs[0]
    early, late = matching_rounds(first)
    counts = np.asarray(first["class_counts"], dtype=float)
    num_classes = counts.shape[1]
    matched = max(len(early["pairs"]), len(late["pairs"]))
    columns = min(matched, PAIRS_SHOWN)
    figure = Figure(figsize=(PANEL_INCHES[0], 2.0 * 2 + 3.0), layout="constrained")  # 1,200 px wide
    grid = figure.add_gridspec(3, columns, height_ratios=(1, 1, 1.8))
    classes = np.arange(num_classes)
    histogram_handles: tuple[list, list] = ([], [])
    for row, record in enumerate((early, late)):
        for column in range(columns):
            axes = figure.add_subplot(grid[row, column])
            if column >= len(record["pairs"]):
                axes.set_axis_off()
                continue
            a, b = record["pairs"][column]
            axes.bar(classes - 0.2, counts[a], width=0.4, color="tab:blue", label="a client")
            axes.bar(classes + 0.2, counts[b], width=0.4, color="tab:orange", label="its matched counterpart")
            axes.set_title(f"clients {a} & {b}", fontsize=6)
            axes.set_xticks(classes)
            axes.tick_params(labelsize=5)
            axes.set_xlabel("class", fontsize=6, labelpad=1)
            if column == 0:
                axes.set_ylabel(f"round {record['round']}\nsamples", fontsize=6)
                histogram_handles = axes.get_legend_handles_labels()
    axes = figure.add_subplot(grid[2, :])
    for key, label, color, style in (("matched_cosine", "matched pairs", "tab:red", "-"),
                                     ("random_cosine", "random pairs (mean over all pairs)", "tab:gray", "--")):
        curves = [([r["round"] for r in run["rounds"] if r[key] is not None],
                   [r[key] for r in run["rounds"] if r[key] is not None]) for run in runs]
        curves = [curve for curve in curves if curve[0]]
        if not curves:
            continue
        rounds, mean, low, high = seed_band(curves)
        axes.plot(rounds, mean, color=color, linestyle=style, label=label)
        if len(curves) > 1:
            axes.fill_between(rounds, low, high, color=color, alpha=0.15, linewidth=0)
    axes.set_xlabel("round", fontsize=8)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_ylabel("cosine of evaluation vectors", fontsize=8)
    axes.set_title("mean cosine similarity of pairs"
                   + (f" (mean over {len(runs)} seeds, band: min-max)" if len(runs) > 1 else ""), fontsize=8)
    axes.tick_params(labelsize=7)
    axes.grid(alpha=0.3)
    axes.legend(loc="best", fontsize=7)
    figure.legend(*histogram_handles, loc="outside lower center", ncols=2, fontsize=7, title="histograms",
                  title_fontsize=7)
    shown = "" if matched <= columns else (f"\nthe first {columns} pairs of each round ({len(early['pairs'])} and "
                                           f"{len(late['pairs'])} matched)")
    figure.suptitle(f"{first['method']}, {first['setting']} ({first['experiment']})\n"
                    f"class histograms of matched pairs, an early and a late round{shown}", fontsize=8)
    return _png(figure)
