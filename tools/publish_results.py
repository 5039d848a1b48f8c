"""Commit-ready results of a grid: its experiments' metrics under docs/results/<grid>/, and the report.

    python tools/publish_results.py --grid default [--metrics metrics] [--note "make run from a fresh clone ..."]
        [--params configs/params-<grid>.yaml]

Copies every finished experiment of the grid file's cells from the metrics folder (``<exp>.json`` and
``about/<exp>.json``, in that split even when the source holds both in one file, ``<exp>.csv`` and
``matching/<exp>.json``; a campaign folder may hold other grids' experiments too, which stay out)
into ``docs/results/<grid>/``, keeping those already there (so a
campaign publishes run by run), then writes from that folder ``docs/results-<grid>.md``, its
figures ``docs/results-<grid>*.png`` and ``docs/results/<grid>.csv`` (each row with what trained it,
from the grid file's cell config: partition, classifier layers, augmentation, FedCME's readings), with the grid file's
``report.published`` figures beside ours (``configs/params-<grid>.yaml``, or ``params.yaml`` for the
default grid). The report opens with ``--note``, else with the grid's committed note
``docs/results/<grid>/NOTE.md`` (where the runs come from, how the setting differs from the one it
reproduces), so a campaign that publishes run by run keeps one note. A later checkout rebuilds the
same report from the committed folder without retraining.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedcme_core.results.metrics import split_summary  # noqa: E402
from fedcme_core.config.params import load_params  # noqa: E402
from flows.report.build import cell_columns, write_report  # noqa: E402
from flows.report.inputs import load_metrics  # noqa: E402
from flows.report.published import published_figures  # noqa: E402
from flows.tracking.names import experiment_name  # noqa: E402
from flows.pipeline.stages import write_json  # noqa: E402

DOCS = Path("docs")


def grid_file(grid: str) -> Path:
    """The grid file of a grid name: params.yaml for the default grid, else configs/params-<grid>.yaml."""
    return Path("params.yaml") if grid == "default" else Path("configs") / f"params-{grid}.yaml"


def publish(grid: str, metrics: Path, note: str | None, params: Path | None = None) -> list[str]:
    grid_params = load_params(params or grid_file(grid))
    published = published_figures(grid_params)
    cells = {experiment_name(*cell) for cell in grid_params.all_cells()}
    target = DOCS / "results" / grid
    if note is None and (target / "NOTE.md").is_file():
        note = (target / "NOTE.md").read_text(encoding="utf-8")
    for folder in ("matching", "about"):
        (target / folder).mkdir(parents=True, exist_ok=True)
    copied = []
    for entry in load_metrics(metrics):  # validated (content hash, keys) before anything is copied
        name = entry["experiment"]
        if name not in cells:
            continue
        results, about = split_summary(entry)
        write_json(target / "about" / f"{name}.json", about)
        write_json(target / f"{name}.json", results)
        for relative in (f"{name}.csv", f"matching/{name}.json"):
            if (metrics / relative).is_file() and (metrics / relative).resolve() != (target / relative).resolve():
                shutil.copy2(metrics / relative, target / relative)
        copied.append(name)
    write_report(target, DOCS / f"results-{grid}.md", DOCS / f"results-{grid}.png",
                 title=f"FedCME results: the {grid} grid", output_csv=DOCS / "results" / f"{grid}.csv",
                 grid=grid, note=note, published=published,
                 methods=grid_params.methods, configs=cell_columns(grid_params))
    return copied


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/publish_results.py", description=__doc__.splitlines()[0])
    parser.add_argument("--grid", required=True, help="the grid's name (report.name of its params file)")
    parser.add_argument("--metrics", type=Path, default=Path("metrics"))
    parser.add_argument("--note", default=None, help="the report's opening paragraph: command, commit, date, wall "
                        "time (default: docs/results/<grid>/NOTE.md where it exists)")
    parser.add_argument("--params", type=Path, default=None,
                        help="the grid file (default: configs/params-<grid>.yaml, params.yaml for default)")
    arguments = parser.parse_args(argv)
    try:
        copied = publish(arguments.grid, arguments.metrics, arguments.note, arguments.params)
    except ValueError as error:
        parser.exit(2, f"error: {error}\n")
    print(f"published {len(copied)} experiments to docs/results/{arguments.grid}/ and docs/results-{arguments.grid}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
