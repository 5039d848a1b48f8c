"""The setup screen's results in docs/results-paper-level.md, from the published runs.

    python tools/publish_paper_level.py [--results docs/results] [--markdown docs/results-paper-level.md]

Reads the screen's grid files (configs/params-paper-screen.yaml and params-paper-screen-cdir.yaml) and
their published runs (``<results>/<grid>/<exp>.json`` with its per-round ``<exp>.csv``), and rewrites
everything of the Markdown file from its "## Results" heading on: per factor, FedProx(0.01) and
FedCME(0.01) at round 40, over rounds 36-40 and at their best round, beside the paper's 56.93, 61.83 and
+4.9, whether the factor raised FedProx by the committed rule (:mod:`flows.report.paper_level`), and the
closest setup it chooses. The text above "## Results" (the rules) is never touched. A run not published
yet is shown as missing, so the section is rebuilt as runs arrive.

A factor is a pair of methods of the screen's grid with the same `setup` (FedProx and FedCME): its name is
the FedProx method's key without "fedprox-", today's setup is the pair without setup, and the
per-client Dirichlet grid's pair is the factor "cdir".
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedcme_core.common.atomic import atomic_write_bytes  # noqa: E402
from fedcme_core.config.params import ParamsFile, load_params  # noqa: E402
from flows.tracking.names import experiment_name  # noqa: E402
from flows.report import paper_level as pl  # noqa: E402
from flows.report.figures import read_accuracy_curve  # noqa: E402
from flows.report.sensitivity import table  # noqa: E402

SCREEN = "paper-screen"
PARTITION_GRID = {"paper-screen-cdir": "cdir"}
RESULTS_HEADING = "## Results"


def screen_methods(params: ParamsFile, factor_of_today: str = pl.TODAY) -> dict[str, dict[str, str]]:
    """{factor: {"fedprox": method, "fedcme": method}} of the grid's methods, paired by their setup."""
    factors: dict[str, dict[str, str]] = {}
    by_setup: dict[str, str] = {}
    for method in params.grid.methods:
        entry = params.methods[method]
        setup = repr(sorted(entry.setup.items()))
        algorithm = entry.algorithm.name
        if algorithm == "fedprox":
            by_setup[setup] = factor_of_today if not entry.setup else method.removeprefix("fedprox-")
    for method in params.grid.methods:
        entry = params.methods[method]
        factor = by_setup.get(repr(sorted(entry.setup.items())))
        if factor is not None and entry.algorithm.name in ("fedprox", "fedcme"):
            factors.setdefault(factor, {})[entry.algorithm.name] = method
    return factors


def published_run(results: Path, grid: str, params: ParamsFile, method: str) -> pl.ScreenRun | None:
    """The seed-0 run of `method` in the grid's first cell, from its published per-round CSV; None if absent."""
    clients, per_round = params.grid.clients[0]
    name = experiment_name(method, params.grid.datasets[0], params.grid.partitions[0], clients, per_round, 0)
    curve = results / grid / f"{name}.csv"
    if not (results / grid / f"{name}.json").is_file() or not curve.is_file():
        return None
    return pl.screen_run(*read_accuracy_curve(curve))


def percent(value: float | None) -> str:
    return "–" if value is None else f"{100.0 * value:.2f}"


def run_cells(run: pl.ScreenRun | None) -> list[str]:
    if run is None:
        return ["– (not run yet)", "–", "–"]
    return [percent(run.acc40), percent(run.final40), f"{percent(run.best)} (round {run.best_round})"]


def results_section(runs: Mapping[str, Mapping[str, pl.ScreenRun | None]], learning_rates: list[str]) -> str:
    """The "## Results" section: the screen's table, the factors that raised FedProx and the closest setup."""
    today = runs[pl.TODAY]["fedprox"]
    rows = []
    for factor, pair in runs.items():
        fedprox, fedcme = pair.get("fedprox"), pair.get("fedcme")
        gap = "–" if fedprox is None or fedcme is None else f"{100.0 * (fedcme.acc40 - fedprox.acc40):+.2f}"
        verdict = "(today)" if factor == pl.TODAY else pl.raised(today, fedprox)
        rows.append([factor, *run_cells(fedprox), *run_cells(fedcme), gap, verdict])
    header = ["Factor", "FedProx(0.01) round 40 (%)", "FedProx rounds 36-40 (%)", "FedProx best (%)",
              "FedCME(0.01) round 40 (%)", "FedCME rounds 36-40 (%)", "FedCME best (%)",
              "FedCME − FedProx at round 40 (points)", "Raised FedProx?"]
    paper = ["the paper (its setup unstated)", f"{pl.PAPER_FEDPROX:.2f}", "–", "–", f"{pl.PAPER_FEDCME:.2f}",
             "–", "–", f"{pl.PAPER_FEDCME - pl.PAPER_FEDPROX:+.2f}", ""]
    fedprox_runs = {factor: pair.get("fedprox") for factor, pair in runs.items() if factor != pl.TODAY}
    choice = pl.closest_setup(today, fedprox_runs, learning_rates)
    if choice.status == "pending":
        chosen = f"Pending: the runs of {', '.join(choice.missing)} are not published yet."
    elif not choice.factors:
        chosen = "No factor raised FedProx: the closest setup is today's, and the paper's level is not reached."
    else:
        best = pl.best_single(fedprox_runs, choice.factors)
        chosen = (f"The factors that raised FedProx: {', '.join(choice.factors)}; the best single factor: {best}. "
                  "The combination is checked with FedProx(0.01) on seed 0 before the closest setup trains.")
    return "\n".join([
        f"{RESULTS_HEADING}\n",
        "Seed 0, CIFAR-10 α=0.1 K=80 M=30, T=40, fp32 on a 2-core CPU (each run's compute: its published "
        "`about/` record). Round 40 is the paper's quoted point; the rule reads round 40 and rounds 36-40.\n",
        table(header, [*rows, paper], numeric=(1, 2, 3, 4, 5, 6, 7)),
        chosen + "\n",
    ])


def publish(results: Path, markdown: Path, configs: Path = Path("configs")) -> Path:
    """Rewrite `markdown` from its "## Results" heading with the published screen runs; returns its path."""
    runs: dict[str, dict[str, pl.ScreenRun | None]] = {}
    learning_rates: list[str] = []
    for grid in (SCREEN, *PARTITION_GRID):
        params = load_params(configs / f"params-{grid}.yaml")
        for factor, methods in screen_methods(params).items():
            name = PARTITION_GRID.get(grid, factor) if factor == pl.TODAY else factor
            if grid != SCREEN and factor != pl.TODAY:
                continue
            runs[name] = {role: published_run(results, grid, params, method) for role, method in methods.items()}
            setup = params.methods[methods["fedprox"]].setup
            if set(setup) == {"training.lr"}:
                learning_rates.append(name)
    text = markdown.read_text(encoding="utf-8")
    if RESULTS_HEADING not in text:
        raise ValueError(f"{markdown}: no {RESULTS_HEADING!r} heading to write below")
    atomic_write_bytes(markdown, (text[:text.index(RESULTS_HEADING)] + results_section(runs, learning_rates)).encode())
    return markdown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("docs/results"))
    parser.add_argument("--markdown", type=Path, default=Path("docs/results-paper-level.md"))
    arguments = parser.parse_args(argv)
    try:
        print(f"wrote {publish(arguments.results, arguments.markdown)}")
    except ValueError as error:
        print(f"publish_paper_level: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
