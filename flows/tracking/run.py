"""MLflow tracking of a training run (the store is ``flows.tracking.store``'s, the model
``flows.tracking.models``'s and a grid's parent run ``flows.tracking.grid``'s).

One MLflow run per experiment, all in one MLflow experiment (default ``fedcme``) so the UI compares
them (its id kept in the run directory, so a resumed experiment logs into the same run), the
flattened config as params, tags for the git commit, the partition hash and the dataset; each
round's metrics in one ``log_batch`` call, with the round's number as the console counts it (1 for
the first) as the step; each round's matching pairs, evaluation vectors and client failures as a JSON
artifact ``matching/round-0001.json`` (the same number; none for a round with none of them: FedAvg's);
the final global model (``flows.tracking.models``). The run directory's history is the source of truth:
:meth:`RunTracker.sync` logs exactly the rounds MLflow lacks, so a crash between a round's commit
and its logging leaves no step missing or duplicated.

Opening the store is ``flows.tracking.store``'s (an unreachable server reported before training,
a fresh sqlite store's schema created by one command at a time); a call that meets a busy sqlite
store is retried with a bound (``flows.common.shared_stores.retry_busy``; a training run's calls are made
by its background writer, ``flows.tracking.writer``, which waits a busy store out while the rounds go
on). A tracking failure mid-run never stops training: the tracker warns once (one line, with the
complete ``fedcme sync`` command, ``flows.tracking.store.sync_command``) and stops logging, the
results stay in the run directory, and ``fedcme sync`` logs them later.

The views (README, "MLflow"): per-round metrics grouped by prefix (``eval/test_accuracy``,
``train/loss``, ``time/...``, ``clients/...``: :meth:`RoundRecord.mlflow_metrics`); at the run's end
``final_accuracy`` (mean of the last 5 rounds, ``fedcme_core.results.metrics.summarize``) and
``best_accuracy``, rounded (``flows.tracking.views.rounded``) at step 0, so MLflow's chart view draws
one bar per run (an extended run's later value at step 0 is the run's), the accuracy curve
``figures/accuracy.png`` titled by the run's name, MLflow's system metrics (``system/...``, on unless
``tracking.system_metrics: false``) and, on request, a registry version of the final model.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunStatus, RunTag
from mlflow.tracking import MlflowClient

from fedcme_core.common.atomic import atomic_write_bytes
from fedcme_core.results.records import RoundRecord, algorithm_section

from flows.common.errors import TrackingError
from flows.tracking.gpu_metrics import gpu_metrics_problem
from flows.tracking.models import ModelLogging
from flows.common.shared_stores import is_busy, retry_busy
from flows.tracking.store import experiment_named, first_line, reachable_client, reusable_run, sync_command

METRIC_NAMES = RoundRecord.mlflow_metrics()  # {record key: MLflow name}
ROUND_METRICS = tuple(METRIC_NAMES.values())
STEP_METRIC = METRIC_NAMES["test_accuracy"]  # its steps are the rounds the run holds
SUMMARY_METRICS = ("final_accuracy", "best_accuracy")  # logged once per run end, at SUMMARY_STEP
SUMMARY_STEP = 0  # one point per run: MLflow's chart view draws a bar per run, not a dot at step T
SUMMARY_ROUNDS_TAG = "fedcme.summary_rounds"  # the rounds the logged summary covers
MAX_PARAMS_PER_BATCH = 100


class RunTracker(ModelLogging):
    """The MLflow run of one experiment's run directory."""

    def __init__(self, client: MlflowClient, uri: str, run_id: str, run_dir: Path) -> None:
        self.client = client
        self.uri = uri
        self.run_id = run_id
        self.run_dir = run_dir
        self.failure: str | None = None  # set by the first failed call; later calls are skipped
        self._failing = threading.Lock()  # the run's writer thread and the flow may both fail it
        self.busy = retry_busy  # how a call meets a busy store (a run's writer waits longer, flows.tracking.writer)
        self._logged: set[int] | None = None
        self._monitor = None  # MLflow's system metrics monitor, while it samples

    @classmethod
    def open(
        cls,
        uri: str,
        mlflow_experiment: str,
        run_name: str,
        run_dir: Path,
        params: Mapping[str, Any],
        tags: Mapping[str, str],
        reopen: bool = True,
    ) -> RunTracker:
        """Check the store answers (before any training), then create or reopen the run `run_name`
        (with `reopen`, an existing run is set RUNNING again; ``fedcme sync`` leaves its status be)."""
        try:
            client = reachable_client(uri)
            experiment_id = retry_busy(lambda: experiment_named(client, mlflow_experiment, uri))
            record_file = run_dir / "mlflow.json"
            run_id = reusable_run(client, record_file, uri)
            if run_id is None:
                run_id = retry_busy(lambda: client.create_run(experiment_id, run_name=run_name, tags=dict(tags))).info.run_id
                items = [Param(key, json.dumps(value) if not isinstance(value, str) else value)
                         for key, value in params.items()]
                for start in range(0, len(items), MAX_PARAMS_PER_BATCH):
                    retry_busy(lambda: client.log_batch(run_id, params=items[start : start + MAX_PARAMS_PER_BATCH]))
                record = {"tracking_uri": uri, "experiment_id": experiment_id, "run_id": run_id}
                atomic_write_bytes(record_file, (json.dumps(record, indent=2) + "\n").encode("utf-8"))
            elif reopen:
                retry_busy(lambda: client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING)))
        except TrackingError:
            raise
        except Exception as error:  # mlflow raises MlflowException, OSError, requests errors...
            raise TrackingError(f"MLflow tracking store {uri} is not usable: {first_line(error)}") from None
        return cls(client, uri, run_id, run_dir)

    def _guarded(self, what: str, action):
        """Run a tracking call; the first failure is reported once and turns tracking off for the run."""
        if self.failure is not None:
            return None
        try:
            return self.busy(action)
        except Exception as error:  # mlflow raises MlflowException, OSError, requests errors...
            # A busy store's message may open with SQLAlchemy's autoflush note: name the cause itself.
            reason = "database is locked (the store stayed busy)" if is_busy(error) else first_line(error)
            self.fail(f"{what}: {reason}")
            return None

    def fail(self, failure: str) -> None:
        """Turn tracking off for the run, saying once (one line) why and the command that logs the rest."""
        with self._failing:
            if self.failure is not None:
                return
            self.failure = failure
        print(f"fedcme: warning: MLflow tracking failed ({failure}); training goes on and its results are kept in "
              f"{self.run_dir}; log them later with `{sync_command(self.run_dir, self.uri)}`",
              file=sys.stderr, flush=True)

    def logged_rounds(self) -> set[int]:
        """The steps the MLflow run holds under the grouped names (a run begun under the old flat
        names gets its every round under the grouped ones when resumed or synced)."""
        if self._logged is None:
            self._logged = {metric.step for metric in self.client.get_metric_history(self.run_id, STEP_METRIC)}
        return self._logged

    @staticmethod
    def step(record: Mapping[str, Any]) -> int:
        """The MLflow step of a round: its number as the console counts it (1 for the first)."""
        return int(record["round"]) + 1

    def sync(self, history: Iterable[Mapping[str, Any]]) -> int:
        """Log every round of `history` that the MLflow run lacks; returns how many were logged."""
        def unlogged() -> list[Mapping[str, Any]]:
            logged = self.logged_rounds()  # first: it tells the run's numbering
            return [record for record in history if self.step(record) not in logged]

        missing = self._guarded("reading the logged rounds", unlogged)
        for record in missing or []:
            self.log_round(record)
        return len(missing or [])

    def log_round(self, record: Mapping[str, Any]) -> None:
        """Log one round (metrics in one batch, its matching and failures as JSON where it has any),
        once per step; the step is the round's number as the console counts it (1 for the first)."""
        if self._guarded("reading the logged rounds", self.logged_rounds) is None:
            return
        step = self.step(record)
        if step in self.logged_rounds():
            return
        timestamp = int(time.time() * 1000)
        metrics = [Metric(name, value, timestamp, step) for name, value in RoundRecord.mlflow_values(record).items()]
        round_file = {
            "round": step,
            "selected": record.get("selected", []),
            "pairs": algorithm_section(record).get("pairs", []),
            "evaluation_vectors": algorithm_section(record).get("evaluation_vectors", {}),
            "failures": record.get("failures", {}),
        }

        has_file = any(round_file[key] for key in ("pairs", "evaluation_vectors", "failures"))

        def log() -> bool:
            self.client.log_batch(self.run_id, metrics=metrics)
            if has_file:
                self.client.log_dict(self.run_id, round_file, f"matching/round-{step:04d}.json")
            return True

        if self._guarded(f"logging round {step}", log):
            self.logged_rounds().add(step)

    def log_dataset(self, name: str, digest: str, source: str, context: str = "train") -> None:
        """The run's dataset and partition as an MLflow dataset input (the UI's "Dataset" column)."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        dataset = Dataset(name=name, digest=digest[:36], source_type="local", source=json.dumps({"uri": source}))
        tags = [InputTag("mlflow.data.context", context), InputTag("fedcme.partition_sha256", digest)]
        self._guarded("logging the dataset", lambda: self.client.log_inputs(
            self.run_id, datasets=[DatasetInput(dataset=dataset, tags=tags)]))

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self._guarded(
            "setting tags",
            lambda: self.client.log_batch(self.run_id, tags=[RunTag(key, str(value)) for key, value in tags.items()]),
        )

    def log_summary(self, history: list[Mapping[str, Any]]) -> dict[str, Any] | None:
        """At the run's end: ``final_accuracy`` and ``best_accuracy`` (fractions, rounded) at step 0,
        timestamped after any earlier summary (an extended run's new value is the latest), the rounds
        they cover as the tag ``fedcme.summary_rounds``, and the accuracy curve ``figures/accuracy.png``
        titled by the run's name; returns the summary's figures."""
        from flows.tracking.views import accuracy_figure, rounded, run_figures

        figures = run_figures(history)

        def log() -> dict[str, Any]:
            earlier = self.client.get_metric_history(self.run_id, SUMMARY_METRICS[0])
            timestamp = max([int(time.time() * 1000), *(metric.timestamp + 1 for metric in earlier)])
            metrics = [Metric(name, rounded(figures[name]), timestamp, SUMMARY_STEP) for name in SUMMARY_METRICS]
            self.client.log_batch(self.run_id, metrics=metrics,
                                  tags=[RunTag(SUMMARY_ROUNDS_TAG, str(figures["rounds"]))])
            figure = accuracy_figure(history, STEP_METRIC, self.client.get_run(self.run_id).info.run_name)
            try:
                self.client.log_figure(self.run_id, figure, "figures/accuracy.png")
            finally:
                import matplotlib.pyplot as plt

                plt.close(figure)
            return figures

        return self._guarded("logging the summary", log)

    def summary_logged(self, history: list[Mapping[str, Any]]) -> bool:
        """Whether the run holds the summary of `history`: its latest ``final_accuracy`` at step 0 is
        the history's (rounded) and its ``fedcme.summary_rounds`` tag names the history's rounds."""
        from flows.tracking.views import rounded, run_figures

        figures = run_figures(history)

        def read() -> bool:
            if self.client.get_run(self.run_id).data.tags.get(SUMMARY_ROUNDS_TAG) != str(figures["rounds"]):
                return False
            logged = [metric for metric in self.client.get_metric_history(self.run_id, SUMMARY_METRICS[0])
                      if metric.step == SUMMARY_STEP]
            latest = max(logged, key=lambda metric: metric.timestamp, default=None)
            return latest is not None and latest.value == rounded(figures["final_accuracy"])

        return bool(self._guarded("reading the summary", read))

    def status(self) -> str | None:
        run = self._guarded("reading the run", lambda: self.client.get_run(self.run_id))
        return None if run is None else run.info.status

    def start_system_metrics(self, interval: float) -> None:
        """Sample MLflow's system metrics (``system/cpu_utilization_percentage``...) every `interval`
        seconds on a daemon thread until :meth:`finish`; an extended run continues their steps."""
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # no INFO lines on the console

        def start():
            monitor = SystemMetricsMonitor(self.run_id, sampling_interval=interval, resume_logging=True,
                                           tracking_uri=self.uri)
            monitor.start()
            return monitor

        self._monitor = self._guarded("starting the system metrics", start)
        problem = gpu_metrics_problem()
        if problem is not None:  # a GPU whose metrics MLflow cannot sample: one visible line
            print(problem, flush=True)
            logging.getLogger(__name__).warning(problem)

    def experiment_id(self) -> str | None:
        run = self._guarded("reading the run", lambda: self.client.get_run(self.run_id))
        return None if run is None else run.info.experiment_id

    def finish(self, status: str = "FINISHED") -> None:
        """Stop the system metrics (their last samples flushed), then end the run with `status`."""
        if self._monitor is not None:
            monitor, self._monitor = self._monitor, None
            monitor.finish()
        self._guarded("ending the run", lambda: self.client.set_terminated(self.run_id, status=status))
