"""Statistics over seeds for the results report: mean ± std, paired differences, the summary CSV.

A grid trains every (method, setting) over ``grid.seeds``; within one seed all methods share the
partition and the initial model (both derive from the seed), so two methods are compared seed by
seed: the paired difference d_s = acc_A(s) - acc_B(s), its mean and sample std, the number of
seeds where A wins, and the paired t-test p-value (two-sided, n - 1 degrees of freedom).

The summary CSV has a row per experiment: its grid cell, what trained it (CONFIG_COLUMNS, from the
grid file's validated cell config: the partition, the classifier layers, the augmentation and
the algorithms' reading options) and its accuracies.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scipy import stats

from fedcme_core.algorithms import readings
from fedcme_core.config.partition_tags import partition_description

REFERENCE_METHOD = "FedAvg"
SIGNIFICANCE = 0.05  # a paired t-test p below this, with no seed lost, is a demonstrated win
MIN_SEEDS_FOR_P = 3  # no p-value below this many seeds (one degree of freedom says little): "n<3"
# The summary's accuracy columns (the measures a published figure may name) and the metrics key of each.
ACCURACY_KEYS = {"final_accuracy": "final_accuracy", "best_accuracy": "best_accuracy",
                 "accuracy_at_2T5": "accuracy_at/2/5"}
# The algorithms' open readings (SPEC.md; each config class's `readings`): empty in the rows of an
# algorithm without that option.
READINGS = readings()
CONFIG_COLUMNS = ("partition", "model", "lr", "batch_size", "classifier_layers", "augment", *READINGS)
# What computed each run (its metrics' about record; empty for runs published before 2026-12-07, whose
# compute is in their grid's NOTE): the layout and precision, the device, the machine.
COMPUTE_COLUMNS = ("compute", "device", "machine")
CSV_COLUMNS = (
    "grid", "method", "label", "dataset", "partition", "alpha", "num_clients", "clients_per_round", "local_epochs",
    *CONFIG_COLUMNS[1:], "rounds", "seed", *ACCURACY_KEYS, "final_local_accuracy", *COMPUTE_COLUMNS,
)


@dataclass(frozen=True)
class SeedStats:
    """One (method, setting) cell over its seeds: the values by seed, their mean, std (n - 1) and n."""

    by_seed: Mapping[int, float]

    @property
    def n(self) -> int:
        return len(self.by_seed)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.by_seed.values())

    @property
    def std(self) -> float | None:
        """The sample standard deviation; None for a single seed."""
        return statistics.stdev(self.by_seed.values()) if self.n >= 2 else None


@dataclass(frozen=True)
class PairedDifference(SeedStats):
    """A - B over the seeds both ran (``by_seed``: d_s): its mean, std and n, wins (d_s > 0),
    losses (d_s < 0), the paired t-test p, and whether A's win is demonstrated."""

    @property
    def wins(self) -> int:
        return sum(value > 0 for value in self.by_seed.values())

    @property
    def losses(self) -> int:
        return sum(value < 0 for value in self.by_seed.values())

    @property
    def p_value(self) -> float | None:
        """Paired t-test p-value; None below MIN_SEEDS_FOR_P seeds or when every d_s is the same."""
        if self.n < MIN_SEEDS_FOR_P or self.std == 0.0:
            return None
        values = list(self.by_seed.values())
        p_value = float(stats.ttest_1samp(values, 0.0).pvalue)
        return None if math.isnan(p_value) else p_value

    @property
    def demonstrated(self) -> bool:
        """A beats B on every seed, at p < SIGNIFICANCE (so over MIN_SEEDS_FOR_P seeds or more)."""
        return self.losses == 0 and self.p_value is not None and self.p_value < SIGNIFICANCE


def p_text(difference: PairedDifference | None, missing: str = "–") -> str:
    """The paired t-test p as a table shows it: "n<3" below MIN_SEEDS_FOR_P seeds, `missing` without
    runs or spread."""
    if difference is None:
        return missing
    if difference.n < MIN_SEEDS_FOR_P:
        return f"n<{MIN_SEEDS_FOR_P}"
    p_value = difference.p_value
    return missing if p_value is None else ("<0.001" if p_value < 0.001 else f"{p_value:.3f}")


def p_phrase(difference: PairedDifference) -> str:
    """"p = 0.037", or "n<3, no p-value" below MIN_SEEDS_FOR_P seeds: the p-value as prose gives it."""
    text = p_text(difference)
    return f"{text}, no p-value" if difference.n < MIN_SEEDS_FOR_P else f"p = {text}"


def value_of(entry: Mapping[str, Any], key: str) -> float | None:
    """entry[key], where `key` may be ``accuracy_at/2/5`` for a nested fraction."""
    if key.startswith("accuracy_at/"):
        value = entry["accuracy_at"].get(key.removeprefix("accuracy_at/"))
    else:
        value = entry.get(key)
    return None if value is None else float(value)


def cells_by_seed(entries: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], dict[int, Mapping[str, Any]]]:
    """{(method, setting): {seed: entry}}; two experiments of one cell and seed raise ValueError naming both."""
    cells: dict[tuple[str, str], dict[int, Mapping[str, Any]]] = {}
    for entry in entries:
        seeds = cells.setdefault((entry["method"], entry["setting"]), {})
        seed = int(entry["seed"])
        if seed in seeds:
            raise ValueError(
                f"experiments {seeds[seed]['experiment']!r} and {entry['experiment']!r} are both method "
                f"{entry['method']!r} in setting {entry['setting']!r} with seed {seed} (group {entry['group']!r})"
            )
        seeds[seed] = entry
    return cells


def seed_stats(by_seed: Mapping[int, Mapping[str, Any]], key: str) -> SeedStats | None:
    """The statistics of `key` over the seeds of one cell (seeds without a value left out)."""
    values = {seed: value_of(entry, key) for seed, entry in sorted(by_seed.items())}
    present = {seed: value for seed, value in values.items() if value is not None}
    return SeedStats(present) if present else None


def paired_difference(a: SeedStats, b: SeedStats) -> PairedDifference | None:
    """A - B over the seeds both have; None when they share none."""
    common = sorted(set(a.by_seed) & set(b.by_seed))
    if not common:
        return None
    return PairedDifference({seed: a.by_seed[seed] - b.by_seed[seed] for seed in common})


def fraction_text(value: float | None) -> str:
    """A CSV cell: the fraction in full (repr), empty where the run has no such figure."""
    return "" if value is None else repr(value)


def config_columns(config: Any) -> dict[str, str]:
    """The CONFIG_COLUMNS of a validated experiment config: "dirichlet(0.1)" / "labels_per_client(2)",
    model.name, training.lr and batch_size, model.classifier_layers, the effective augmentation, the
    algorithm's readings (READINGS; empty where its algorithm has no such reading)."""
    own = type(config.algorithm).readings
    return {
        "partition": partition_description(config.partition),
        "model": config.model.name,
        "lr": str(config.training.lr),
        "batch_size": str(config.training.batch_size),
        "classifier_layers": str(config.model.classifier_layers),
        "augment": config.augmentation,
        **{key: str(getattr(config.algorithm, key)) if key in own else "" for key in READINGS},
    }


def summary_csv(entries: Sequence[Mapping[str, Any]], grid: str,
                configs: Mapping[str, Mapping[str, str]] | None = None) -> str:
    """The grid's machine-readable summary: one row per experiment (CSV_COLUMNS), accuracies as fractions.

    `configs` holds the CONFIG_COLUMNS of each experiment by name (:func:`config_columns` of its cell
    config); an experiment it lacks has them empty. ``final_accuracy`` is the mean of the last rounds
    (the metrics' ``final_window``), ``accuracy_at_2T5`` the accuracy after round ceil(2T/5).
    """
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for entry in sorted(entries, key=lambda entry: entry["experiment"]):
        trained = (configs or {}).get(entry["experiment"], {})
        writer.writerow([
            grid, entry["method_name"], entry["method"], entry["dataset"], trained.get("partition", ""),
            "" if entry["alpha"] is None else entry["alpha"], entry["num_clients"], entry["clients_per_round"],
            entry["local_epochs"], *(trained.get(key, "") for key in CONFIG_COLUMNS[1:]), entry["rounds"],
            entry["seed"], *(fraction_text(value_of(entry, key)) for key in ACCURACY_KEYS.values()),
            fraction_text(value_of(entry, "final_local_accuracy")),  # empty for runs written before it
            *(entry.get(key, "") for key in COMPUTE_COLUMNS),
        ])
    return buffer.getvalue()
