"""The results report of an experiment grid: tables over seeds, paired statistics and figures.

It reproduces the forms in which FedCME's paper (Nie et al., arXiv:2307.08574) reports its
results, each cell the mean ± std over the grid's seeds: Table II (final test accuracy, methods x
settings), Table III (test accuracy at T/5 ... T and rounds to a target, for one setting), the
ablation comparison (its Table IV), the paired differences against FedAvg (:mod:`flows.report.seed_stats`),
the paper's claims checked against the runs (:mod:`flows.report.claims`), the settings where FedCME
does not win, and the figures others published for these settings beside ours
(:mod:`flows.report.published`). It reads a metrics folder (:mod:`flows.report.inputs`).

    python -m flows.report.build --metrics metrics --markdown reports/results.md --png reports/figures/accuracy.png \\
        --csv reports/results.csv --grid default --summary reports/summary --curves reports/curves \\
        --params params.yaml --mlflow-parent

With ``--mlflow-parent`` (the report stage of dvc.yaml), the report's files and per-method summary
metrics go to the grid run's parent MLflow run, which then ends (:mod:`flows.tracking.grid`).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedcme_core.common.atomic import atomic_write_bytes
from fedcme_core.config.params import ParamsFile, load_params
from fedcme_core.config.sections import MethodEntry

from flows.report.compare import curve_tables, summary_metrics
from flows.report.factors import load_study
from flows.report.claims import claims_section
from flows.report.figures import curves_png, matching_png
from flows.report.inputs import load_matching, load_metrics, matching_runs
from flows.report.published import Published, published_figures, published_table
from flows.report.tables import (
    ablation_entries,
    accuracy_table,
    fraction_column_name,
    paired_table,
    speed_table,
    unique_in_order,
    where_fedcme_does_not_win,
)
from flows.report.tuning import add_tuning_section
from flows.report.seed_stats import REFERENCE_METHOD, config_columns, summary_csv
from flows.tracking.names import experiment_name

DEFAULT_FINAL_WINDOW = 5


def final_window_description(entries: Sequence[Mapping[str, Any]]) -> str:
    """"the last 5 rounds" (or the windows used, when the experiments differ)."""
    windows = sorted({int(entry.get("final_window", DEFAULT_FINAL_WINDOW)) for entry in entries})
    if len(windows) == 1:
        return f"the last {windows[0]} rounds"
    return "the last " + " / ".join(str(window) for window in windows) + " rounds (it differs between experiments)"


def target_description(entries: Sequence[Mapping[str, Any]]) -> str:
    """A sentence naming the target accuracy of these experiments (or saying that none is set)."""
    targets = [target for target in unique_in_order([entry.get("target_accuracy") for entry in entries])
               if target is not None]
    if not targets:
        return "No target accuracy was set, so rounds to target is empty.\n"
    return "Target accuracy: " + " / ".join(f"{100.0 * target:.2f}%" for target in targets) + ".\n"


def relative_link(target: Path, markdown_path: Path) -> str:
    """The path of `target` as seen from the folder of `markdown_path`, with forward slashes."""
    return Path(os.path.relpath(Path(target).resolve(), Path(markdown_path).resolve().parent)).as_posix()


def seeds_description(entries: Sequence[Mapping[str, Any]]) -> str:
    seeds = sorted({int(entry["seed"]) for entry in entries})
    return f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''} ({', '.join(map(str, seeds))})"


def compute_description(entries: Sequence[Mapping[str, Any]]) -> str:
    """"Computed with: channels_last+fp32 on cpu (Intel Xeon): 12 runs; ..." from the runs' about records, and
    how many runs do not record it (published before 2026-12-07: their grid's NOTE says what computed them)."""
    counts: dict[str, int] = {}
    for entry in entries:
        key = (f"{entry['compute']} on {entry.get('device', '?')} ({entry.get('machine') or 'machine not recorded'})"
               if entry.get("compute") else "not recorded in the run (see the grid's NOTE)")
        counts[key] = counts.get(key, 0) + 1
    runs = "; ".join(f"{key}: {count} run{'s' if count != 1 else ''}" for key, count in counts.items())
    return f"Computed with (layout and precision, device, machine): {runs}.\n"


def report_markdown(
    entries: Sequence[Mapping[str, Any]],
    *,
    title: str,
    links: Mapping[str, str],
    note: str | None = None,
    published: Sequence[Published] = (),
    methods: Mapping[str, MethodEntry] | None = None,
) -> str:
    """The report's Markdown text; `links` holds the figures' relative paths (accuracy, ablation, matching),
    `note` an opening paragraph (where the runs come from), `published` the figures others published
    for these settings ((label, figure) of the grid file's ``report.published``), set beside ours, and
    `methods` the grid file's methods, by which the paper's claims are checked (:mod:`flows.report.claims`)."""
    main_entries = [entry for entry in entries if entry["group"] == "main"]
    fractions = unique_in_order([key for entry in main_entries for key in entry["accuracy_at"]])
    fraction_text = ", ".join(fraction_column_name(key) for key in fractions) or "fractions of T"
    parts = [
        f"# {title}\n",
        *([f"{note.strip()}\n"] if note else []),
        (
            f"Each cell: mean ± sample std over seeds, (n) = the number of seeds; {seeds_description(entries)} "
            f"in all. Within a seed, every method trains on the same partition from the same initial model, "
            f"so methods are compared seed by seed (paired). Final accuracy = mean test accuracy of "
            f"{final_window_description(entries)} of each run; local = the same mean of the local accuracy, "
            f"the global model's accuracy on each client's share of the test set (its training label mix), "
            f"weighted by share size, which for one global model is the test accuracy again up to the classes "
            f"no client trains on (– for runs recorded before it). Table III form = test accuracy after round "
            f"ceil(k T / n) at {fraction_text} (the \"last round (T)\" column is that one round's accuracy, not "
            f"the final accuracy); rounds to target = the first round whose test accuracy "
            f"reaches the target (averaged over the seeds that reach it; (r/n) when only r of n do). "
            f"Accuracies in percent, the best mean of each column in bold, – = not run. "
            f"Paper: FedCME, Nie et al., arXiv:2307.08574.\n"
        ),
        compute_description(entries),
        "## Final test accuracy (Table II form)\n",
        accuracy_table(main_entries, "final_accuracy", "final_local_accuracy"),
    ]
    if published:
        parts += ["## Beside the published figures\n", published_table(entries, published)]
    parts += [
        "## Test accuracy per round\n",
        f"![accuracy]({links['accuracy']})\n",
    ]
    for setting in unique_in_order([entry["setting"] for entry in main_entries]):
        in_setting = [entry for entry in main_entries if entry["setting"] == setting]
        parts += [
            f"## {setting}\n",
            "### Accuracy at fractions of T (Table III form)\n",
            target_description(in_setting),
            speed_table(main_entries, setting),
            f"### Paired differences against {REFERENCE_METHOD}\n",
            paired_table(main_entries, setting),
        ]
    if "ablation" in links:
        parts += [
            "## Ablations\n",
            "Final test accuracy of the ablation runs beside the FedCME runs of the same settings.\n",
            accuracy_table(ablation_entries(entries), "final_accuracy"),
            f"![ablation]({links['ablation']})\n",
        ]
    if "matching" in links:
        parts += [
            "## What the matching does\n",
            "Class histograms of the matched pairs in an early and a late round, and the mean cosine similarity "
            "of the matched pairs' evaluation vectors against the mean over all pairs of the round's clients "
            "(what random pairs give). FedCME pairs each client with its least similar counterpart (SPEC step 2), "
            "so the matched curve lies below the random one when the matching finds complementary clients.\n",
            f"![matching]({links['matching']})\n",
        ]
    claims = claims_section(entries, methods or {})
    if claims is not None:
        parts += ["## The paper's claims here\n", claims]
    parts += ["## Where FedCME does not win\n", where_fedcme_does_not_win(main_entries)]
    return "\n".join(parts)


def cell_columns(params: ParamsFile) -> dict[str, dict[str, str]]:
    """{experiment name: what trained it} for every cell of a grid file, the summary CSV's CONFIG_COLUMNS."""
    return {experiment_name(*cell): config_columns(params.cell_config(*cell)) for cell in params.all_cells()}


def figure_path(accuracy_png: Path, name: str) -> Path:
    """reports/accuracy.png -> reports/accuracy-<name>.png."""
    accuracy_png = Path(accuracy_png)
    return accuracy_png.with_name(f"{accuracy_png.stem}-{name}{accuracy_png.suffix or '.png'}")


def write_report(
    metrics_directory: Path,
    output_markdown: Path,
    output_png: Path,
    *,
    title: str = "FedCME results",
    output_csv: Path | None = None,
    grid: str = "default",
    note: str | None = None,
    output_summary: Path | None = None,
    output_curves: Path | None = None,
    published: Sequence[Published] = (),
    methods: Mapping[str, MethodEntry] | None = None,
    configs: Mapping[str, Mapping[str, str]] | None = None,
) -> None:
    """Write the Markdown report, its figures and (with `output_csv`) the grid's summary CSV, each atomically;
    with `output_summary` and `output_curves`, what DVC shows (:mod:`flows.report.compare`): the folder of
    per-method summary metrics and the folder of overlay-plot tables (the other files of each removed).

    The accuracy figure goes to `output_png`, the ablation and matching figures beside it as
    ``<stem>-ablation.png`` and ``<stem>-matching.png`` only when there is something to draw (no
    ablation runs, no FedCME matching: no figure, and one left from before is removed); `published` figures are set beside ours, and the
    paper's claims are checked where `methods` (the grid file's) names the runs they need; `configs`
    (:func:`cell_columns` of the grid file) fills the CSV's columns of what trained each row. Raises
    ValueError when the folder holds no metrics file.
    """
    metrics_directory, output_markdown, output_png = Path(metrics_directory), Path(output_markdown), Path(output_png)
    entries = load_metrics(metrics_directory)
    if not entries:
        raise ValueError(f"{metrics_directory}: no metrics files (*.json)")
    figures = {"accuracy": (output_png, [entry for entry in entries if entry["group"] == "main"])}
    if any(entry["group"] == "ablation" for entry in entries):
        figures["ablation"] = (figure_path(output_png, "ablation"), ablation_entries(entries))
    writes: dict[Path, bytes] = {}
    links = {}
    for name, (path, selected) in figures.items():
        labels = unique_in_order([entry["method"] for entry in selected])
        writes[path] = curves_png(selected, metrics_directory, labels)
        links[name] = relative_link(path, output_markdown)
    runs = matching_runs(load_matching(metrics_directory), entries)
    if runs:
        writes[figure_path(output_png, "matching")] = matching_png(runs)
        links["matching"] = relative_link(figure_path(output_png, "matching"), output_markdown)
    # A figure with nothing to draw is not written, and one from an earlier grid goes.
    stale = [path for name in ("ablation", "matching") if name not in links
             and (path := figure_path(output_png, name)).is_file()]
    writes[output_markdown] = report_markdown(entries, title=title, links=links, note=note,
                                             published=published, methods=methods).encode("utf-8")
    if output_csv is not None:
        writes[Path(output_csv)] = summary_csv(entries, grid, configs).encode("utf-8")
    if output_summary is not None:
        rows = {Path(output_summary) / f"{name}.json": (json.dumps(row, indent=2) + "\n").encode("utf-8")
                for name, row in summary_metrics(entries).items()}
        stale += [path for path in Path(output_summary).glob("*.json") if path not in rows]
        writes.update(rows)
    if output_curves is not None:
        tables = {Path(output_curves) / name: text.encode("utf-8")
                  for name, text in curve_tables(entries, metrics_directory).items()}
        stale += [path for path in Path(output_curves).glob("*.csv") if path not in tables]
        writes.update(tables)
    for path, content in writes.items():
        atomic_write_bytes(path, content)
    for path in stale:
        path.unlink()


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: write the report of a metrics folder."""
    parser = argparse.ArgumentParser(prog="python -m flows.report.build", description=__doc__.splitlines()[0])
    parser.add_argument("--metrics", type=Path, default=Path("metrics"), help="folder of <experiment>.json/.csv")
    parser.add_argument("--markdown", type=Path, default=Path("reports/results.md"), help="Markdown report to write")
    parser.add_argument("--png", type=Path, default=Path("reports/figures/accuracy.png"), help="accuracy figure to write")
    parser.add_argument("--csv", type=Path, default=None, help="summary CSV to write (one row per experiment)")
    parser.add_argument("--grid", default="default", help="the grid's name, the CSV's first column")
    parser.add_argument("--summary", type=Path, default=None,
                        help="folder of DVC metrics to write: one file per method, its mean accuracies (fractions)")
    parser.add_argument("--curves", type=Path, default=None, help="folder of per-setting tables for the DVC overlay plot")
    parser.add_argument("--title", default=None, help="the report's title (default: from --grid)")
    parser.add_argument("--note", default=None, help="an opening paragraph: where the runs come from")
    parser.add_argument("--params", type=Path, default=None,
                        help="the grid file: its report.published figures are set beside ours, its "
                        "methods name the runs that check the paper's claims, and its cell configs fill the "
                        "CSV's columns of what trained each row")
    parser.add_argument("--mlflow-parent", action="store_true",
                        help="with --params: log the report to the grid run's parent MLflow run (found or created; "
                        "flows.tracking.grid), its experiments' runs (--runs-dir) nested under it, and end it")
    parser.add_argument("--runs-dir", type=Path, default=Path("runs"), help="the train stages' run directories")
    arguments = parser.parse_args(argv)
    title = arguments.title or f"FedCME results: the {arguments.grid} grid"
    try:
        params = load_params(arguments.params) if arguments.params else None
        if params is not None:
            load_study(arguments.params, params)  # a study's keys in its report section, checked (one line)
        write_report(arguments.metrics, arguments.markdown, arguments.png, title=title,
                     output_csv=arguments.csv, grid=arguments.grid, note=arguments.note,
                     output_summary=arguments.summary, output_curves=arguments.curves,
                     published=published_figures(params) if params else (),
                     methods=params.methods if params else None,
                     configs=cell_columns(params) if params else None)
        if params is not None:
            add_tuning_section(params, arguments.markdown, arguments.png)  # a grid with a tune: section only
    except ValueError as error:  # a ConfigError too
        parser.exit(2, f"error: {error}\n")
    print(f"wrote {arguments.markdown} and {arguments.png}" + (f" and {arguments.csv}" if arguments.csv else ""))
    if arguments.mlflow_parent and params is not None:
        log_grid_parent(arguments, params)
    return 0


def log_grid_parent(arguments: argparse.Namespace, params: ParamsFile) -> str | None:
    """The report's files and per-method summary metrics on the grid run's parent MLflow run, which
    ends FINISHED (flows.tracking.grid: a tracking failure is one warning line, never a failed report)."""
    from flows.tracking.grid import close_grid_parent, parent_metrics

    files = {Path(arguments.markdown): "reports", **({Path(arguments.csv): "reports"} if arguments.csv else {}),
             **{path: "reports/figures" for path in sorted(Path(arguments.png).parent.glob("*.png"))}}
    summaries = {}
    if arguments.summary is not None:
        for path in sorted(Path(arguments.summary).glob("*.json")):
            files[path] = "reports/summary"
            summaries[path.stem] = json.loads(path.read_text(encoding="utf-8"))
    entries = load_metrics(arguments.metrics)
    if not summaries:
        summaries = summary_metrics(entries)
    return close_grid_parent(params, arguments.params, report_files=files, metrics=parent_metrics(summaries, entries),
                             runs_dir=arguments.runs_dir)


if __name__ == "__main__":
    raise SystemExit(main())
