"""Runs and grid files for the sensitivity study's tests: hand-made entries, committed T=100 runs
copied as a grid's, and publish_sensitivity (tools/) on the path."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import yaml

from fedcme_core.results.metrics import split_summary, with_content_hash
from fedcme_core.config.sections import setting_label

from .conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "tools"))
from publish_sensitivity import config_changes, main, publish_sensitivity  # noqa: E402, F401  (the tests' entry points)

SENSITIVITY = REPO_ROOT / "configs" / "params-sensitivity.yaml"
T100 = REPO_ROOT / "docs" / "results" / "cifar10-t100"
SEEDS3 = (0, 1, 2)


def entry(method: str, seed: int, accuracy: float, partition: str = "a0.1") -> dict:
    return {"experiment": f"cifar10-{partition}-k50m20-{method}-s{seed}", "method_name": method, "seed": seed,
            "final_accuracy": accuracy, "partition": partition}


def runs(method: str, accuracies: dict[int, float], partition: str = "a0.1") -> list[dict]:
    return [entry(method, seed, value, partition) for seed, value in accuracies.items()]


def sensitivity_values() -> dict:
    return yaml.safe_load(SENSITIVITY.read_text())


def write_grid(folder: Path, values: dict, name: str = "params-sensitivity.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(values))
    return path


def publish_copy(source: str, target: Path, grid: str, method: str, seed: int, partition: str = "a0.1",
                 clients: tuple[int, int] = (50, 20)) -> None:
    """Copy a committed T=100 run as `method`'s seed-`seed` run of a sensitivity grid (rehashed, in split form)."""
    about = json.loads((T100 / "about" / f"{source}.json").read_text())
    results = json.loads((T100 / f"{source}.json").read_text())
    name = f"cifar10-{partition}-k{clients[0]}m{clients[1]}-{method}-s{seed}"
    about.update(experiment=name, method_name=method, method=method, seed=seed, partition=partition,
                 num_clients=clients[0], clients_per_round=clients[1],
                 setting=setting_label("cifar10", partition, *clients),
                 group="main" if grid != "sensitivity" or method in ("fedavg", "fedcme-mu001") else "ablation")
    about.pop("content_sha256")
    results_part, about_part = split_summary(with_content_hash({**results, **about}))
    folder = target / grid
    (folder / "about").mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(results_part))
    (folder / "about" / f"{name}.json").write_text(json.dumps(about_part))
    shutil.copy(T100 / f"{source}.csv", folder / f"{name}.csv")


def accuracy(source: str) -> float:
    return json.loads((T100 / f"{source}.json").read_text())["final_accuracy"]


def real_results(tmp_path: Path) -> Path:
    results = tmp_path / "docs" / "results"
    run = "cifar10-a0.1-k50m20-{}-s{}"
    for seed in SEEDS3:
        publish_copy(run.format("fedavg", seed), results, "sensitivity", "fedavg", seed)
        publish_copy(run.format("fedcme-mu001", seed), results, "sensitivity", "fedcme-mu001", seed)
        publish_copy(run.format("fedrs-a05", seed), results, "sensitivity", "fedrs-a05", seed)
    publish_copy(run.format("fedcme-no-exchange", 0), results, "sensitivity", "fedcme-no-exchange", 0)
    publish_copy(run.format("fedcme-mu01", 0), results, "sensitivity", "sample-mean", 0)
    publish_copy(run.format("fedcme-no-alignment", 0), results, "sensitivity", "sample-mean-nx", 0)
    publish_copy(run.format("fedprox-mu001", 0), results, "sensitivity-c2", "fedavg", 0, "c2")
    publish_copy(run.format("moon-mu1", 0), results, "sensitivity-c2", "fedcme-mu001", 0, "c2")
    return results
