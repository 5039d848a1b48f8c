"""Check what `make run` must leave: every experiment of the grid trained, and the report.

    python tools/check_run.py [--params params.yaml]

Reads the grid of the params file, then `dvc metrics show --json`: every experiment of the grid
and of the ablation must be listed with a numeric final accuracy, no metric may be text (names
and settings live in metrics/about/), `reports/summary/<method>.json` must give every method's final
accuracy, `reports/results.md` (naming every method), `reports/figures/accuracy.png` (and
`accuracy-ablation.png` where the grid has ablation runs) must exist, and `reports/results.csv` must
hold one row per experiment. With `--against-readme`, each method's mean final accuracy
(`reports/summary/<method>.json`) must also be within TOLERANCE_POINTS of the README's published table
of the default grid: the grid pins fp32, and fp32 kernels differ between CPUs only in the last digits,
which drift a little over 15 rounds. One line per problem on stderr and exit status 1; a one-line
summary and 0 when all is there. `.ci/run` runs it after `make run`, against the README.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedcme_core.config.params import load_params  # noqa: E402
from flows.tracking.names import experiment_name  # noqa: E402

REPORT = Path("reports/results.md")
FIGURE = Path("reports/figures/accuracy.png")
ABLATION_FIGURE = Path("reports/figures/accuracy-ablation.png")
SUMMARY = Path("reports/results.csv")
SUMMARY_METRICS = Path("reports/summary")
README = Path("README.md")
README_TABLE = "| Method (FMNIST"  # the first cell of the header of the README's table of the default grid
TOLERANCE_POINTS = 0.5


def readme_table(text: str) -> dict[str, float]:
    """{method label: mean final accuracy in percent} of the README's table of the default grid (its rows
    "| FedAvg | 72.06 ± 0.32 | ... |", bold allowed); {} when the README has no such table."""
    lines = text.splitlines()
    start = next((index for index, line in enumerate(lines) if line.startswith(README_TABLE)), None)
    if start is None:
        return {}
    table: dict[str, float] = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip().strip("*") for cell in line.strip("|").split("|")]
        table[cells[0]] = float(cells[1].split("±")[0])
    return table


def readme_problems(params, metrics: dict[str, dict], readme: str) -> list[str]:
    """Where a method's mean final accuracy is more than TOLERANCE_POINTS from the README's table, or the
    table lacks it, one line each (in percentage points)."""
    published = readme_table(readme)
    if not published:
        return [f"{README}: no table starting {README_TABLE!r} to compare with"]
    found = []
    for method in params.grid.methods:
        label = params.label(method)
        accuracy = metrics.get(f"{SUMMARY_METRICS}/{method}.json", {}).get("final_accuracy")
        if label not in published:
            found.append(f"{README}: its table has no row for {label}")
        elif isinstance(accuracy, (int, float)) and abs(100.0 * accuracy - published[label]) > TOLERANCE_POINTS:
            found.append(f"{SUMMARY_METRICS}/{method}.json: {label} {100.0 * accuracy:.2f}% is more than "
                         f"{TOLERANCE_POINTS} points from the README's {published[label]:.2f}%")
    return found


def flat(values: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}, as `dvc metrics show` names nested keys."""
    items: dict = {}
    for key, value in values.items():
        if isinstance(value, dict):
            items.update(flat(value, f"{prefix}{key}."))
        else:
            items[f"{prefix}{key}"] = value
    return items


def dvc_metrics() -> dict[str, dict]:
    """{metrics file: its values} as `dvc metrics show --json` lists them for the workspace."""
    shown = subprocess.run(["dvc", "metrics", "show", "--json"], capture_output=True, text=True, check=True).stdout
    files: dict[str, dict] = {}
    for revision in json.loads(shown).values():
        for name, entry in (revision.get("data") or {}).items():
            files[name] = entry.get("data") or {}
    return files


def problems(params_path: str, against_readme: bool = False) -> tuple[list[str], int]:
    params = load_params(params_path)
    metrics = dvc_metrics()
    found: list[str] = []
    cells = list(params.all_cells())
    for cell in cells:
        name = f"metrics/{experiment_name(*cell)}.json"
        accuracy = metrics.get(name, {}).get("final_accuracy")
        if name not in metrics:
            found.append(f"{name}: not listed by `dvc metrics show` (the experiment did not finish)")
        elif not isinstance(accuracy, (int, float)):
            found.append(f"{name}: final_accuracy is {accuracy!r}, not a number")
    found += [f"{name}: {key} is text ({value!r}); `dvc metrics show` lists numbers only"
              for name, values in metrics.items() for key, value in flat(values).items() if isinstance(value, str)]
    methods = {cell[0] for cell in cells}
    found += [f"{SUMMARY_METRICS}/{method}.json: no final_accuracy" for method in sorted(methods)
              if not isinstance(metrics.get(f"{SUMMARY_METRICS}/{method}.json", {}).get("final_accuracy"), (int, float))]
    if not REPORT.is_file():
        found.append(f"{REPORT}: missing")
    else:
        report = REPORT.read_text(encoding="utf-8")
        found += [f"{REPORT}: no row for {params.label(method)}" for method in params.grid.methods
                  if f"| {params.label(method)} |" not in report]
    figures = [FIGURE, *([ABLATION_FIGURE] if params.ablation is not None and params.ablation.methods else [])]
    found += [f"{figure}: missing or empty" for figure in figures if not figure.is_file() or figure.stat().st_size == 0]
    rows = SUMMARY.read_text(encoding="utf-8").splitlines()[1:] if SUMMARY.is_file() else None
    if rows is None:
        found.append(f"{SUMMARY}: missing")
    elif len(rows) != len(cells):
        found.append(f"{SUMMARY}: {len(rows)} experiment rows, the grid has {len(cells)}")
    if against_readme:
        found += readme_problems(params, metrics, README.read_text(encoding="utf-8") if README.is_file() else "")
    return found, len(cells)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/check_run.py", description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--against-readme", action="store_true",
                        help=f"also compare each method's mean final accuracy with the README's table "
                             f"(within {TOLERANCE_POINTS} points)")
    arguments = parser.parse_args(argv)
    found, experiments = problems(arguments.params, arguments.against_readme)
    for problem in found:
        print(f"check_run: {problem}", file=sys.stderr)
    if found:
        return 1
    print(f"check_run: {arguments.params}: all {experiments} experiments listed by `dvc metrics show`, "
          f"{REPORT}, {SUMMARY} and {FIGURE} written"
          + (f"; every method within {TOLERANCE_POINTS} points of {README}'s table" if arguments.against_readme else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
