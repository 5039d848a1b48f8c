"""The ``fedcme`` command line.

    fedcme train    --config params.yaml --experiment NAME [--set training.lr=0.05 ...] [--register-model NAME]
                    [--allow-device-change]
    fedcme simulate --config params.yaml --experiment NAME [--set ...]
    fedcme serve    --config params.yaml --experiment NAME --cron "0 2 * * *" [--timezone Europe/Berlin]
    fedcme sync     --experiment NAME [--tracking-uri URI]
    fedcme check    params.yaml [configs/params-paper.yaml ...]

``train`` runs the Prefect training flow and tracks it in MLflow; ``simulate`` runs the same
round loop in this process without orchestrator or tracking; ``serve`` serves the training
flow as a scheduled Prefect deployment. All resume ``runs/NAME`` when it holds a partial run
of the same config. ``sync`` logs a run directory's rounds and model into MLflow when
tracking failed during training. ``check`` validates whole params files (every section and
every grid cell) and that each holds every params path ``dvc.yaml`` reads. A run directory
belongs to one command at a time: a second one on it stops at once (``fedcme_core.rounds.lock``).
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from collections.abc import Callable
from typing import Any

import yaml

from flows.common.command import quiet_environment, report_errors, show_warning


def parse_override(text: str) -> tuple[str, Any]:
    """`key.path=value`, the value read as YAML (numbers, booleans, lists)."""
    key, separator, value = text.partition("=")
    if not separator or not key:
        raise argparse.ArgumentTypeError(f"--set {text!r}: expected key.path=value")
    return key.strip(), yaml.safe_load(value)


def simulate(arguments: argparse.Namespace) -> int:
    """Run the experiment in this process, holding its run directory from the command's first second
    (no torch yet: a second command on it is refused at once), then checking its dataset and device."""
    from fedcme_core.common.run_lock import experiment_run_dir, hold_run
    from fedcme_core.config import load_config

    config = load_config(arguments.config, overrides=dict(arguments.overrides))
    run_dir = experiment_run_dir(arguments.runs_dir, arguments.experiment)
    with hold_run(run_dir, tidy=True):  # a bad input found by the checks leaves no lock file behind
        from fedcme_core.rounds import load_experiment_dataset

        from flows.common.command import check_device

        load_experiment_dataset(config.data, config.seed)  # a bad dataset or device stops here, before anything is written
        check_device(config.device)
        return simulate_held(arguments, config, run_dir)


def simulate_held(arguments: argparse.Namespace, config, run_dir) -> int:
    """`simulate` past its checks, its run directory held: the rounds, each as a line, and a JSON summary."""
    from fedcme_core.results.records import round_line
    from fedcme_core.rounds import completed_rounds, run_experiment

    first_round = completed_rounds(run_dir) if run_dir.exists() else 0
    total = config.federation.rounds
    print(f"experiment {arguments.experiment}: {config.algorithm.name} on {config.data.dataset}, "
          f"K={config.federation.num_clients} M={config.federation.clients_per_round} T={total} "
          f"E={config.training.local_epochs}; run directory {run_dir}"
          + (f" (resuming after round {first_round})" if first_round else ""), flush=True)
    started = time.perf_counter()
    history = run_experiment(
        config, run_dir, on_round=lambda record: print(
            round_line(record, total, time.perf_counter() - started, record["round"] + 1 - first_round), flush=True)
    )
    from fedcme_core.results.metrics import summarize

    figures = summarize(history) if history else {}
    summary = {
        "experiment": arguments.experiment,
        "rounds": len(history),
        "final_accuracy": figures.get("final_accuracy"),  # mean of the last 5 rounds, as MLflow and the report
        "last_accuracy": history[-1]["test_accuracy"] if history else None,
        "best_accuracy": figures.get("best_accuracy"),
        "run_dir": str(run_dir),
    }
    print(json.dumps(summary))
    return 0


def train(arguments: argparse.Namespace) -> int:
    """Validate the config, take the run directory, then start Prefect and train (flows.orchestration.train).

    The config (a whole params file, grid included) is validated first (0.3 s, no torch), so a typo
    starts nothing; the run directory's lock comes next (no torch either,
    ``fedcme_core.common.run_lock``), so a second command on a run in use is refused in its first
    second, before any start-up. With no Prefect API configured, Prefect's temporary server starts
    then and boots on the other core while this process imports torch, MLflow and the flow."""
    from fedcme_core.common.run_lock import experiment_run_dir, hold_run
    from fedcme_core.config import load_config

    from flows.orchestration.prefect_server import run_against_prefect

    overrides = dict(arguments.overrides)
    if arguments.register_model is not None:  # validated with the config: a bad name is one line
        overrides["tracking.register_model"] = arguments.register_model
    config = load_config(arguments.config, overrides=overrides)
    run_dir = experiment_run_dir(arguments.runs_dir, arguments.experiment)

    def action(ready: Callable[[], None]) -> dict[str, Any]:
        from flows.orchestration.train import run_training

        return run_training(
            config,
            arguments.experiment,
            ready,
            runs_dir=arguments.runs_dir,
            tracking_uri=arguments.tracking_uri,
            partition_file=arguments.partition,
            mlflow_experiment=arguments.mlflow_experiment,
            allow_device_change=arguments.allow_device_change,
        )

    with hold_run(run_dir, tidy=True):  # a bad input found by the checks leaves no lock file behind
        summary = run_against_prefect(action, "this run")
    print(json.dumps(summary))
    return 0


def serve(arguments: argparse.Namespace) -> int:
    from flows.orchestration.deploy import serve_training

    serve_training(
        arguments.config,
        arguments.experiment,
        overrides=dict(arguments.overrides),
        cron=arguments.cron,
        timezone=arguments.timezone,
        runs_dir=arguments.runs_dir,
        tracking_uri=arguments.tracking_uri,
    )
    return 0


def sync(arguments: argparse.Namespace) -> int:
    """Log a run directory into MLflow, holding it (a run still training logs its own rounds)."""
    import contextlib

    from fedcme_core.rounds import experiment_run_dir
    from fedcme_core.rounds.lock import hold_run

    from flows.tracking.sync import sync_run

    run_dir = experiment_run_dir(arguments.runs_dir, arguments.experiment)
    with hold_run(run_dir) if run_dir.is_dir() else contextlib.nullcontext():  # none: sync_run says what is wrong
        summary = sync_run(run_dir, arguments.tracking_uri)
    print(json.dumps(summary))
    return 0


def check(arguments: argparse.Namespace) -> int:
    from pathlib import Path

    from fedcme_core.config.params import load_params

    from flows.pipeline.dvc_params import check_dvc_params
    from flows.report.factors import load_study

    for path in arguments.params:
        params = load_params(path)
        load_study(path, params)  # a study's roles and factors name methods of its grids' files
        dvc_yaml = Path(arguments.dvc_yaml)
        paths = f"; all {check_dvc_params(dvc_yaml, path)} params paths of {dvc_yaml} present" if dvc_yaml.is_file() else ""
        grid = len(list(params.grid.cells()))
        ablation = len(list(params.ablation.cells())) if params.ablation is not None else 0
        print(f"{path}: ok, {grid} grid and {ablation} ablation experiments{paths}")
    return 0


def _experiment_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default="params.yaml", help="experiment config (YAML)")
    parser.add_argument("--experiment", default="default", help="run name (runs/NAME)")
    parser.add_argument("--runs-dir", default="runs", help="folder holding the run directories")
    parser.add_argument("--set", dest="overrides", type=parse_override, action="append", default=[],
                        metavar="KEY=VALUE", help="override a config key, e.g. training.lr=0.05")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedcme", description="FedCME and baselines, reproducibly.")
    commands = parser.add_subparsers(dest="command", required=True)

    train_parser = commands.add_parser("train", help="run the Prefect training flow, tracked in MLflow")
    _experiment_arguments(train_parser)
    train_parser.add_argument("--tracking-uri", default=None,
                              help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    train_parser.add_argument("--partition", default=None, help="a partition file to use (e.g. from `dvc repro`)")
    train_parser.add_argument("--register-model", default=None, metavar="NAME",
                              help="register the final model in MLflow's registry as a new version of NAME "
                                   "(tags method, seed, final_accuracy); sets tracking.register_model")
    train_parser.add_argument("--mlflow-experiment", default=None, metavar="NAME",
                              help="the MLflow experiment (default: tracking.mlflow_experiment, else fedcme-smoke for "
                                   "synthetic data, else fedcme)")
    train_parser.add_argument("--allow-device-change", action="store_true",
                              help="resume a run on another device than it trained on (cpu <-> cuda); its layout "
                                   "and precision are calibrated again for this device")
    train_parser.set_defaults(handler=train)

    simulate_parser = commands.add_parser("simulate", help="run an experiment in this process (no Prefect, no MLflow)")
    _experiment_arguments(simulate_parser)
    simulate_parser.set_defaults(handler=simulate)

    serve_parser = commands.add_parser("serve", help="serve the training flow as a scheduled Prefect deployment")
    _experiment_arguments(serve_parser)
    serve_parser.add_argument("--cron", default=None, help='a cron schedule, e.g. "0 2 * * *" (none: run on demand)')
    serve_parser.add_argument("--timezone", default=None,
                              help='the cron schedule\'s time zone, e.g. "Europe/Berlin" (default: UTC)')
    serve_parser.add_argument("--tracking-uri", default=None, help="MLflow tracking URI for the runs")
    serve_parser.set_defaults(handler=serve)

    sync_parser = commands.add_parser("sync", help="log a run directory's rounds and model into MLflow")
    sync_parser.add_argument("--experiment", required=True, help="run name (runs/NAME)")
    sync_parser.add_argument("--runs-dir", default="runs", help="folder holding the run directories")
    sync_parser.add_argument("--tracking-uri", default=None,
                             help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    sync_parser.set_defaults(handler=sync)

    check_parser = commands.add_parser("check", help="validate whole params files against the schema and dvc.yaml")
    check_parser.add_argument("params", nargs="+", help="params files (params.yaml, configs/params-*.yaml)")
    check_parser.add_argument("--dvc-yaml", default="dvc.yaml", help="the pipeline whose params paths must be present "
                              "(skipped when the file does not exist)")
    check_parser.set_defaults(handler=check)
    return parser


def main(argv: list[str] | None = None) -> int:
    arguments = build_parser().parse_args(argv)
    quiet_environment()
    warnings.showwarning = show_warning
    return report_errors(lambda: run_command(arguments))


def run_command(arguments: argparse.Namespace) -> int:
    """Check the experiment name (it becomes a folder under --runs-dir), then run the command."""
    if arguments.command != "check":
        from fedcme_core.common.run_lock import check_experiment_name

        check_experiment_name(arguments.experiment)
    return arguments.handler(arguments)


def entry() -> None:
    """The `fedcme` console script: `main`, then a prompt exit (flows.common.command.exit_promptly)."""
    from flows.common.command import exit_promptly

    exit_promptly(main())


if __name__ == "__main__":
    entry()
