"""What a training run shows where a researcher compares runs, besides its per-round metrics: its
summary figures, its accuracy curve, and the links between its Prefect flow run and its MLflow run.
One object holds a run's names, tags and links (:class:`RunViews`), its commit read as the run starts.

The Prefect side: the flow run is tagged (`commit:`, `method:`, `algorithm:`, `seed:`, `grid:`;
flows/tracking/names.py), its version is the git commit, and it ends with two artifacts, `mlflow-run` (a
link to the MLflow run: the tracking server's URL, or for a sqlite store the URL `mlflow ui` serves it
at, with the run id and the store in its description) and `training-summary` (markdown: final accuracy,
best, rounds, and the MLflow run as a link to its page).

The MLflow side: every summary figure logged (a child's ``final_accuracy``, a grid parent's table) is
rounded by :func:`rounded`, so the UI shows no float noise; the params are the flattened config less
what its dataset does not use (:func:`run_params`).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedcme_core.config.schema import ExperimentConfig
from fedcme_core.results.metrics import summarize

from flows.tracking.names import flow_run_tags, identity_tags, method_label, mlflow_experiment_for, run_name

PROJECT_DIR = Path(__file__).resolve().parents[2]
MLFLOW_UI_DEFAULT = "http://127.0.0.1:5000"  # where README's `mlflow ui ... --host 127.0.0.1` serves a sqlite store
PREFECT_UI_DEFAULT = "http://127.0.0.1:4200"  # where README's `prefect server start --host 127.0.0.1` serves PREFECT_HOME
SUMMARY_DIGITS = 6  # decimals of a logged summary figure (a fraction: 0.0001 percentage points)
SYNTHETIC_PARAMS = "data.synthetic."  # the synthetic source's settings: params of runs on synthetic data only


def git_commit(directory: Path = PROJECT_DIR) -> str:
    """The checkout's commit (`git rev-parse HEAD` in `directory`), "unknown" outside a git checkout:
    what a run's tags and its flow run's version trace it to. Runs git: call it when a run starts."""
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True, text=True, timeout=10, check=True
        )
        return result.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@dataclass(frozen=True)
class RunViews:
    """How one training run is named, tagged and linked where a researcher finds it: `experiment` (its
    run directory's and its flow run's name), `label` (its method label: a grid's, else derived,
    flows.tracking.names.method_label), `mlflow_experiment` (where its MLflow run goes), `commit` (the
    code it ran: tags and the flow run's version), and in a DVC grid `grid` (``report.name``) and
    `parent_run_id` (the grid run's parent MLflow run, under which it nests, flows.tracking.grid)."""

    experiment: str
    label: str
    mlflow_experiment: str
    commit: str
    grid: str | None = None
    parent_run_id: str | None = None

    @classmethod
    def start(cls, config: ExperimentConfig, experiment: str, label: str | None = None, grid: str | None = None,
              mlflow_experiment: str | None = None, scheduled: bool = False,
              parent_run_id: str | None = None) -> RunViews:
        """The views of a run starting now (its commit read now): `mlflow_experiment` None chooses by the
        kind of run (flows.tracking.names.mlflow_experiment_for; `scheduled`: a scheduled deployment's)."""
        return cls(experiment, label or method_label(config),
                   mlflow_experiment_for(config, mlflow_experiment, scheduled=scheduled), git_commit(), grid,
                   parent_run_id)

    def run_name(self, config: ExperimentConfig) -> str:
        """The MLflow run's name (flows.tracking.names.run_name)."""
        return run_name(config, self.label)

    def flow_run_tags(self, config: ExperimentConfig) -> list[str]:
        """The Prefect flow run's tags (flows.tracking.names.flow_run_tags), `method:` its label."""
        return flow_run_tags(config, self.commit, self.grid, self.label)

    def mlflow_params(self, config: ExperimentConfig) -> dict[str, Any]:
        """The MLflow run's params (:func:`run_params`)."""
        return run_params(config)

    def mlflow_tags(self, config: ExperimentConfig, prefect_flow_run_id: str | None,
                    temporary_prefect: bool = False) -> dict[str, str]:
        """The MLflow run's tags (:func:`run_tags`), linking to the flow run `prefect_flow_run_id`."""
        return run_tags(config, self.experiment, self.commit, prefect_flow_run_id, self.label, self.grid,
                        self.parent_run_id, temporary_prefect=temporary_prefect)


def rounded(value: float) -> float:
    """A summary figure as MLflow logs it: `value` rounded to SUMMARY_DIGITS decimals
    (0.7059200000000001 -> 0.70592), so the UI shows no float noise."""
    return round(float(value), SUMMARY_DIGITS)


def run_params(config: ExperimentConfig) -> dict[str, Any]:
    """The MLflow run's params: the flattened config (``config.flat()``) less the synthetic source's
    settings (``data.synthetic.*``) unless the run trains on synthetic data."""
    keep_synthetic = config.data.dataset == "synthetic"
    return {key: value for key, value in config.flat().items()
            if keep_synthetic or not key.startswith(SYNTHETIC_PARAMS)}


def run_figures(history: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """final_accuracy (mean of the last 5 rounds, `summarize`), best_accuracy and best_round,
    last_accuracy (the last round's) and rounds, as fractions and 1-based rounds."""
    summary = summarize(history)
    return {"final_accuracy": summary["final_accuracy"], "best_accuracy": summary["best_accuracy"],
            "best_round": summary["best_round"], "rounds": summary["rounds"],
            "last_accuracy": float(max(history, key=lambda record: int(record["round"]))["test_accuracy"])}


def accuracy_figure(history: Sequence[Mapping[str, Any]], metric: str, title: str):
    """A small figure of test accuracy per round, titled `title` (the run's name: seed, method label,
    setting), its round axis ticked at whole rounds only (matplotlib's Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    records = sorted(history, key=lambda record: int(record["round"]))
    figure, axes = plt.subplots(figsize=(4.0, 2.8), dpi=100)
    axes.plot([int(record["round"]) + 1 for record in records], [float(record["test_accuracy"]) for record in records],
              marker="o" if len(records) <= 30 else None, markersize=3)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("round")
    axes.set_title(title, fontsize=8)
    axes.set_ylabel(f"test accuracy ({metric})", fontsize=8)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    return figure


def mlflow_run_url(uri: str, experiment_id: str, run_id: str) -> str:
    """The run's page in MLflow's UI: the tracking server's own (http), else $FEDCME_MLFLOW_UI_URL,
    else where `mlflow ui --host 127.0.0.1` serves a sqlite store."""
    base = uri if uri.startswith(("http://", "https://")) else os.environ.get("FEDCME_MLFLOW_UI_URL", MLFLOW_UI_DEFAULT)
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


def prefect_flow_run_url(flow_run_id: str, temporary: bool = False) -> str | None:
    """The flow run's page in Prefect's UI, where its URL is known (PREFECT_UI_URL or the API's).

    A temporary server's address dies with its command, but its records stay in
    $PREFECT_HOME/prefect.db, which README's `prefect server start --host 127.0.0.1` serves:
    there ($FEDCME_PREFECT_UI_URL, else PREFECT_UI_DEFAULT) the link leads."""
    if temporary:
        base = os.environ.get("FEDCME_PREFECT_UI_URL", PREFECT_UI_DEFAULT)
        return f"{base.rstrip('/')}/runs/flow-run/{flow_run_id}"
    from prefect.utilities.urls import url_for

    try:
        return url_for("flow-run", obj_id=flow_run_id)
    except Exception:  # noqa: BLE001 - no UI known: the id is the reference
        return None


def label_flow_run(flow_run_id: str, tags: list[str], version: str) -> None:
    """Add `tags` to the flow run and set its version (the git commit), through Prefect's client
    (so a deployment's runs get them too)."""
    from prefect.client.orchestration import get_client

    try:
        with get_client(sync_client=True) as client:
            existing = list(client.read_flow_run(flow_run_id).tags or [])
            client.update_flow_run(flow_run_id, tags=sorted({*existing, *tags}), flow_version=version)
    except Exception as error:  # noqa: BLE001 - a label is no reason to stop training
        warn(f"could not tag the Prefect flow run {flow_run_id}", error)


def warn(what: str, error: BaseException) -> None:
    """One line on stderr: the views are extras, their failure never stops a run."""
    reason = str(error).splitlines()[0] if str(error).strip() else type(error).__name__
    print(f"warning: {what} ({reason}); the run itself is complete", file=sys.stderr, flush=True)


def summary_markdown(experiment: str, label: str, figures: Mapping[str, Any], mlflow_run_id: str | None,
                     mlflow_url: str | None = None) -> str:
    """The flow run's `training-summary` artifact: its final figures as a small markdown table, the
    MLflow run a link to `mlflow_url` (its page, :func:`mlflow_run_url`) where that is known."""
    run = f"[{mlflow_run_id}]({mlflow_url})" if mlflow_run_id and mlflow_url else mlflow_run_id
    rows = [("final accuracy (mean of the last 5 rounds)", f"{figures['final_accuracy']:.4f}"),
            ("best accuracy", f"{figures['best_accuracy']:.4f} (round {figures['best_round']})"),
            ("last round's accuracy", f"{figures['last_accuracy']:.4f}"),
            ("rounds", str(figures["rounds"])),
            ("MLflow run", run or "not tracked")]
    table = "\n".join(f"| {name} | {value} |" for name, value in rows)
    return f"### {experiment}: {label}\n\n| | |\n|---|---|\n{table}\n"


def publish_artifacts(experiment: str, label: str, figures: Mapping[str, Any], uri: str,
                      experiment_id: str | None, run_id: str | None) -> None:
    """The flow run's two artifacts: `mlflow-run` (link) and `training-summary` (markdown)."""
    from prefect.artifacts import create_link_artifact, create_markdown_artifact

    try:
        url = None
        if run_id is not None and experiment_id is not None:
            url = mlflow_run_url(uri, experiment_id, run_id)
            create_link_artifact(url, link_text=f"MLflow run {run_id}",
                                 key="mlflow-run", description=f"MLflow run {run_id} in {uri}")
        create_markdown_artifact(summary_markdown(experiment, label, figures, run_id, url), key="training-summary",
                                 description=f"{experiment}: final accuracy {figures['final_accuracy']:.4f}")
    except Exception as error:  # noqa: BLE001
        warn("could not write the Prefect flow run's artifacts", error)


def progress_logger():
    """The flow run's logger for the round lines: INFO to Prefect's API only, so the UI's Logs tab
    shows the run's progress while the console stays as quiet as ``PREFECT_LOGGING_LEVEL`` asks
    (the console gets the same lines from ``print``)."""
    from prefect import get_run_logger
    from prefect.logging.handlers import APILogHandler
    from prefect.logging.loggers import PrefectLogAdapter

    logger = logging.getLogger("fedcme.progress")
    if not any(isinstance(handler, APILogHandler) for handler in logger.handlers):
        logger.addHandler(APILogHandler())
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return PrefectLogAdapter(logger, extra=get_run_logger().extra)


def run_tags(config: ExperimentConfig, experiment: str, commit: str, prefect_flow_run_id: str | None = None,
             label: str | None = None, grid: str | None = None, parent_run_id: str | None = None,
             temporary_prefect: bool = False) -> dict[str, str]:
    """The MLflow run's tags: what produced it (MLflow's own source tags, so the UI's "Source" shows
    it), the dataset and the algorithm, what finds it (flows.tracking.names.identity_tags), its Prefect
    flow run (``prefect_flow_run``: a link where Prefect's UI URL is known, else the id) and, in a
    grid, its grid run's parent (MLflow's ``mlflow.parentRunId``: flows.tracking.grid). `commit` is the one the
    flow run's version names, so both views trace the run to one commit; `temporary_prefect`: the flow
    run's server stops with the command (the link then names the UI that outlives it)."""
    tags = {"git_commit": commit, "dataset": config.data.dataset, "algorithm": config.algorithm.name,
            "mlflow.source.type": "JOB", "mlflow.source.name": "fedcme-train (flows/orchestration/train.py)",
            "mlflow.source.git.commit": commit, **identity_tags(config, experiment, label, grid)}
    if parent_run_id is not None:
        tags["mlflow.parentRunId"] = parent_run_id
    if prefect_flow_run_id is not None:
        tags["prefect_flow_run_id"] = prefect_flow_run_id
        tags["prefect_flow_run"] = (prefect_flow_run_url(prefect_flow_run_id, temporary=temporary_prefect)
                                    or prefect_flow_run_id)
    return tags
