"""The results report of an experiment grid: Markdown tables and accuracy curves.

It reproduces the forms in which FedCME's paper (Nie et al., arXiv:2307.08574) reports
its results: Table II (final test accuracy, methods x settings, best per column in bold),
Table III (test accuracy at T/5, 2T/5, ..., T and rounds to a target accuracy, for one
setting), the ablation comparison (its Table IV and Figures 3-5) and test-accuracy-vs-round
curves. Each experiment contributes ``metrics/<experiment>.json`` (the output of
:func:`fedcme_core.metrics.summarize` plus ``experiment``, ``method``, ``setting`` and
``group``) and ``metrics/<experiment>.csv`` (:func:`fedcme_core.metrics.history_csv`).

:func:`write_report` writes the Markdown report and its PNG figures, each atomically; it
also lists, automatically, the settings where a baseline beats every FedCME variant.

    python -m flows.report --metrics metrics --markdown reports/results.md --png reports/accuracy.png
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fedcme_core.checkpoints import atomic_write_bytes
from fedcme_core.metrics import verify_content_hash

IDENTIFYING_KEYS = ("experiment", "method", "setting", "group")
SUMMARY_KEYS = ("rounds", "final_accuracy", "best_accuracy", "accuracy_at", "rounds_to_target")
REQUIRED_KEYS = IDENTIFYING_KEYS + SUMMARY_KEYS
GROUPS = ("main", "ablation")
FEDCME_PREFIX = "FedCME"
MISSING_CELL = "–"  # en dash
DEFAULT_FINAL_WINDOW = 5
FIGURE_DPI = 120


def load_metrics(directory: Path) -> list[dict[str, Any]]:
    """Every ``*.json`` metrics file of `directory`, sorted by file name.

    Raises ValueError naming the file when it is not valid JSON, not an object, does not
    match its ``content_sha256``, lacks a required key (named too) or has a group other than
    "main" / "ablation".
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"{directory}: metrics folder not found")
    entries = []
    for path in sorted(directory.glob("*.json")):
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"{path}: not valid JSON ({error})") from None
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: expected a JSON object, got {type(entry).__name__}")
        verify_content_hash(entry, str(path))
        for key in REQUIRED_KEYS:
            if key not in entry:
                raise ValueError(f"{path}: lacks the required key {key!r}")
        if entry["group"] not in GROUPS:
            raise ValueError(f"{path}: key 'group' must be one of {GROUPS}, got {entry['group']!r}")
        entries.append(entry)
    return entries


def percent_cell_value(accuracy: float) -> float:
    """The accuracy as shown in a table (percent, 2 decimals); bold and ties compare these."""
    return float(f"{100.0 * accuracy:.2f}")


def format_percent(value: float) -> str:
    """A percent cell: 2 decimals."""
    return f"{value:.2f}"


def format_rounds(value: float) -> str:
    """A round-count cell: an integer."""
    return str(int(value))


def markdown_text(text: str) -> str:
    """A name safe inside a Markdown table cell."""
    return str(text).replace("|", "\\|")


def unique_in_order(values: Sequence[Any]) -> list[Any]:
    """`values` without repeats, in order of first appearance."""
    return list(dict.fromkeys(values))


def index_by_method_and_setting(entries: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], Mapping[str, Any]]:
    """{(method, setting): entry}; two experiments for the same cell raise ValueError naming both."""
    cells: dict[tuple[str, str], Mapping[str, Any]] = {}
    for entry in entries:
        key = (entry["method"], entry["setting"])
        if key in cells:
            raise ValueError(
                f"experiments {cells[key]['experiment']!r} and {entry['experiment']!r} are both "
                f"method {key[0]!r} in setting {key[1]!r} (group {entry['group']!r})"
            )
        cells[key] = entry
    return cells


def markdown_table(
    header: Sequence[str],
    rows: Sequence[tuple[str, Sequence[float | None]]],
    *,
    column_formats: Sequence[Callable[[float], str]],
    smaller_is_better: Sequence[bool],
) -> str:
    """A Markdown table of rows (name, values per column); the best value of each column in bold.

    `values` hold the numbers as displayed, written by the column's format; None shows as an
    en dash. Every cell equal to a column's best is bold, so ties are all bold.
    """
    best_per_column = []
    for column, smaller in enumerate(smaller_is_better):
        present = [values[column] for _, values in rows if values[column] is not None]
        best_per_column.append(None if not present else (min(present) if smaller else max(present)))
    lines = [
        "| " + " | ".join(markdown_text(name) for name in header) + " |",
        "|---|" + "---:|" * (len(header) - 1),
    ]
    for name, values in rows:
        cells = [markdown_text(name)]
        for value, best, format_value in zip(values, best_per_column, column_formats):
            if value is None:
                cells.append(MISSING_CELL)
            elif value == best:
                cells.append(f"**{format_value(value)}**")
            else:
                cells.append(format_value(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def accuracy_table(entries: Sequence[Mapping[str, Any]], value_key: str) -> str:
    """Methods x settings table of entry[value_key] in percent (Table II form)."""
    if not entries:
        return "_No experiments._\n"
    cells = index_by_method_and_setting(entries)
    methods = unique_in_order([entry["method"] for entry in entries])
    settings = unique_in_order([entry["setting"] for entry in entries])
    rows = []
    for method in methods:
        values = []
        for setting in settings:
            entry = cells.get((method, setting))
            value = None if entry is None else entry.get(value_key)
            values.append(None if value is None else percent_cell_value(value))
        rows.append((method, values))
    return markdown_table(
        ["Method", *settings],
        rows,
        column_formats=[format_percent] * len(settings),
        smaller_is_better=[False] * len(settings),
    )


def results_table(entries: Sequence[Mapping[str, Any]], value_key: str = "final_accuracy", group: str = "main") -> str:
    """The paper's Table II form for one group: rows = methods, columns = settings, percent."""
    return accuracy_table([entry for entry in entries if entry["group"] == group], value_key)


def fraction_column_name(fraction_key: str) -> str:
    """"2/5" -> "2/5 T"; "5/5" -> "T"."""
    numerator, denominator = fraction_key.split("/")
    return "T" if numerator == denominator else f"{fraction_key} T"


def speed_table(entries: Sequence[Mapping[str, Any]], setting: str, group: str = "main") -> str:
    """The paper's Table III form for one setting: accuracy at fractions of T and rounds to target.

    Rows = methods of `group` run in `setting`; columns = "1/5 T" ... "T" (from each entry's
    ``accuracy_at``) and "rounds to target" (en dash when not reached); the best of each
    column is bold: the highest accuracy, the fewest rounds.
    """
    selected = [entry for entry in entries if entry["group"] == group and entry["setting"] == setting]
    if not selected:
        return "_No experiments._\n"
    index_by_method_and_setting(selected)
    fraction_keys = unique_in_order([key for entry in selected for key in entry["accuracy_at"]])
    rows = []
    for entry in selected:
        accuracy_at = entry["accuracy_at"]
        values: list[float | None] = [
            percent_cell_value(accuracy_at[key]) if accuracy_at.get(key) is not None else None for key in fraction_keys
        ]
        rounds_to_target = entry["rounds_to_target"]
        values.append(None if rounds_to_target is None else float(rounds_to_target))
        rows.append((entry["method"], values))
    header = ["Method", *(fraction_column_name(key) for key in fraction_keys), "rounds to target"]
    return markdown_table(
        header,
        rows,
        column_formats=[format_percent] * len(fraction_keys) + [format_rounds],
        smaller_is_better=[False] * len(fraction_keys) + [True],
    )


def ablation_entries(entries: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The FedCME reference rows (group main) of every setting with ablation rows, then the ablation rows."""
    ablations = [entry for entry in entries if entry["group"] == "ablation"]
    ablation_settings = {entry["setting"] for entry in ablations}
    references = [
        entry
        for entry in entries
        if entry["group"] == "main"
        and entry["method"].startswith(FEDCME_PREFIX)
        and entry["setting"] in ablation_settings
    ]
    return references + ablations


def ablation_table(entries: Sequence[Mapping[str, Any]]) -> str:
    """Final accuracy of the ablation rows beside the FedCME reference rows of the same settings."""
    return accuracy_table(ablation_entries(entries), "final_accuracy")


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


def method_colors(entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One color per method, the same in every panel."""
    methods = unique_in_order([entry["method"] for entry in entries])
    colormap = matplotlib.colormaps["tab10" if len(methods) <= 10 else "tab20"]
    return {method: colormap(position % colormap.N) for position, method in enumerate(methods)}


def curves_png(entries: Sequence[Mapping[str, Any]], csv_directory: Path) -> bytes:
    """PNG bytes: test accuracy (%) vs round, one panel per setting, one line per method."""
    csv_directory = Path(csv_directory)
    settings = unique_in_order([entry["setting"] for entry in entries])
    columns = max(1, min(4, len(settings)))
    rows = max(1, math.ceil(len(settings) / columns))
    figure = Figure(figsize=(4.5 * columns, 3.4 * rows), layout="constrained")
    axes_grid = figure.subplots(rows, columns, squeeze=False)
    colors = method_colors(entries)
    for axes in axes_grid.flat[len(settings):]:
        axes.set_axis_off()
    for setting, axes in zip(settings, axes_grid.flat):
        for entry in entries:
            if entry["setting"] != setting:
                continue
            rounds, accuracies = read_accuracy_curve(csv_directory / f"{entry['experiment']}.csv")
            percent = [100.0 * value for value in accuracies]
            axes.plot(rounds, percent, label=entry["method"], color=colors[entry["method"]])
        axes.set_title(setting, fontsize=10)
        axes.set_xlabel("round")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.set_ylabel("test accuracy (%)")
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7)
    if not settings:
        axes_grid[0, 0].text(0.5, 0.5, "no experiments", ha="center", va="center")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=FIGURE_DPI)
    return buffer.getvalue()


def accuracy_figure(entries: Sequence[Mapping[str, Any]], csv_directory: Path, path: Path) -> None:
    """Test accuracy vs round of the main group (one panel per setting), written atomically as PNG."""
    main_entries = [entry for entry in entries if entry["group"] == "main"]
    atomic_write_bytes(path, curves_png(main_entries, csv_directory))


def ablation_figure(entries: Sequence[Mapping[str, Any]], csv_directory: Path, path: Path) -> None:
    """The same curves for the ablation rows and their FedCME references, written atomically as PNG."""
    atomic_write_bytes(path, curves_png(ablation_entries(entries), csv_directory))


def settings_where_fedcme_does_not_win(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """Markdown bullets: settings (main group) where the best baseline beats every FedCME row.

    Compares final accuracy as displayed (percent, 2 decimals), so a tie is not a loss.
    Settings without both a FedCME row and a baseline row are skipped.
    """
    main_entries = [entry for entry in entries if entry["group"] == "main" and entry["final_accuracy"] is not None]
    bullets = []
    for setting in unique_in_order([entry["setting"] for entry in main_entries]):
        in_setting = [entry for entry in main_entries if entry["setting"] == setting]
        fedcme = [entry for entry in in_setting if entry["method"].startswith(FEDCME_PREFIX)]
        baselines = [entry for entry in in_setting if not entry["method"].startswith(FEDCME_PREFIX)]
        if not fedcme or not baselines:
            continue
        best_fedcme = max(percent_cell_value(entry["final_accuracy"]) for entry in fedcme)
        best_baseline = max(percent_cell_value(entry["final_accuracy"]) for entry in baselines)
        if best_baseline <= best_fedcme:
            continue
        baseline_names = " / ".join(
            entry["method"] for entry in baselines if percent_cell_value(entry["final_accuracy"]) == best_baseline
        )
        fedcme_names = " / ".join(
            entry["method"] for entry in fedcme if percent_cell_value(entry["final_accuracy"]) == best_fedcme
        )
        bullets.append(
            f"- {setting}: {baseline_names} {best_baseline:.2f} vs best FedCME, {fedcme_names}, {best_fedcme:.2f}"
        )
    return bullets


def final_window_description(entries: Sequence[Mapping[str, Any]]) -> str:
    """"the last 5 rounds" (or the windows used, when the experiments differ)."""
    windows = sorted({int(entry.get("final_window", DEFAULT_FINAL_WINDOW)) for entry in entries})
    if len(windows) == 1:
        return f"the last {windows[0]} rounds"
    return "the last " + " / ".join(str(window) for window in windows) + " rounds (it differs between experiments)"


def target_description(entries: Sequence[Mapping[str, Any]]) -> str:
    """A sentence naming the target accuracy of these experiments (or saying that none is set)."""
    targets = unique_in_order([entry.get("target_accuracy") for entry in entries])
    targets = [target for target in targets if target is not None]
    if not targets:
        return "No target accuracy was set, so rounds to target is empty.\n"
    return "Target accuracy: " + " / ".join(f"{100.0 * target:.2f}%" for target in targets) + ".\n"


def relative_link(target: Path, markdown_path: Path) -> str:
    """The path of `target` as seen from the folder of `markdown_path`, with forward slashes."""
    return Path(os.path.relpath(Path(target).resolve(), Path(markdown_path).resolve().parent)).as_posix()


def report_markdown(
    entries: Sequence[Mapping[str, Any]],
    *,
    title: str,
    accuracy_png_link: str,
    ablation_png_link: str | None,
) -> str:
    """The report's Markdown text (figures are linked, not written, here)."""
    main_entries = [entry for entry in entries if entry["group"] == "main"]
    fractions = unique_in_order([key for entry in main_entries for key in entry["accuracy_at"]])
    fraction_text = ", ".join(fraction_column_name(key) for key in fractions) or "fractions of T"
    parts = [
        f"# {title}\n",
        (
            f"Final accuracy = mean test accuracy of {final_window_description(entries)} of each run "
            f"(all rounds when a run is shorter). Table III form = test accuracy after round ceil(k T / n) "
            f"at {fraction_text}; rounds to target = the first round whose test accuracy reaches the target. "
            f"Accuracies in percent, best of each column in bold (ties all bold), {MISSING_CELL} = not run. "
            f"Paper: FedCME, Nie et al., arXiv:2307.08574.\n"
        ),
        "## Final test accuracy (Table II form)\n",
        results_table(entries),
        "## Test accuracy per round\n",
        f"![accuracy]({accuracy_png_link})\n",
    ]
    for setting in unique_in_order([entry["setting"] for entry in main_entries]):
        in_setting = [entry for entry in main_entries if entry["setting"] == setting]
        parts += [
            f"## Accuracy at fractions of T: {setting} (Table III form)\n",
            target_description(in_setting),
            speed_table(entries, setting),
        ]
    if ablation_png_link is not None:
        parts += [
            "## Ablations\n",
            "Final test accuracy of the ablation runs beside the FedCME runs of the same settings.\n",
            ablation_table(entries),
            f"![ablation]({ablation_png_link})\n",
        ]
    bullets = settings_where_fedcme_does_not_win(entries)
    parts.append("## Where FedCME does not win\n")
    if bullets:
        parts.append(
            "Settings where the best other method beats every FedCME variant in final accuracy:\n\n"
            + "\n".join(bullets)
            + "\n"
        )
    else:
        parts.append("In every setting with both, a FedCME variant is at least as accurate as every other method.\n")
    return "\n".join(parts)


def ablation_png_path(accuracy_png: Path) -> Path:
    """reports/accuracy.png -> reports/accuracy-ablation.png."""
    accuracy_png = Path(accuracy_png)
    return accuracy_png.with_name(f"{accuracy_png.stem}-ablation{accuracy_png.suffix or '.png'}")


def write_report(
    metrics_directory: Path,
    output_markdown: Path,
    output_png: Path,
    *,
    title: str = "FedCME results",
) -> None:
    """Write the Markdown report and its figures (each atomically; folders created as needed).

    The accuracy figure goes to `output_png`; when there are ablation entries, their figure
    goes beside it as ``<stem>-ablation.png``. Raises ValueError when the folder holds no
    metrics file.
    """
    metrics_directory, output_markdown, output_png = Path(metrics_directory), Path(output_markdown), Path(output_png)
    entries = load_metrics(metrics_directory)
    if not entries:
        raise ValueError(f"{metrics_directory}: no metrics files (*.json)")
    accuracy_figure(entries, metrics_directory, output_png)
    ablation_link = None
    if any(entry["group"] == "ablation" for entry in entries):
        ablation_png = ablation_png_path(output_png)
        ablation_figure(entries, metrics_directory, ablation_png)
        ablation_link = relative_link(ablation_png, output_markdown)
    markdown = report_markdown(
        entries,
        title=title,
        accuracy_png_link=relative_link(output_png, output_markdown),
        ablation_png_link=ablation_link,
    )
    atomic_write_bytes(output_markdown, markdown.encode("utf-8"))


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: write the report of a metrics folder."""
    parser = argparse.ArgumentParser(prog="python -m flows.report", description=__doc__.splitlines()[0])
    parser.add_argument("--metrics", type=Path, default=Path("metrics"), help="folder of <experiment>.json/.csv")
    parser.add_argument("--markdown", type=Path, default=Path("reports/results.md"), help="Markdown report to write")
    parser.add_argument("--png", type=Path, default=Path("reports/accuracy.png"), help="accuracy figure to write")
    parser.add_argument("--title", default="FedCME results", help="the report's title")
    arguments = parser.parse_args(argv)
    try:
        write_report(arguments.metrics, arguments.markdown, arguments.png, title=arguments.title)
    except ValueError as error:
        parser.exit(2, f"error: {error}\n")
    print(f"wrote {arguments.markdown} and {arguments.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
