"""The report's tuning section: each tuned method's chosen values and its candidates' validation curves,
only for a grid file with a ``tune:`` section (:mod:`flows.pipeline.tune` writes the records it reads).

The section names the candidates, each one's score (mean validation accuracy over the last 5 rounds,
:func:`fedcme_core.results.tuning.validation_score`) and the chosen one; the figure
(``<accuracy stem>-tuning.png`` beside the accuracy figure) draws every candidate's validation accuracy
per round, one panel per method.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedcme_core.common.atomic import atomic_write_bytes
from fedcme_core.config.params import ParamsFile

FIGURE_NAME = "tuning"
TUNING_DIR = Path("tuning")  # the tune stages' records (flows/pipeline/tune.py writes them)


def tuning_file(method: str, folder: Path = TUNING_DIR) -> Path:
    """tuning/<method>.json: a method's tuning record, a DVC output its train stages and the report read."""
    return Path(folder) / f"{method}.json"


def tuning_records(params: ParamsFile, folder: Path = TUNING_DIR) -> list[dict[str, Any]]:
    """The tuning records of the grid file's tuned methods, in its tune section's order ([] without one).
    A missing or unreadable record is a ValueError naming the file."""
    if params.tune is None:
        return []
    records = []
    for method in params.tune.methods:
        path = tuning_file(method, folder)
        try:
            records.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as error:
            raise ValueError(f"{path}: no tuning record of {method} ({error}); run its tune stage") from None
    return records


def values_text(values: Mapping[str, Any]) -> str:
    """{"training.lr": 0.01, "algorithm.mu": 0.1} -> "training.lr=0.01, algorithm.mu=0.1"."""
    return ", ".join(f"{key}={value}" for key, value in values.items())


def tuning_markdown(records: Sequence[Mapping[str, Any]], labels: Mapping[str, str], figure_link: str) -> str:
    """The section's Markdown (its heading included): a sentence on how the choice was made, a table per
    method (candidate, score, the chosen one in bold) and the figure."""
    first = records[0]
    parts = [
        "## Tuning\n",
        (f"Each tuned method's candidates trained for {first['rounds']} rounds (seed {first['seed']}) on "
         f"{first['setting']}, with {100 * first['validation_fraction']:.0f}% of the training set held out "
         "(stratified, seeded) before partitioning and evaluated on in place of the test set, which tuning "
         "never reads. Score = mean validation accuracy of the last 5 rounds; the best is chosen (a tie: the "
         "candidate listed first), and the method's train stages use it.\n"),
    ]
    for record in records:
        rows = ["| candidate | validation score (%) |", "|---|---:|"]
        for index, candidate in enumerate(record["candidates"]):
            mark = "**" if index == record["chosen"] else ""
            rows.append(f"| {mark}{values_text(candidate['values'])}{mark} | {mark}{100 * candidate['score']:.2f}{mark} |")
        label = labels.get(record["method"], record["method"])
        parts += [f"### {label}: {values_text(record['choice'])}\n", "\n".join(rows) + "\n"]
    parts.append(f"![tuning]({figure_link})\n")
    return "\n".join(parts)


def tuning_png(records: Sequence[Mapping[str, Any]], labels: Mapping[str, str]) -> bytes:
    """PNG bytes: validation accuracy (%) per round of every candidate, one panel per tuned method, the
    chosen candidate drawn bold."""
    import io

    from matplotlib.figure import Figure

    columns = min(2, len(records))
    rows = math.ceil(len(records) / columns)
    figure = Figure(figsize=(5.5 * columns, 3.6 * rows), dpi=100, layout="constrained")
    for axes, record in zip(figure.subplots(rows, columns, squeeze=False).flat, records):
        for index, candidate in enumerate(record["candidates"]):
            accuracy = [100 * value for value in candidate["validation_accuracy"]]
            chosen = index == record["chosen"]
            axes.plot(range(1, len(accuracy) + 1), accuracy, marker="o", markersize=3,
                      linewidth=2.4 if chosen else 1.2, label=values_text(candidate["values"]) + (" (chosen)" if chosen else ""))
        axes.set_title(f"{labels.get(record['method'], record['method'])}: candidates", fontsize=10)
        axes.set_xlabel("round")
        axes.set_ylabel("validation accuracy (%)")
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def add_tuning_section(params: ParamsFile, markdown: Path, accuracy_png: Path, folder: Path = TUNING_DIR) -> bool:
    """Append the tuning section to the written report `markdown` and write its figure beside
    `accuracy_png` (``<stem>-tuning.png``), when the grid file tunes any method; without a tune section
    the report is left as written and a tuning figure from an earlier grid is removed. Returns whether
    the section was added."""
    figure = Path(accuracy_png).with_name(f"{Path(accuracy_png).stem}-{FIGURE_NAME}.png")
    records = tuning_records(params, folder)
    if not records:
        figure.unlink(missing_ok=True)
        return False
    labels = {method: params.label(method) for method in params.methods}
    atomic_write_bytes(figure, tuning_png(records, labels))
    link = Path(os.path.relpath(figure.resolve(), Path(markdown).resolve().parent)).as_posix()
    text = Path(markdown).read_text(encoding="utf-8").rstrip("\n") + "\n\n" + tuning_markdown(records, labels, link)
    atomic_write_bytes(Path(markdown), text.encode("utf-8"))
    return True
