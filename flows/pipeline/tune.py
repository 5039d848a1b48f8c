"""The DVC `tune` stage: a method's candidates (the grid file's ``tune:`` section) trained on a validation
split, the choice written to ``tuning/<method>.json``, which the method's train stages apply.

    python -m flows.pipeline.stages tune --method fedprox-mu001

Each candidate (:meth:`fedcme_core.config.params.ParamsFile.tune_candidates`) trains on the grid's first
setting for ``tune.rounds`` rounds with seed ``tune.seed``, holding out ``tune.validation_fraction`` of
the training set before partitioning and evaluating on it in place of the test set
(``data.evaluate_on: validation``: its dataset carries no test arrays, :mod:`fedcme_core.data.validation`),
so tuning never reads the test set. The choice is :func:`fedcme_core.results.tuning.choose`'s: the best
mean validation accuracy over the last 5 rounds, a tie going to the candidate given first. A method of
the grid that the section does not name has no tune stage, and its train stages train as written.

In MLflow a tuning is a parent run named ``tune <method>`` (found or created as the grid's parent is,
:mod:`flows.tracking.grid`), with a child run per candidate.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedcme_core.common.atomic import atomic_write_bytes
from fedcme_core.common.lazy import lazy_module
from fedcme_core.config.files import ConfigError, apply_overrides
from fedcme_core.config.params import ParamsFile
from fedcme_core.config.schema import ExperimentConfig, config_from_dict
from fedcme_core.config.sections import setting_label
from fedcme_core.results.tuning import choose

from flows.report.tuning import TUNING_DIR, tuning_file
from flows.tracking.names import experiment_name

rounds = lazy_module("fedcme_core.rounds")


# Trains one candidate's config as the named experiment and returns its history (records by round).
Train = Callable[[ExperimentConfig, str], list[dict[str, Any]]]


def candidate_experiment(params: ParamsFile, method: str, index: int) -> str:
    """tune-fmnist-a1.0-k10m10-fedprox-mu001-s0-c1: candidate `index`'s run directory and experiment."""
    return f"tune-{experiment_name(*params.tune_cell(method))}-c{index}"


def tune_method(params: ParamsFile, method: str, train: Train, prepared_dir: str | None = None,
                source: str = "params") -> dict[str, Any]:
    """Train every candidate of `method` with `train` and choose: the tuning record, JSON-ready:
    ``method``, ``setting``, ``rounds``, ``seed``, ``validation_fraction``, ``candidates`` (each its
    ``values``, ``experiment``, ``score`` and per-round ``validation_accuracy``), ``chosen`` (an index)
    and ``choice`` (the chosen values, dotted config overrides)."""
    tune = params.tune
    candidates = params.tune_candidates(method)
    histories = []
    for index, candidate in enumerate(candidates):
        config = params.tune_config(method, candidate, prepared_dir=prepared_dir, source=source)
        history = train(config, candidate_experiment(params, method, index))
        histories.append(sorted(history, key=lambda record: int(record["round"]))[: tune.rounds])
    chosen, scores = choose(candidates, histories)
    _, dataset, partition, clients, per_round, _ = params.tune_cell(method)
    return {
        "method": method,
        "tuned": True,
        "setting": setting_label(dataset, partition, clients, per_round),
        "rounds": tune.rounds,
        "seed": tune.seed,
        "validation_fraction": tune.validation_fraction,
        "candidates": [{"values": candidate, "experiment": candidate_experiment(params, method, index),
                        "score": score,
                        "validation_accuracy": [float(record["test_accuracy"]) for record in history]}
                       for index, (candidate, score, history) in enumerate(zip(candidates, scores, histories))],
        "chosen": chosen,
        "choice": candidates[chosen],
    }


def in_process(runs_dir: str | Path) -> Train:
    """A :data:`Train` that runs the round loop in this process (no Prefect, no MLflow): a run directory
    holding another config is started over, one holding the same config resumed."""
    def train(config: ExperimentConfig, experiment: str) -> list[dict[str, Any]]:
        run_dir = Path(runs_dir) / experiment
        if not rounds.run_directory_matches(config, run_dir):
            shutil.rmtree(run_dir)
        return list(rounds.run_experiment(config, run_dir))
    return train


def read_choice(params: ParamsFile, method: str, folder: Path = TUNING_DIR) -> dict[str, Any]:
    """The chosen values of a tuned `method` (dotted overrides), {} for a method the params do not tune.
    A missing record, or one made for other candidates, is one ConfigError line naming the file."""
    if params.tune is None or method not in params.tune.methods:
        return {}
    path = tuning_file(method, folder)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConfigError(f"{path}: no tuning record of {method} ({error}); run its tune stage first") from None
    wanted = params.tune_candidates(method)
    if [candidate.get("values") for candidate in record.get("candidates", [])] != wanted:
        raise ConfigError(f"{path}: its candidates are not those of tune.methods.{method}; run its tune stage again")
    return dict(record["choice"])


def apply_choice(config: ExperimentConfig, choice: Mapping[str, Any], source: str = "params") -> ExperimentConfig:
    """`config` with the chosen values set (validated again); `config` itself when there are none."""
    if not choice:
        return config
    values = apply_overrides(config.model_dump(mode="json"), dict(choice))
    return config_from_dict(values, source=f"{source} [tuned]").model_copy(update={"tracking": config.tracking})


def write_record(path: Path, record: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (json.dumps(record, indent=2, sort_keys=True) + "\n").encode("utf-8"))


@dataclass(frozen=True)
class TuneRun:
    """A tuning's MLflow parent: its grid run's identity (:func:`flows.tracking.grid.grid_run`) with the
    method, tagged ``run_kind=tune`` and named ``tune <method>``."""

    grid: Any  # flows.tracking.grid.GridRun
    method: str

    @property
    def mlflow_experiment(self) -> str:
        return self.grid.mlflow_experiment

    def tags(self) -> dict[str, str]:
        return {**self.grid.tags(), "run_kind": "tune", "method": self.method,
                "mlflow.note.content": f"The tuning of {self.method} in the `{self.grid.grid}` grid at commit "
                                       f"{self.grid.commit[:12]}: a child run per candidate, scored on the "
                                       "validation split (never the test set)."}

    def run_name(self) -> str:
        return f"tune {self.method}"

    def search_filter(self) -> str:
        return (f"tags.run_kind = 'tune' and tags.method = '{self.method}' and tags.grid = '{self.grid.grid}' "
                f"and tags.grid_key = '{self.grid.key}'")


def open_tune_parent(params: ParamsFile, params_file: str | Path, method: str) -> str | None:
    """The tuning's parent run, found or created and RUNNING; None (one warning line) when tracking fails."""
    from flows.tracking import grid
    from flows.tracking.store import reachable_client, resolve_tracking_uri

    uri = resolve_tracking_uri(None)
    try:
        return grid.find_or_create_parent(reachable_client(uri), uri, TuneRun(grid.grid_run(params, params_file),
                                                                               method))
    except Exception as error:  # noqa: BLE001 - tracking never stops a stage
        grid.warn("opening the tuning's", error)
        return None


def stage(arguments: argparse.Namespace, params: ParamsFile) -> None:
    """The DVC stage: tuning/<method>.json, the tuning record of a method of the tune section (its
    candidates trained through the Prefect training flow, each an MLflow child of the tuning's parent)."""
    method, path = arguments.method, tuning_file(arguments.method)
    params.tune_cell(method)  # a method the tune section does not name: one line, before anything starts
    from flows.orchestration.prefect_server import run_against_prefect
    from flows.pipeline.stages import prepared_dir

    def action(ready) -> None:
        from flows.orchestration.train import run_training
        from flows.tracking.grid import end_grid_parent

        parent, waited = open_tune_parent(params, arguments.params, method), []

        def train(config: ExperimentConfig, experiment: str) -> list[dict[str, Any]]:
            run_dir = Path(arguments.runs_dir) / experiment
            if not rounds.run_directory_matches(config, run_dir):
                shutil.rmtree(run_dir)
            run_training(config, experiment, ready=None if waited else ready, runs_dir=arguments.runs_dir,
                         mlflow_parent_run_id=parent, method_label=f"{params.label(method)} candidate",
                         grid=params.report.name)
            waited.append(experiment)  # the Prefect server answered: later candidates need not wait
            return rounds.load_server_state(run_dir, rounds.completed_rounds(run_dir))["history"]

        try:
            record = tune_method(params, method, train, prepared_dir=str(prepared_dir(params.tune_cell(method)[1])),
                                 source=arguments.params)
        except BaseException:
            end_grid_parent(parent, "FAILED")
            raise
        end_grid_parent(parent, "FINISHED")
        write_record(path, record)
        print(f"tune {method}: chose {record['choice']} (validation score {record['candidates'][record['chosen']]['score']:.4f})")

    run_against_prefect(action, "this stage")
