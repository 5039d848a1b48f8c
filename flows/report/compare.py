"""What DVC shows of a grid: the per-method summary rows, the `make compare` view and the overlay plot.

- :func:`summary_metrics` -> ``reports/summary/<method name>.json``, the report stage's DVC metric:
  per method the mean over the grid's settings and seeds of ``final_accuracy`` (the mean of the last
  rounds, SPEC.md), ``best_accuracy`` and ``accuracy_at.2/5``, as fractions like the experiments'
  files, with the same keys: `dvc metrics show` lists them as rows under the experiments' rows, in
  the same few columns, so its table fits a terminal.
- :func:`compare_table` (``python -m flows.report.compare compare``, what `make compare` runs): `dvc exp
  show`'s rows (the workspace, commits, `dvc exp run`s), one column per method headed by its label
  (``FedCME(0.01) (%)``: :func:`method_labels`; the method's key names only its summary file), its
  mean final accuracy in %, and the params that differ; a row without results (a commit: reports/ is
  not committed) is left out, with one line saying so.
- :func:`curve_tables` -> ``reports/curves/<setting>.csv`` (and ``<setting>-ablation.csv``): per
  round and method the test accuracy (%) as the mean over seeds with its min and max, and the setting
  in words (the chart's title: "FMNIST α=1.0 K=10 M=10"), the data of
  the top-level plot of dvc.yaml, which overlays the methods of a setting in one chart through the
  template ``.dvc/plots/overlay.json`` (integer rounds, one colour and dash per method, the band).
"""

from __future__ import annotations

import csv
import io
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedcme_core.results.metrics import COMPARED_FRACTION
from fedcme_core.config.partition_tags import entry_partition_tag

from flows.report.figures import setting_curves
from flows.report.tables import ablation_entries, unique_in_order
from flows.tracking.names import setting_name

CURVE_COLUMNS = ("round", "method", "accuracy", "accuracy_min", "accuracy_max", "seeds", "setting")
SUMMARY_COLUMN = re.compile(r"^reports/summary/(?P<method>[^/]+)\.json:final_accuracy$")
COMPARE_FILTERS = ("--only-changed", "--drop", ".*/", "--drop", "fedcme_core$", "--drop", "metrics$",
                   "--keep", r"reports/summary/.*\.json:final_accuracy")


def average(values: Sequence[float]) -> float:
    return round(sum(values) / len(values), 6)


def summary_metrics(entries: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """{method name: {"final_accuracy", "best_accuracy", "accuracy_at": {"2/5"}}}: each the mean (a
    fraction) over every experiment of that method (``accuracy_at`` over those that have it)."""
    summary = {}
    for name in unique_in_order([entry["method_name"] for entry in entries]):
        runs = [entry for entry in entries if entry["method_name"] == name]
        row: dict[str, Any] = {key: average([float(entry[key]) for entry in runs])
                               for key in ("final_accuracy", "best_accuracy")}
        at = [float(entry["accuracy_at"][COMPARED_FRACTION]) for entry in runs
              if COMPARED_FRACTION in entry.get("accuracy_at", {})]
        if at:
            row["accuracy_at"] = {COMPARED_FRACTION: average(at)}
        summary[name] = row
    return summary


def dependency_filter(root: str | Path = ".") -> list[str]:
    """`dvc exp show` arguments that drop the columns naming a top-level file or folder of the checkout at
    `root` (``fedcme_core``, ``metrics``, ``tuning``: a stage's dependencies, each a hash, not a param;
    COMPARE_FILTERS drops the nested ones by their slash)."""
    names = sorted(path.name for path in Path(root).iterdir())
    return ["--drop", "^(" + "|".join(re.escape(name) for name in names) + ")$"] if names else []


def method_labels(params_path: str | Path = "params.yaml") -> dict[str, str]:
    """{method key: label} of the grid file's methods: ``methods.<key>.label``, else the algorithm's display
    name and label parameter (``FedCME(0.01)``), as the report and the MLflow runs name the method.
    Raises ConfigError (one line naming the file and key) for a file that is not a valid params file."""
    from fedcme_core.config.params import load_params

    methods = load_params(params_path, cells=False).methods
    return {key: entry.label or entry.algorithm.label() for key, entry in methods.items()}


def compare_table(exp_show_csv: str, labels: Mapping[str, str] | None = None) -> str:
    """`dvc exp show --csv`'s text (with COMPARE_FILTERS) as a terminal table: the row's name, when it was
    created, each method's mean final accuracy in percent, headed ``<label> (%)`` (`labels`: {method key:
    label}; a key it lacks, a method the grid file no longer has, heads its column itself) and the params
    that differ. Rows with no results are left out; a line before the table names them and says why."""
    rows = list(csv.DictReader(io.StringIO(exp_show_csv)))
    columns = list(rows[0]) if rows else []
    methods = {column: match["method"] for column in columns if (match := SUMMARY_COLUMN.match(column))}
    params = [column for column in columns if column not in methods and column not in ("Experiment", "rev", "Created")]

    def percent(text: str) -> str | None:
        try:
            return f"{100 * float(text):.2f}"
        except ValueError:
            return None

    labels = labels or {}
    header = ["Experiment", "Created", *(f"{labels.get(key, key)} (%)" for key in methods.values()), *params]
    table, empty = [], []
    for row in rows:
        name = row.get("Experiment") or row.get("rev") or ""
        values = [percent(row[column]) for column in methods]
        if not any(value is not None for value in values):
            empty.append(name)
            continue
        created = (row.get("Created") or "-")[:16].replace("T", " ")
        table.append([name, created, *(value or "-" for value in values), *(row[column] or "-" for column in params)])
    lines = []
    if empty:
        lines.append(f"Not shown: {', '.join(empty)}: no results in that commit (reports/ is not committed; "
                     "`make run` or `dvc exp run` writes them).")
    if not table:
        lines.append("No results to compare yet: run `make run` first.")
        return "\n".join(lines) + "\n"
    widths = [max(len(line[position]) for line in [header, *table]) for position in range(len(header))]
    for line in [header, *table]:
        lines.append("  ".join(text.ljust(width) if position < 2 else text.rjust(width)
                               for position, (text, width) in enumerate(zip(line, widths))).rstrip())
    return "\n".join(lines) + "\n"


def quoted(text: str) -> str:
    """A CSV field in double quotes."""
    return '"' + text.replace('"', '""') + '"'


def curve_tables(entries: Sequence[Mapping[str, Any]], csv_directory: Path) -> dict[str, str]:
    """{file name: CSV text}: one table per setting of the main group, one per setting with ablations."""
    groups = {"": [entry for entry in entries if entry["group"] == "main"], "-ablation": ablation_entries(entries)}
    tables = {}
    for suffix, selected in groups.items():
        slugs = {entry["setting"]: setting_name(entry["dataset"], entry_partition_tag(entry), entry["num_clients"],
                                                entry["clients_per_round"]) for entry in selected}
        methods = unique_in_order([entry["method"] for entry in selected])
        for setting, by_method in setting_curves(selected, csv_directory, methods).items():
            lines = [",".join(CURVE_COLUMNS)]
            title = quoted(setting + (" ablations" if suffix else ""))
            for method, (rounds, mean, low, high, seeds) in by_method.items():
                lines += [f"{r},{quoted(method)},{100 * m:.4f},{100 * lo:.4f},{100 * hi:.4f},{seeds},{title}"
                          for r, m, lo, hi in zip(rounds, mean, low, high, strict=True)]
            tables[f"{slugs[setting]}{suffix}.csv"] = "\n".join(lines) + "\n"
    return tables


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m flows.report.compare compare [DVC EXP SHOW ARGUMENTS]`: the `make compare` table, its
    methods labelled as params.yaml labels them."""
    from fedcme_core.config.files import ConfigError

    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] != ["compare"]:
        print("usage: python -m flows.report.compare compare [dvc exp show arguments ...]", file=sys.stderr)
        return 2
    try:
        labels = method_labels()
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    shown = subprocess.run(["dvc", "exp", "show", "--no-pager", "--csv", *COMPARE_FILTERS, *dependency_filter(),
                            *arguments[1:]],
                           capture_output=True, text=True)
    if shown.returncode != 0:
        print(shown.stderr, end="", file=sys.stderr)
        return shown.returncode
    print(compare_table(shown.stdout, labels), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
