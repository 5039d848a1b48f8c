"""What DVC shows of a grid: the per-method summary that `dvc exp show` compares, and the overlay plot.

- :func:`summary_metrics` -> ``reports/summary.json``, the report stage's DVC metric:
  ``{"accuracy": {method name: final test accuracy (%)}}``, each the mean over the grid's settings
  and seeds of the mean of the last rounds (SPEC.md's final accuracy), so that `make compare` (`dvc
  exp show`) has one short column per method (``accuracy.fedavg``) rather than one per experiment.
- :func:`curve_tables` -> ``reports/curves/<setting>.csv`` (and ``<setting>-ablation.csv``): per
  round and method the test accuracy (%) as the mean over seeds with its min and max, the data of
  the top-level plot of dvc.yaml, which overlays the methods of a setting in one chart through the
  template ``.dvc/plots/overlay.json`` (integer rounds, one colour and dash per method, the band).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedcme_core.partition_tags import entry_partition_tag

from .report_figures import setting_curves
from .report_tables import ablation_entries, unique_in_order
from .stages import setting_name

CURVE_COLUMNS = ("round", "method", "accuracy", "accuracy_min", "accuracy_max", "seeds")


def summary_metrics(entries: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """{"accuracy": {method name: mean final accuracy (%) over every experiment of that method}}."""
    names = unique_in_order([entry["method_name"] for entry in entries])
    accuracy = {}
    for name in names:
        finals = [float(entry["final_accuracy"]) for entry in entries if entry["method_name"] == name]
        accuracy[name] = round(100.0 * sum(finals) / len(finals), 2)
    return {"accuracy": accuracy}


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
            for method, (rounds, mean, low, high, seeds) in by_method.items():
                label = '"' + method.replace('"', '""') + '"'
                lines += [f"{r},{label},{100 * m:.4f},{100 * lo:.4f},{100 * hi:.4f},{seeds}"
                          for r, m, lo, hi in zip(rounds, mean, low, high, strict=True)]
            tables[f"{slugs[setting]}{suffix}.csv"] = "\n".join(lines) + "\n"
    return tables
