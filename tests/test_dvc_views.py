"""What DVC and the report show a person: the overlay plot's one legend of colours and dashes
(.dvc/plots/overlay.json, and as the offline page's vega-lite compiles it), the accuracy figure's
legend inside the figure, and the documented `dvc exp show` command's columns."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from flows.report.figures import FIGURE_DPI, curves_figure, curves_png

from .conftest import REPO_ROOT
from .helpers import copy_repository, run_checked
from .report_helpers import LOW, grid_entries, metrics_entry, write_metrics_folder

TEMPLATE = REPO_ROOT / ".dvc" / "plots" / "overlay.json"


def template() -> dict:
    return json.loads(TEMPLATE.read_text(encoding="utf-8"))


def encodings(spec: dict):
    """(where, channel, definition) of every encoding of the chart and its layers."""
    places = [("spec", spec["spec"]["encoding"])]
    places += [(f"layer {position}", layer["encoding"]) for position, layer in enumerate(spec["spec"]["layer"])]
    for where, encoding in places:
        for channel, definition in encoding.items():
            if isinstance(definition, dict):  # not the tooltip's list
                yield where, channel, definition


def test_the_lines_colour_and_dash_share_one_legend_that_nothing_hides():
    spec = template()
    band, line = (layer["encoding"] for layer in spec["spec"]["layer"])

    assert line["color"]["field"] == line["strokeDash"]["field"] == "method"
    assert line["color"]["legend"] == line["strokeDash"]["legend"] and line["color"]["legend"]["symbolType"] == "stroke"
    # A null legend on any channel of the method field merges into the one legend and greys or hides it.
    assert [(where, channel) for where, channel, definition in encodings(spec)
            if definition.get("field") == "method" and definition.get("legend", {}) is None] == []
    # The band: the method's colour through a copy of the field, in the same order and scheme as the line's.
    assert spec["spec"]["layer"][0]["transform"] == [{"calculate": "datum.method", "as": "band"}]
    assert band["fill"] == {**line["color"], "field": "band", "legend": None}


def on_fraction(pattern: list[float]) -> float:
    return sum(pattern[0::2]) / sum(pattern)


def test_the_dashes_are_distinct_and_the_default_grids_four_are_four_kinds():
    patterns = template()["spec"]["layer"][1]["encoding"]["strokeDash"]["scale"]["range"]

    assert len(patterns) >= 8
    normalised = {tuple(round(value / sum(pattern), 4) for value in pattern) for pattern in patterns}
    assert len(normalised) == len(patterns)  # none a scaled copy of another
    # The default grid's FedAvg, FedProx, FedRS and FedCME: solid, long dash, dots, dash-dot. FedProx's and
    # FedRS's (the second and third) differ in how much of the line is drawn, not by a pixel.
    solid, dashed, dotted, dash_dot = patterns[:4]
    assert solid[1] == 0 and len(dashed) == len(dotted) == 2 and len(dash_dot) == 4
    assert on_fraction(dashed) - on_fraction(dotted) >= 0.3


COMPILE = """
const vl = require("vega-lite"), fs = require("fs");
const compiled = vl.compile(JSON.parse(fs.readFileSync(process.argv[2], "utf8"))).spec;
const legends = [];
(function walk(node) {
  if (node && typeof node === "object") {
    if (Array.isArray(node.legends)) legends.push(...node.legends);
    Object.values(node).forEach(walk);
  }
})(compiled);
console.log(JSON.stringify(legends));
"""


def test_the_offline_pages_vega_lite_draws_one_legend_of_colour_and_dash(tmp_path):
    page = (REPO_ROOT / ".dvc" / "plots" / "offline.html").read_text(encoding="utf-8")
    vega, vega_lite = re.findall(r"<script[^>]*>(.*?)</script>", page, re.S)[:2]
    for name, source in (("vega", vega), ("vega-lite", vega_lite)):
        (tmp_path / "node_modules" / name).mkdir(parents=True)
        (tmp_path / "node_modules" / name / "index.js").write_text(source, encoding="utf-8")
    rows = [{"round": str(r), "method": method, "accuracy": 50 + r, "accuracy_min": 49 + r, "accuracy_max": 51 + r,
             "seeds": 2, "setting": "FMNIST α=1.0 K=10 M=10"} for method in ("FedAvg", "FedProx(0.01)", "FedRS(0.5)")
            for r in (1, 2, 3)]
    text = TEMPLATE.read_text(encoding="utf-8").replace('"<DVC_METRIC_DATA>"', json.dumps(rows))
    for anchor, value in (("X_LABEL", "round"), ("Y_LABEL", "test accuracy (%)"), ("X", "round"), ("Y", "accuracy")):
        text = text.replace(f"<DVC_METRIC_{anchor}>", value)
    (tmp_path / "spec.json").write_text(text, encoding="utf-8")
    (tmp_path / "compile.js").write_text(COMPILE, encoding="utf-8")

    done = subprocess.run(["node", "compile.js", "spec.json"], cwd=tmp_path, capture_output=True, text=True, timeout=120)

    assert done.returncode == 0, done.stderr[-2000:]
    (legend,) = json.loads(done.stdout)
    assert legend["stroke"] == "color" and legend["strokeDash"] == "strokeDash" and legend["symbolType"] == "stroke"


def drawn_legend(entries, folder):
    """(figure, legend extent, axes extents, figure extent) of the accuracy figure drawn at its dpi."""
    write_metrics_folder(folder, entries)
    methods = list(dict.fromkeys(entry["method"] for entry in entries))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "constrained_layout not applied": the legend pushed the panels aside
        figure = curves_figure(entries, folder, methods)
        canvas = FigureCanvasAgg(figure)
        canvas.draw()
    renderer = canvas.get_renderer()
    (legend,) = figure.legends
    return figure, legend.get_window_extent(renderer), [axes.get_window_extent(renderer) for axes in figure.axes], \
        figure.bbox


@pytest.mark.parametrize("suffix", ["", " " + "with a label far longer than any method's" * 3])
def test_the_accuracy_figures_legend_lies_inside_the_figure_beside_the_panels(tmp_path, suffix):
    entries = [{**entry, "method": entry["method"] + suffix} for entry in grid_entries()]

    figure, legend, panels, bounds = drawn_legend(entries, tmp_path)

    assert figure.dpi == FIGURE_DPI
    assert 0 <= legend.x0 and legend.x1 <= bounds.x1 - 2 and 0 <= legend.y0 and legend.y1 <= bounds.y1
    assert all(panel.x1 <= legend.x0 for panel in panels)  # right of the curves, not over them
    assert bounds.width >= 2 * 1200 + legend.width  # two panels of 1,200 px each (labels included) beside it
    png = curves_png(entries, tmp_path, list(dict.fromkeys(entry["method"] for entry in entries)))
    assert abs(int.from_bytes(png[16:20], "big") - bounds.width) <= 1  # the PNG is the figure that holds it


def test_one_setting_with_one_seed_has_its_legend_inside_too(tmp_path):
    entries = [metrics_entry("a-fedavg-low-s0", "FedAvg", LOW, 0.5, 0, [0.2, 0.3, 0.4, 0.5, 0.5])]

    _, legend, panels, bounds = drawn_legend(entries, tmp_path)

    assert panels[0].x1 <= legend.x0 and legend.x1 <= bounds.x1 - 2


# ----------------------------------------------------------------------------- dvc exp show
def documented_exp_show() -> list[str]:
    """The `dvc exp show` command of docs/pipeline.md's command block, as arguments."""
    text = (REPO_ROOT / "docs" / "pipeline.md").read_text(encoding="utf-8")
    (line,) = [line for line in text.splitlines() if line.startswith("dvc exp show ")]
    return shlex.split(line.split("   #")[0])


def fake_grid_repository(workdir: Path) -> dict[str, str]:
    """A copy of the repository (the default grid's params.yaml) whose pipeline outputs are small stand-ins,
    recorded in dvc.lock by `dvc commit` (nothing trained): what `dvc exp show` reads after `make run`."""
    from dvc.repo import Repo

    copy_repository(REPO_ROOT, workdir, REPO_ROOT / "params.yaml")
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                   "DVC_NO_ANALYTICS": "1"}
    run_checked(["git", "init", "-q"], workdir, environment)
    run_checked(["dvc", "init", "-q", "-f"], workdir, environment)
    run_checked(["git", "add", "-A"], workdir, environment)
    run_checked(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"], workdir, environment)
    with Repo(str(workdir)) as repo:
        outputs = [(Path(out.fs_path), out.metric) for stage in repo.index.stages for out in stage.outs]
    figures = {"final_accuracy": 0.7123, "best_accuracy": 0.7345, "accuracy_at": {"2/5": 0.6512}}
    for path, metric in outputs:
        if path.suffix:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(figures) if metric else "stand-in")
        elif path.name == "summary":
            path.mkdir(parents=True, exist_ok=True)
            for method in ("fedavg", "fedprox-mu001", "fedrs-a05", "fedcme-mu001"):
                (path / f"{method}.json").write_text(json.dumps(figures))
        else:
            path.mkdir(parents=True, exist_ok=True)
            (path / "stand-in").write_text("stand-in")
    run_checked(["dvc", "commit", "-f", "-q"], workdir, environment)
    return environment


@pytest.mark.slow  # dvc init, commit and show in a copy of the repository: about 20 s
def test_the_documented_exp_show_has_the_grids_params_and_each_methods_final_accuracy(tmp_path):
    environment = fake_grid_repository(tmp_path)
    command = documented_exp_show()

    table = run_checked([*command, "--no-pager", "--csv"], tmp_path, environment)

    header = table.splitlines()[0].split(",")
    assert header == ["Experiment", "Created",
                      *(f"reports/summary/{method}.json:final_accuracy"
                        for method in ("fedavg", "fedcme-mu001", "fedprox-mu001", "fedrs-a05")),
                      "grid.datasets", "grid.partitions", "grid.clients", "grid.seeds", "grid.methods"]
    plain = run_checked(["dvc", "exp", "show", "--no-pager", "--csv"], tmp_path, environment)
    assert len(plain.splitlines()[0].split(",")) > 150  # what the filters cut
