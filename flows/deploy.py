"""Serve the training flow as a Prefect deployment with a cron schedule.

Schedules need a persistent Prefect server (the temporary one started on demand creates no
scheduled runs): start one with `prefect server start --host 127.0.0.1 --port 4200`, set
`PREFECT_API_URL=http://127.0.0.1:4200/api`, then `fedcme serve ... --cron "0 2 * * *"`.
Runs appear, and can be triggered by hand, in the UI at http://127.0.0.1:4200.
"""

from __future__ import annotations

from typing import Any

from fedcme_core.config import load_config

from .train import make_task_runner, train_flow


def training_deployment(
    config_file: str,
    experiment: str,
    overrides: dict[str, Any] | None = None,
    cron: str | None = None,
    runs_dir: str = "runs",
    tracking_uri: str | None = None,
):
    """The deployment `fedcme-train/<experiment>` (config validated first; runner from the config)."""
    config = load_config(config_file, overrides=overrides)
    configured_flow = train_flow.with_options(task_runner=make_task_runner(config.runner))
    return configured_flow.to_deployment(
        name=experiment,
        cron=cron,
        parameters={
            "config_file": str(config_file),
            "experiment": experiment,
            "overrides": dict(overrides or {}),
            "runs_dir": runs_dir,
            "tracking_uri": tracking_uri,
        },
        description=f"FedCME training of experiment {experiment!r} from {config_file}",
    )


def serve_training(config_file: str, experiment: str, **options: Any) -> None:
    """Serve the deployment until interrupted (it starts scheduled and UI-triggered runs)."""
    from prefect import serve

    serve(training_deployment(config_file, experiment, **options))
