"""The ``fedcme`` command line.

    fedcme simulate --config params.yaml --experiment NAME [--set training.lr=0.05 ...]

``simulate`` runs the experiment in this process with the core library's round loop
(no orchestrator), resuming ``runs/NAME`` if it holds a partial run of the same config.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import yaml

EXPERIMENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def experiment_name(value: str) -> str:
    """An experiment name is one path component: letters, digits, '.', '_', '-' (no '/', no '..')."""
    if not EXPERIMENT_NAME.match(value) or ".." in value:
        raise argparse.ArgumentTypeError(
            f"experiment name {value!r}: use letters, digits, '.', '_' and '-' only (no '/' or '..')"
        )
    return value


def parse_override(text: str) -> tuple[str, Any]:
    """`key.path=value`, the value read as YAML (numbers, booleans, lists)."""
    key, separator, value = text.partition("=")
    if not separator or not key:
        raise argparse.ArgumentTypeError(f"--set {text!r}: expected key.path=value")
    return key.strip(), yaml.safe_load(value)


def round_line(record: dict[str, Any], total_rounds: int, started: float, first_round: int) -> str:
    done = record["round"] + 1
    elapsed = time.perf_counter() - started
    remaining = elapsed / max(done - first_round, 1) * (total_rounds - done)
    return (
        f"round {done:>4}/{total_rounds}  acc {record['test_accuracy']:.4f}  loss {record['test_loss']:.4f}  "
        f"train_loss {record['train_loss']:.4f}  {record['round_seconds']:.1f}s  ETA {remaining:.0f}s"
    )


def simulate(arguments: argparse.Namespace) -> int:
    from fedcme_core.config import load_config
    from fedcme_core.federation import completed_rounds, run_experiment

    config = load_config(arguments.config, overrides=dict(arguments.overrides))
    run_dir = Path(arguments.runs_dir) / arguments.experiment
    first_round = completed_rounds(run_dir) if run_dir.exists() else 0
    total = config.federation.rounds
    print(f"experiment {arguments.experiment}: {config.algorithm.name} on {config.data.dataset}, "
          f"K={config.federation.num_clients} M={config.federation.clients_per_round} T={total} "
          f"E={config.training.local_epochs}; run directory {run_dir}"
          + (f" (resuming after round {first_round})" if first_round else ""), flush=True)
    started = time.perf_counter()
    history = run_experiment(
        config, run_dir, on_round=lambda record: print(round_line(record, total, started, first_round), flush=True)
    )
    summary = {
        "experiment": arguments.experiment,
        "rounds": len(history),
        "final_accuracy": history[-1]["test_accuracy"] if history else None,
        "best_accuracy": max((record["test_accuracy"] for record in history), default=None),
        "run_dir": str(run_dir),
    }
    print(json.dumps(summary))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedcme", description="FedCME and baselines, reproducibly.")
    commands = parser.add_subparsers(dest="command", required=True)
    simulate_parser = commands.add_parser("simulate", help="run an experiment in this process")
    simulate_parser.add_argument("--config", default="params.yaml", help="experiment config (YAML)")
    simulate_parser.add_argument("--experiment", type=experiment_name, default="default", help="run name (runs/NAME)")
    simulate_parser.add_argument("--runs-dir", default="runs", help="folder holding the run directories")
    simulate_parser.add_argument("--set", dest="overrides", type=parse_override, action="append", default=[],
                                 metavar="KEY=VALUE", help="override a config key, e.g. training.lr=0.05")
    simulate_parser.set_defaults(handler=simulate)
    return parser


def main(argv: list[str] | None = None) -> int:
    from fedcme_core.checkpoints import CheckpointError
    from fedcme_core.config import ConfigError
    from fedcme_core.data import DataError
    from fedcme_core.federation import RunError
    from fedcme_core.partition import PartitionError

    arguments = build_parser().parse_args(argv)
    try:
        return arguments.handler(arguments)
    except (ConfigError, DataError, PartitionError, CheckpointError, RunError) as error:
        print(f"fedcme: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedcme: interrupted; run the same command again to resume from the last completed round", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
