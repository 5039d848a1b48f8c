"""Metrics entries and folders as the train stage writes them, for the report's tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fedcme_core.results.metrics import history_csv, split_summary

LOW = "FMNIST a=0.1 K=50 M=20"
HIGH = "FMNIST a=0.5 K=50 M=20"


def metrics_entry(experiment: str, method: str, setting: str, final_accuracy: float, seed: int = 0,
                  accuracy_at: list[float] | None = None, rounds_to_target: int | None = None,
                  group: str = "main") -> dict:
    """A metrics file's content: summarize() keys for a 10-round run plus the identity keys."""
    accuracy_at = accuracy_at or [final_accuracy] * 5
    return {
        "experiment": experiment, "method": method, "setting": setting, "group": group, "seed": seed,
        "method_name": method.lower(), "dataset": "fmnist", "alpha": 0.1 if setting == LOW else 0.5,
        "num_clients": 50, "clients_per_round": 20, "local_epochs": 2,
        "rounds": 10, "final_window": 5, "final_accuracy": final_accuracy, "final_loss": 1.0,
        "best_accuracy": max(accuracy_at), "best_round": 10,
        "accuracy_at": {f"{k}/5": value for k, value in enumerate(accuracy_at, start=1)},
        "target_accuracy": 0.6, "rounds_to_target": rounds_to_target, "total_seconds": 20.0,
    }


def grid_entries() -> list[dict]:
    """3 methods x 2 seeds in LOW, 2 methods x 1 seed in HIGH (FedProx not run there)."""
    return [
        metrics_entry("a-fedavg-low-s0", "FedAvg", LOW, 0.50, 0, [0.2, 0.35, 0.42, 0.48, 0.50]),
        metrics_entry("a-fedavg-low-s1", "FedAvg", LOW, 0.60, 1, [0.2, 0.45, 0.52, 0.58, 0.60], 5),
        metrics_entry("b-fedprox-low-s0", "FedProx(0.01)", LOW, 0.51, 0, [0.3, 0.45, 0.55, 0.60, 0.62], 4),
        metrics_entry("b-fedprox-low-s1", "FedProx(0.01)", LOW, 0.62, 1, [0.3, 0.45, 0.55, 0.60, 0.62], 4),
        metrics_entry("c-fedcme-low-s0", "FedCME(0.01)", LOW, 0.53, 0, [0.35, 0.5, 0.58, 0.61, 0.62], 3),
        metrics_entry("c-fedcme-low-s1", "FedCME(0.01)", LOW, 0.61, 1, [0.35, 0.5, 0.58, 0.61, 0.62], 5),
        metrics_entry("d-fedavg-high-s0", "FedAvg", HIGH, 0.7012, 0),
        metrics_entry("e-fedcme-high-s0", "FedCME(0.01)", HIGH, 0.725, 0, rounds_to_target=2),
    ]


def write_metrics_folder(folder: Path, entries: list[dict]) -> Path:
    """Each entry as the train stage writes it (<experiment>.json and about/<experiment>.json) plus a
    5-round <experiment>.csv along its accuracy_at."""
    (folder / "about").mkdir(parents=True, exist_ok=True)
    for entry in entries:
        results, about = split_summary(entry)
        (folder / f"{entry['experiment']}.json").write_text(json.dumps(results), encoding="utf-8")
        (folder / "about" / f"{entry['experiment']}.json").write_text(json.dumps(about), encoding="utf-8")
        history = [
            {"round": index, "test_accuracy": accuracy, "test_loss": 1.0, "train_loss": 0.5, "round_seconds": 1.0}
            for index, accuracy in enumerate(entry["accuracy_at"].values())
        ]
        (folder / f"{entry['experiment']}.csv").write_text(history_csv(history), encoding="utf-8")
    return folder


def matching_record(entry: dict, pairs_per_round: list[list[list[int]]]) -> dict:
    rounds = [{"round": r + 1, "pairs": pairs, "matched_cosine": 0.5 if pairs else None,
               "random_cosine": 0.8 if pairs else None} for r, pairs in enumerate(pairs_per_round)]
    return {key: entry[key] for key in ("experiment", "method", "setting", "group", "seed")} | {
        "class_counts": np.arange(40).reshape(4, 10).tolist(), "rounds": rounds}


def table_row(table: str, name: str) -> list[str]:
    row = next(line for line in table.splitlines() if line.startswith(f"| {name} |"))
    return [cell.strip() for cell in row.strip("|").split("|")][1:]
