"""Serve the training flow as a Prefect deployment with a cron schedule.

Schedules need a persistent Prefect server (the temporary one started on demand creates no
scheduled runs): start one with `prefect server start --host 127.0.0.1 --port 4200`, set
`PREFECT_API_URL=http://127.0.0.1:4200/api`, then `fedcme serve ... --cron "0 2 * * *"`.
Runs appear, and can be triggered by hand, in the UI at http://127.0.0.1:4200.

A scheduled deployment trains anew on every run: each run is an experiment of its own, named by
its scheduled start (`nightly-20261202-020000`, UTC), with its own run directory and MLflow run,
from the config as validated when the deployment was built (serve again to take up an edited
file). A deployment without a schedule trains (or resumes, or extends) the one experiment it
names. Scheduled runs go to the MLflow experiment `fedcme-scheduled`
(flows.tracking.names.mlflow_experiment_for), apart from the grids' `fedcme`; a config's
`tracking.mlflow_experiment` chooses another.
"""

from __future__ import annotations

from typing import Any

from fedcme_core.config.schema import ConfigError
from fedcme_core.config import load_config

from flows.orchestration.tasks import make_task_runner
from flows.orchestration.train import train_flow


def training_deployment(
    config_file: str,
    experiment: str,
    overrides: dict[str, Any] | None = None,
    cron: str | None = None,
    runs_dir: str = "runs",
    tracking_uri: str | None = None,
    timezone: str | None = None,
):
    """The deployment `fedcme-train/<experiment>` (config validated first; runner from the config).

    The config file is read and validated here, once: the entry point's one parse. A deployment
    holds no Python object between runs, so its `config` parameter is the validated config's
    plain values (``model_dump(mode="json")``, what Prefect stores and its UI shows); Prefect's
    parameter check validates them into the flow's ExperimentConfig once as each run starts
    (:func:`flows.orchestration.train.train_flow`). No run reads the file again."""
    config = load_config(config_file, overrides=overrides)
    schedules = [schedule(cron, timezone)] if cron is not None else None
    configured_flow = train_flow.with_options(task_runner=make_task_runner(config.runner, config.device))
    return configured_flow.to_deployment(
        name=experiment,
        schedules=schedules,
        parameters={
            "config": config.model_dump(mode="json"),
            "experiment": experiment,
            "runs_dir": runs_dir,
            "tracking_uri": tracking_uri,
            "dated": cron is not None,
        },
        description=f"FedCME training of experiment {experiment!r} from {config_file}",
    )


def schedule(cron: str, timezone: str | None):
    """A cron schedule, in `timezone` (IANA name; None: UTC); a bad one is a one-line ConfigError."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    from prefect.schedules import Cron

    if timezone is not None:
        try:
            ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ConfigError(f"--timezone {timezone!r}: not an IANA time zone name (e.g. Europe/Berlin)") from None
    try:
        return Cron(cron, timezone=timezone)
    except ValueError:
        raise ConfigError(f"--cron {cron!r}: not a cron expression (e.g. \"0 2 * * *\")") from None


def serve_training(config_file: str, experiment: str, **options: Any) -> None:
    """Serve the deployment until interrupted (it starts scheduled and UI-triggered runs)."""
    from prefect import serve

    serve(training_deployment(config_file, experiment, **options))
