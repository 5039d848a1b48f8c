"""The DVC stages of the experiment pipeline (``dvc.yaml``): prepare, partition, tune (:mod:`flows.pipeline.tune`),
train; a train stage of a method the params file's ``tune:`` section names trains with its tuning's choice.

    python -m flows.pipeline.stages prepare   --dataset fmnist
    python -m flows.pipeline.stages partition --dataset fmnist --partition a0.1 --clients 50 --seed 0
    python -m flows.pipeline.stages tune      --method fedprox-mu001
    python -m flows.pipeline.stages train     --method fedcme-mu001 --dataset fmnist --partition a0.1 \\
                                     --clients 50 --per-round 20 --seed 0

``--partition`` takes a partition tag of the grid (:mod:`fedcme_core.config.partition_tags`): ``a0.1``
(the base's Dirichlet-family partition with alpha 0.1) or ``c2`` (2 labels per client).

Every stage reads ``params.yaml`` and validates its sections first (:mod:`fedcme_core.config.params`;
a train stage then its own cell's config, once):
``base`` is the experiment config every run starts from, ``methods.<name>`` an algorithm section
(plus an optional display ``label``, ``group`` and ``setup``, overrides of its cells' config),
``datasets.<name>`` the model of each dataset, ``report.target_accuracy``. The report stage
is ``python -m flows.report.build``. Outputs are written atomically; a train stage whose run
directory holds another config starts that run over, one that holds the same config resumes it.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from fedcme_core.common.atomic import atomic_write_bytes
from fedcme_core.common.lazy import lazy_module
from fedcme_core.config.files import ConfigError
from fedcme_core.config.params import ParamsFile, load_params
from fedcme_core.config.partition_tags import parse_partition_tag, partition_label
from fedcme_core.config.sections import setting_label
from fedcme_core.data.catalog import SourceSettings, preparable_names, read_source, source
from fedcme_core.data.prepared import experiment_train_labels, prepared_facts, prepared_record, save_prepared
from fedcme_core.data.partition import class_counts
from fedcme_core.data.partition_file import make_partition, save_partition
from fedcme_core.data.sources import resolve_mirror
from fedcme_core.results.metrics import history_csv, split_summary, summarize, with_content_hash

from flows.pipeline import tune as tuning
from flows.tracking.names import experiment_name, partition_name

# Only the train stage needs torch and the round loop: prepare and partition write numpy arrays and
# JSON and start without them (2 s of torch's import each).
checkpoints = lazy_module("fedcme_core.common.checkpoints")
matching = lazy_module("fedcme_core.server.matching")
rounds = lazy_module("fedcme_core.rounds")
models = lazy_module("fedcme_core.client.models")

PARAMS = "params.yaml"


def prepared_dir(dataset: str) -> Path:
    return Path("data/prepared") / dataset


def write_json(path: Path, value: Any) -> None:
    atomic_write_bytes(path, (json.dumps(value, indent=2, sort_keys=True) + "\n").encode("utf-8"))


# ----------------------------------------------------------------------------- prepare
def prepare(arguments: argparse.Namespace, params: ParamsFile) -> None:
    """dataset -> checked arrays under data/prepared/<dataset>: an official dataset's verified files (from
    the mirror or a download), or a researcher's own data at `datasets.<dataset>.path` (npz,
    imagefolder), whose classes, input shape and channel statistics are derived from its training set
    and recorded in meta.json with the sha256 of what was read. Bad data is one line, and nothing is
    written."""
    data, entry = params.base.data, params.datasets.get(arguments.dataset)
    path = entry.path if entry is not None else None
    if path is None and source(arguments.dataset).needs_path:
        raise ConfigError(f"{arguments.params}: datasets.{arguments.dataset}.path: missing; the prepare stage reads "
                          f"the {arguments.dataset} data from it")
    settings = SourceSettings(Path(data.data_dir), resolve_mirror(data.mirror), Path(path) if path else None)
    read = read_source(arguments.dataset, settings, with_origin=True)
    meta = save_prepared(arguments.dataset, read.arrays, prepared_dir(arguments.dataset), prepared_record(read))
    shapes = {key: record["shape"] for key, record in meta["arrays"].items()}
    derived = (f"; derived {read.facts.num_classes} classes, input shape {read.facts.input_shape}"
               if read.derived else "")
    print(f"prepared {arguments.dataset}: {shapes}{derived}")


# --------------------------------------------------------------------------- partition
def heatmap(counts: np.ndarray, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, max(2.5, 0.12 * counts.shape[0] + 1)))
    image = axes.imshow(counts, aspect="auto", cmap="viridis", interpolation="nearest")
    axes.set_xlabel("class")
    axes.set_ylabel("client")
    axes.set_title(title)
    axes.set_xticks(range(counts.shape[1]))
    figure.colorbar(image, ax=axes, label="samples")
    figure.tight_layout()
    temporary = path.with_name(f".{path.name}.tmp.png")
    figure.savefig(temporary, dpi=100, metadata={"Software": None})
    plt.close(figure)
    temporary.replace(path)


def partition(arguments: argparse.Namespace, params: ParamsFile) -> None:
    """(dataset, partition tag, K, seed) -> partition.npz, class_counts.json, heatmap.png.

    The tag picks the partition (`base.partition` with its overrides, :meth:`ParamsFile.partition_config`).
    With `data.train_subset`, the clients share the same seeded subset the training run loads.
    """
    labels = experiment_train_labels(prepared_dir(arguments.dataset), arguments.dataset, params.base.data.train_subset,
                                     arguments.seed)
    result = make_partition(labels, params.partition_config(arguments.partition), arguments.clients, arguments.seed)
    out = Path("data/partitions") / partition_name(arguments.dataset, arguments.partition, arguments.clients,
                                                   arguments.seed)
    out.mkdir(parents=True, exist_ok=True)
    save_partition(result, out / "partition.npz")
    counts = class_counts(labels, result.clients, int(labels.max()) + 1)
    write_json(out / "class_counts.json", {
        "content_hash": result.content_hash,
        "params": result.params,
        "sizes": [int(size) for size in result.sizes],
        "class_counts": counts.tolist(),
    })
    heatmap(counts, out / "heatmap.png",
            f"{arguments.dataset} {partition_label(arguments.partition)} K={arguments.clients}")
    print(f"partition {out.name}: sizes {int(result.sizes.min())}..{int(result.sizes.max())}, hash {result.content_hash[:12]}")


# ------------------------------------------------------------------------------- train
def train(arguments: argparse.Namespace, params: ParamsFile) -> None:
    """Run the Prefect training flow for one grid cell; write metrics/<exp>.json|.csv, metrics/about/<exp>.json,
    metrics/matching/<exp>.json and models/<exp>.pt.

    The cell's run directory is held first (:func:`fedcme_core.common.run_lock.hold_run`, no torch), so a
    second stage or command on it is refused in its first second, and held until its final state is
    read. With no Prefect API configured, the stage starts its temporary Prefect server next (as
    `fedcme train` does), and that server dies with the stage.

    The run nests under its grid run's parent MLflow run (:mod:`flows.tracking.grid`), found or
    created here while the Prefect server starts; a stage that fails marks the parent FAILED."""
    from fedcme_core.common.run_lock import experiment_run_dir, hold_run

    from flows.orchestration.prefect_server import run_against_prefect

    def action(ready) -> None:
        from flows.tracking.grid import end_grid_parent, open_grid_parent
        from flows.orchestration.train import run_training

        parent = open_grid_parent(params, arguments.params)
        try:
            train_cell(arguments, params, functools.partial(run_training, ready=ready, mlflow_parent_run_id=parent))
        except KeyboardInterrupt:
            end_grid_parent(parent, "KILLED")
            raise
        except BaseException:
            end_grid_parent(parent, "FAILED")
            raise

    experiment = experiment_name(arguments.method, arguments.dataset, arguments.partition, arguments.clients,
                                 arguments.per_round, arguments.seed)
    with hold_run(experiment_run_dir(arguments.runs_dir, experiment), tidy=True):
        run_against_prefect(action, "this stage")


def train_cell(arguments: argparse.Namespace, params: ParamsFile, run_training) -> None:
    """The cell's run (its run directory held by the caller: a run of a changed config is removed and
    started over), then its metrics, matching similarity and final model written from the run's summary
    and its final state."""
    cell = (arguments.method, arguments.dataset, arguments.partition, arguments.clients, arguments.per_round,
            arguments.seed)
    experiment = experiment_name(*cell)
    config = params.cell_config(*cell, prepared_dir=str(prepared_dir(arguments.dataset)), source=arguments.params)
    config = tuning.apply_choice(config, tuning.read_choice(params, arguments.method), source=arguments.params)
    run_dir = Path(arguments.runs_dir) / experiment
    partition_file = Path("data/partitions") / partition_name(
        arguments.dataset, arguments.partition, arguments.clients, arguments.seed
    ) / "partition.npz"
    if not rounds.run_directory_matches(config, run_dir):
        print(f"{experiment}: the config changed; starting this run over")
        shutil.rmtree(run_dir)
    summary = run_training(config, experiment, runs_dir=arguments.runs_dir, partition_file=str(partition_file),
                           method_label=params.label(arguments.method), grid=params.report.name)
    final_state = rounds.load_server_state(run_dir, rounds.completed_rounds(run_dir))
    history = final_state["history"][: config.federation.rounds]
    identity = {
        "experiment": experiment,
        "method": params.label(arguments.method),
        "setting": setting_label(arguments.dataset, arguments.partition, arguments.clients, arguments.per_round),
        "group": params.group(arguments.method),
        "seed": arguments.seed,
    }
    summary = {
        **summarize(history, target_accuracy=params.report.target_accuracy),
        **identity,
        "method_name": arguments.method,
        "dataset": arguments.dataset,
        "partition": arguments.partition,
        "alpha": parse_partition_tag(arguments.partition).alpha,  # null for a c<k> tag
        "num_clients": arguments.clients,
        "clients_per_round": arguments.per_round,
        "local_epochs": config.training.local_epochs,
        # What it trained on: classes, input shape, channel statistics (derived from a researcher's data).
        "dataset_facts": prepared_facts(prepared_dir(arguments.dataset)),
        # What computed it, for every table made from it: layout and precision, device, machine.
        "compute": summary["compute"]["name"],
        "device": str(models.resolve_device(config.device)),
        "machine": summary["compute"]["machine"],
    }
    counts = json.loads((partition_file.parent / "class_counts.json").read_text(encoding="utf-8"))["class_counts"]
    similarity = {**identity, "class_counts": counts, "rounds": matching.matching_similarity(history)}
    results, about = split_summary(with_content_hash(summary))
    for folder in ("metrics/matching", "metrics/about"):
        Path(folder).mkdir(parents=True, exist_ok=True)
    write_json(Path("metrics/about") / f"{experiment}.json", about)
    write_json(Path("metrics") / f"{experiment}.json", results)
    atomic_write_bytes(Path("metrics") / f"{experiment}.csv", history_csv(history).encode("utf-8"))
    write_json(Path("metrics/matching") / f"{experiment}.json", similarity)
    checkpoints.save_checkpoint({"model": final_state["model"], "experiment": experiment}, Path("models") / f"{experiment}.pt")


def partition_tag(text: str) -> str:
    """argparse type of --partition: a valid tag, else argparse's one-line error saying why."""
    try:
        parse_partition_tag(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m flows.pipeline.stages", description="DVC stages of the fedcme pipeline")
    parser.add_argument("--params", default=PARAMS)
    stages = parser.add_subparsers(dest="stage", required=True)
    prepare_parser = stages.add_parser("prepare")
    prepare_parser.add_argument("--dataset", required=True, choices=preparable_names())
    prepare_parser.set_defaults(handler=prepare)
    partition_parser = stages.add_parser("partition")
    train_parser = stages.add_parser("train")
    for stage_parser in (partition_parser, train_parser):
        stage_parser.add_argument("--dataset", required=True, choices=preparable_names())
        stage_parser.add_argument("--partition", type=partition_tag, required=True,
                                  help="a partition tag: a<alpha> (a0.1) or c<k> (c2)")
        stage_parser.add_argument("--clients", type=int, required=True)
        stage_parser.add_argument("--seed", type=int, required=True)
    partition_parser.set_defaults(handler=partition)
    train_parser.add_argument("--method", required=True)
    train_parser.add_argument("--per-round", type=int, required=True)
    train_parser.add_argument("--runs-dir", default="runs")
    train_parser.set_defaults(handler=train)
    tune_parser = stages.add_parser("tune")  # flows/pipeline/tune.py
    tune_parser.add_argument("--method", required=True)
    tune_parser.add_argument("--runs-dir", default="runs")
    tune_parser.set_defaults(handler=tuning.stage)
    return parser


def main(argv: list[str] | None = None) -> int:
    from flows.common.command import quiet_environment, report_errors

    arguments = build_parser().parse_args(argv)
    quiet_environment()
    # The params file's sections are validated before any stage reads or writes anything; the train
    # stage validates its own cell's config (once) and no other (`fedcme check` validates every cell).
    return report_errors(lambda: arguments.handler(arguments, load_params(arguments.params, cells=False)) or 0)


if __name__ == "__main__":
    from flows.common.command import exit_promptly

    exit_promptly(main())
