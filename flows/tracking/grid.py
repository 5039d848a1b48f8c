"""The grid's parent MLflow run: one per grid run, its experiments' runs nested under it as children.

A grid runs through ``dvc repro``, ``python -m flows.pipeline.repro`` (``make run``) or ``dvc exp run``;
the last two start the stages with no process of ours around them, so the stages share the parent
between them, found by its tags in the grid's MLflow experiment (``flows.tracking.names.mlflow_experiment_for``):

- ``run_kind=grid``, ``grid`` (``report.name``) and ``grid_key``: a hash of the git commit and the
  validated params file minus its ``report`` section (base, methods, datasets, grid, ablation: what
  decides every experiment's config and the grid's cells, :func:`grid_key`). A grid re-run at the
  same commit with the same params (``dvc repro --force``) finds its parent again; another commit
  or another params file (``dvc exp run -S ...``, a grid extended by seeds) is another grid run,
  whose report adopts the experiments it reuses. Also tagged ``commit``, ``params_file`` and
  ``params_sha256`` (the file's bytes).
- Each train stage (:func:`open_grid_parent`) finds or creates the parent under a file lock (beside
  a sqlite store's database, else one per store URI in the temporary folder: parallel stages never
  create two) and marks it RUNNING; its own run is created with MLflow's ``mlflow.parentRunId`` tag,
  so MLflow's UI nests it while the grid runs. A stage that fails marks the parent FAILED
  (:func:`end_grid_parent`); a later one that runs marks it RUNNING again.
- The report stage (``python -m flows.report.build ... --mlflow-parent``, :func:`close_grid_parent`)
  finds or creates the same parent, logs the report (``reports/results.md``, ``results.csv``,
  ``figures/*.png``, ``summary/*.json``) as its artifacts, the per-method summary
  (:func:`parent_metrics`) as one table artifact (``reports/methods.json``, MLflow's table form:
  :func:`method_table`) and one tag per method (``summary/<method>``, :func:`method_tag`), with the
  number of its experiments as the tag ``experiments``, makes the grid's current runs
  (``runs/<exp>/mlflow.json``) exactly its children (a run restored from DVC's cache, or one whose
  stage found no parent, is adopted; a child that is no longer the grid's is let go), and marks it
  FINISHED. The parent logs no metric: MLflow's chart view, which draws a chart per metric of the
  runs shown, opens on the children's (their ``final_accuracy``, one bar per run), not on one-bar
  charts of the parent's.

A tracking failure here never stops a stage: one warning line, and the experiment's own run and
the report are written as before.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow.entities import RunStatus, RunTag
from mlflow.tracking import MlflowClient

from fedcme_core.common.locks import FileLock
from fedcme_core.config.params import ParamsFile

from flows.common.errors import TrackingError
from flows.tracking.names import experiment_name, mlflow_experiment_for
from flows.common.shared_stores import retry_busy, sqlite_file
from flows.tracking.store import experiment_named, first_line, open_client, reachable_client, resolve_tracking_uri
from flows.tracking.views import git_commit, rounded

PARENT_TAG = "mlflow.parentRunId"  # MLflow's own: the UI nests a run under the run it names
LOCK_TIMEOUT = 60.0  # seconds a stage waits for another's find-or-create of the parent
METHOD_TABLE = "reports/methods.json"  # the parent's per-method summary, MLflow's table artifact
METHOD_TAG = "summary/"  # + the method's name: its summary in one line, a tag of the parent


@dataclass(frozen=True)
class GridRun:
    """What identifies a grid run's parent: the grid's name, its key, and where they come from."""

    grid: str
    key: str
    commit: str
    params_file: str
    params_sha256: str
    mlflow_experiment: str

    def tags(self) -> dict[str, str]:
        return {"run_kind": "grid", "grid": self.grid, "grid_key": self.key, "commit": self.commit,
                "params_file": self.params_file, "params_sha256": self.params_sha256,
                "mlflow.source.type": "JOB", "mlflow.source.name": "fedcme grid (dvc.yaml)",
                "mlflow.source.git.commit": self.commit,
                "mlflow.note.content": (f"The `{self.grid}` grid at commit {self.commit[:12]} ({self.params_file}): "
                                        "its experiments are the child runs; the report (results table, figures, "
                                        "per-method summary) is under artifacts/reports.")}

    def run_name(self) -> str:
        return f"grid {self.grid} @ {self.commit[:7]} ({self.key[:8]})"

    def search_filter(self) -> str:
        return f"tags.run_kind = 'grid' and tags.grid = '{self.grid}' and tags.grid_key = '{self.key}'"


def grid_key(params: ParamsFile, commit: str) -> str:
    """sha256 of the commit and the params file as validated, minus ``report`` (its published figures
    and claims change the report, not the experiments)."""
    grid = params.model_dump(mode="json", exclude={"report"})
    text = json.dumps({"commit": commit, "params": grid}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def grid_run(params: ParamsFile, params_file: str | Path) -> GridRun:
    """The grid run of `params` (read from `params_file`) at the checkout's commit."""
    commit = git_commit()
    first = next(iter(params.all_cells()))
    try:
        digest = hashlib.sha256(Path(params_file).read_bytes()).hexdigest()
    except OSError:
        digest = "unknown"
    return GridRun(grid=params.report.name, key=grid_key(params, commit), commit=commit, params_file=str(params_file),
                   params_sha256=digest, mlflow_experiment=mlflow_experiment_for(params.cell_config(*first)))


def parent_lock(uri: str) -> FileLock:
    """The lock of the find-or-create: beside a sqlite store's database, else one per store URI in the
    temporary folder (the commands that share a tracking server on one machine)."""
    database = sqlite_file(uri)
    if database is not None:
        database = database.resolve()
        return FileLock(database.with_name(database.name + ".grid.lock"))
    digest = hashlib.sha256(uri.encode("utf-8")).hexdigest()[:16]
    return FileLock(Path(tempfile.gettempdir()) / f"fedcme-mlflow-grid-{digest}.lock")


def find_or_create_parent(client: MlflowClient, uri: str, run: GridRun, status: str = "RUNNING") -> str:
    """The id of `run`'s parent in its experiment, created if there is none (under :func:`parent_lock`),
    its status set to `status` (the oldest one where an earlier version made several)."""
    lock = parent_lock(uri)
    if not lock.acquire(LOCK_TIMEOUT):
        raise TimeoutError(f"another command has held {lock.path} for over {LOCK_TIMEOUT:.0f} s")
    try:
        experiment_id = retry_busy(lambda: experiment_named(client, run.mlflow_experiment, uri))
        found = retry_busy(lambda: client.search_runs([experiment_id], filter_string=run.search_filter(),
                                                      order_by=["attributes.start_time ASC"], max_results=1))
        if found:
            run_id = found[0].info.run_id
            if found[0].info.status != status:
                retry_busy(lambda: client.update_run(run_id, status=status))
            return run_id
        return retry_busy(lambda: client.create_run(experiment_id, run_name=run.run_name(),
                                                    tags=run.tags())).info.run_id
    finally:
        lock.release()


def warn(what: str, error: BaseException) -> None:
    print(f"warning: MLflow grid parent run: {what} failed ({first_line(error)}); the stage goes on without it",
          file=sys.stderr, flush=True)


def open_grid_parent(params: ParamsFile, params_file: str | Path, tracking_uri: str | None = None) -> str | None:
    """A train stage's parent: found or created, RUNNING; None (one warning line) when tracking fails."""
    uri = resolve_tracking_uri(tracking_uri)
    try:
        return find_or_create_parent(reachable_client(uri), uri, grid_run(params, params_file))
    except TrackingError:
        return None  # the training run's own check says what is wrong with the store, before any training
    except Exception as error:  # noqa: BLE001 - mlflow, OSError, requests...: never a reason to stop training
        warn("opening it", error)
        return None


def end_grid_parent(run_id: str | None, status: str, tracking_uri: str | None = None) -> None:
    """Mark the parent `status` (a stage failed: FAILED, KILLED); one warning line when that fails too."""
    if run_id is None:
        return
    try:
        client = open_client(resolve_tracking_uri(tracking_uri))
        retry_busy(lambda: client.update_run(run_id, status=status))
    except Exception as error:  # noqa: BLE001
        warn(f"marking it {status}", error)


def parent_metrics(summaries: Mapping[str, Mapping[str, Any]],
                   entries: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float | None]]:
    """The parent's per-method summary figures, {method name: figures}, all fractions as MLflow holds
    accuracy: ``final_accuracy`` and ``best_accuracy`` from ``reports/summary/m.json`` (the means over
    the grid's settings and seeds, fractions there too), ``seeds`` (the seeds the method's entries
    hold) and ``final_accuracy_std`` (the sample std over seeds of the method's per-seed mean final
    accuracy; None under two seeds). Logged as the parent's table and tags, never as its metrics."""
    figures: dict[str, dict[str, float | None]] = {}
    for method, summary in summaries.items():
        by_seed: dict[int, list[float]] = {}
        for entry in entries:
            if entry.get("method_name") == method:
                by_seed.setdefault(int(entry["seed"]), []).append(float(entry["final_accuracy"]))
        means = [sum(values) / len(values) for values in by_seed.values()]
        figures[method] = {key: float(summary[key]) if isinstance(summary.get(key), (int, float)) else None
                           for key in ("final_accuracy", "best_accuracy")}
        figures[method]["seeds"] = float(len(by_seed))
        figures[method]["final_accuracy_std"] = statistics.stdev(means) if len(means) >= 2 else None
    return figures


def percent(value: float | None, std: float | None = None) -> str:
    """0.5, 0.01 -> `50.00 ± 1.00`; a missing std leaves it out, a missing value is `—`."""
    if value is None:
        return "—"
    return f"{100 * value:.2f}" + ("" if std is None else f" ± {100 * std:.2f}")


def method_table(figures: Mapping[str, Mapping[str, float | None]],
                 labels: Mapping[str, str]) -> dict[str, list[Any]]:
    """The parent's per-method table, one row per method (columns: method, label, seeds,
    final_accuracy, final_accuracy_std, best_accuracy as rounded fractions, None where missing,
    and ``final (%)``, the mean ± std in percent as the report prints it)."""
    table: dict[str, list[Any]] = {column: [] for column in (
        "method", "label", "seeds", "final_accuracy", "final_accuracy_std", "best_accuracy", "final (%)")}
    for method, row in figures.items():
        table["method"].append(method)
        table["label"].append(labels.get(method, method))
        table["seeds"].append(int(row.get("seeds") or 0))
        for key in ("final_accuracy", "final_accuracy_std", "best_accuracy"):
            table[key].append(None if row.get(key) is None else rounded(row[key]))
        table["final (%)"].append(percent(row.get("final_accuracy"), row.get("final_accuracy_std")))
    return table


def method_tag(label: str, row: Mapping[str, float | None]) -> str:
    """A method's summary as the parent's ``summary/<method>`` tag:
    `FedAvg: final 50.00 ± 1.00 % (2 seeds), best 55.00 %`."""
    seeds = int(row.get("seeds") or 0)
    return (f"{label}: final {percent(row.get('final_accuracy'), row.get('final_accuracy_std'))} % "
            f"({seeds} seed{'' if seeds == 1 else 's'}), best {percent(row.get('best_accuracy'))} %")


def current_runs(params: ParamsFile, runs_dir: Path, uri: str) -> dict[str, str]:
    """{experiment: MLflow run id} of the grid's cells whose run directory records a run in `uri`."""
    runs = {}
    for cell in params.all_cells():
        experiment = experiment_name(*cell)
        try:
            record = json.loads((runs_dir / experiment / "mlflow.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if record.get("tracking_uri") == uri and record.get("run_id"):
            runs[experiment] = record["run_id"]
    return runs


def log_method_table(client: MlflowClient, parent: str, table: Mapping[str, Sequence[Any]]) -> None:
    """`table` as the parent's METHOD_TABLE: through ``log_table`` the first time (MLflow's table
    form, shown as a table by the UI), later in the same form through ``log_dict``, which replaces
    it (``log_table`` appends its rows to the file a re-run of the report stage logged before)."""
    folder = METHOD_TABLE.rsplit("/", 1)[0]
    logged = {item.path for item in retry_busy(lambda: client.list_artifacts(parent, folder))}
    if METHOD_TABLE not in logged:
        retry_busy(lambda: client.log_table(parent, dict(table), METHOD_TABLE))
        return
    columns = list(table)
    rows = [list(row) for row in zip(*(table[column] for column in columns))]
    retry_busy(lambda: client.log_dict(parent, {"columns": columns, "data": rows}, METHOD_TABLE))


def close_grid_parent(params: ParamsFile, params_file: str | Path, *, report_files: Mapping[Path, str],
                      metrics: Mapping[str, Mapping[str, float | None]], runs_dir: Path = Path("runs"),
                      tracking_uri: str | None = None) -> str | None:
    """The report stage's end of the grid run: its parent found or created, the report's files logged
    as artifacts ({file: artifact folder}), `metrics` (the per-method figures, :func:`parent_metrics`)
    as the table ``reports/methods.json`` and ``summary/<method>`` tags (labels from the params' methods),
    the grid's current runs made its children (their count the tag ``experiments``), then FINISHED.
    Logs no metric on the parent. Returns the parent's id; None (one warning line) when tracking fails."""
    uri = resolve_tracking_uri(tracking_uri)
    try:
        client = reachable_client(uri)
        run = grid_run(params, params_file)
        parent = find_or_create_parent(client, uri, run)
        for path, folder in report_files.items():
            retry_busy(lambda: client.log_artifact(parent, str(path), folder))
        children = current_runs(params, runs_dir, uri)
        labels = {method: params.label(method) if method in params.methods else method for method in metrics}
        if metrics:
            log_method_table(client, parent, method_table(metrics, labels))
        tags = [RunTag(f"{METHOD_TAG}{method}", method_tag(labels[method], row)) for method, row in metrics.items()]
        tags.append(RunTag("experiments", str(len(children))))
        retry_busy(lambda: client.log_batch(parent, tags=tags))
        experiment_id = client.get_run(parent).info.experiment_id
        for child in children.values():
            retry_busy(lambda: client.log_batch(child, tags=[RunTag(PARENT_TAG, parent)]))
        earlier = retry_busy(lambda: client.search_runs([experiment_id], f"tags.{PARENT_TAG} = '{parent}'"))
        for stale in [found.info.run_id for found in earlier if found.info.run_id not in children.values()]:
            retry_busy(lambda: client.delete_tag(stale, PARENT_TAG))
        retry_busy(lambda: client.set_terminated(parent, status=RunStatus.to_string(RunStatus.FINISHED)))
        from flows.tracking.views import mlflow_run_url

        print(f"MLflow: the grid's parent run '{run.run_name()}' holds {len(children)} experiment runs: "
              f"{mlflow_run_url(uri, experiment_id, parent)}", flush=True)
        return parent
    except Exception as error:  # noqa: BLE001
        warn("logging the report", error)
        return None
