"""How a training run is named where a researcher compares runs: the MLflow run's name and tags,
the Prefect flow run's tags, and the MLflow experiment it goes to (no mlflow or prefect here).

    experiment fmnist-a1.0-k10m10-fedcme-mu001-s0           (a grid's run directory, metrics file, tag)
    run name   s0 FedCME(0.01) · fmnist α=1.0 K10 M10      (seed, method label, setting: the seed shows
                                                        however long the label, the setting is cut first)
    tags       method, method_label, seed, setting, grid ("none" outside a DVC grid), experiment
    model      fmnist-a1_0-k10m10-fedcme-mu001-s0         (the experiment, as MLflow's model names allow)
    flow run   commit:<12 hex>, method:<label>, algorithm:<name>, seed:<n>, grid:<name|none>
"""

from __future__ import annotations

from fedcme_core.config.schema import ExperimentConfig

DEFAULT_MLFLOW_EXPERIMENT = "fedcme"  # the grids' experiment (and a plain `fedcme train` on real data)
SMOKE_MLFLOW_EXPERIMENT = "fedcme-smoke"  # runs on synthetic data (configs/smoke.yaml, tests, benches)
SCHEDULED_MLFLOW_EXPERIMENT = "fedcme-scheduled"  # the runs of a scheduled deployment (`fedcme serve --cron`)
NO_GRID = "none"
COMMIT_TAG_LENGTH = 12  # hex digits of the commit in a flow run's `commit:` tag (its version holds all 40)
MODEL_NAME_REFUSED = "/:.%\"'"  # characters MLflow refuses in a logged model's name


def partition_name(dataset: str, partition: str, clients: int, seed: int) -> str:
    """fmnist-a1.0-k10-s0, cifar10-c2-k10-s0: a partition folder's name."""
    return f"{dataset}-{partition}-k{clients}-s{seed}"


def setting_name(dataset: str, partition: str, clients: int, per_round: int) -> str:
    """fmnist-a1.0-k10m10: a grid setting as file names spell it."""
    return f"{dataset}-{partition}-k{clients}m{per_round}"


def experiment_name(method: str, dataset: str, partition: str, clients: int, per_round: int, seed: int) -> str:
    """fmnist-a1.0-k10m10-fedcme-mu001-s0: a grid cell's run directory, metrics file and `experiment` tag."""
    return f"{setting_name(dataset, partition, clients, per_round)}-{method}-s{seed}"


def method_label(config: ExperimentConfig) -> str:
    """`FedCME(0.01)`, `FedProx(0.001)`, `FedRS(0.5)`, `FedAvg`: the algorithm and its main hyper-parameter
    (its config class's display name and label parameter)."""
    return config.algorithm.label()


def setting(config: ExperimentConfig) -> str:
    """`fmnist α=1.0 K10 M10`: the dataset, the partition and the federation's size."""
    partition = config.partition
    split = {"iid": "iid", "labels_per_client": f"#C={partition.labels_per_client}",
             "lognormal_dirichlet": f"lognormal α={partition.alpha}",
             "client_dirichlet": f"client-Dir α={partition.alpha}"}.get(partition.method, f"α={partition.alpha}")
    return (f"{config.data.dataset} {split} K{config.federation.num_clients} "
            f"M{config.federation.clients_per_round}")


def run_name(config: ExperimentConfig, label: str | None = None) -> str:
    """The MLflow run's name: `s0 FedCME(0.01) · fmnist α=1.0 K10 M10` (label: the grid's, else derived).
    The seed first and the setting last, so that a column that cuts a long label still shows the seed;
    unique per experiment of a grid (its method labels and settings are)."""
    return f"s{config.seed} {label or method_label(config)} · {setting(config)}"


def model_name(experiment: str) -> str:
    """The logged model's name: the experiment, each character MLflow refuses in a model's name
    (``/ : . % " '``) as `_`: `fmnist-a1.0-k10m10-fedcme-mu001-s0` -> `fmnist-a1_0-k10m10-fedcme-mu001-s0`."""
    return "".join("_" if character in MODEL_NAME_REFUSED else character for character in experiment)


def identity_tags(config: ExperimentConfig, experiment: str, label: str | None = None,
                  grid: str | None = None) -> dict[str, str]:
    """The tags that find a run: method, method_label, seed, setting, grid and experiment."""
    return {"method": config.algorithm.name, "method_label": label or method_label(config),
            "seed": str(config.seed), "setting": setting(config), "grid": grid or NO_GRID, "experiment": experiment}


def flow_run_tags(config: ExperimentConfig, commit: str, grid: str | None = None,
                  label: str | None = None) -> list[str]:
    """The Prefect flow run's tags: `commit:<first 12 hex digits>`, `method:<label>` (the grid's label,
    else derived: it tells a grid's FedCME variants apart), `algorithm:<name>`, `seed:<n>`, `grid:<name|none>`."""
    return [f"commit:{commit[:COMMIT_TAG_LENGTH]}", f"method:{label or method_label(config)}",
            f"algorithm:{config.algorithm.name}", f"seed:{config.seed}", f"grid:{grid or NO_GRID}"]


def mlflow_experiment_for(config: ExperimentConfig, chosen: str | None = None, scheduled: bool = False) -> str:
    """The MLflow experiment of a run: `chosen` (--mlflow-experiment), else `tracking.mlflow_experiment`,
    else `fedcme-scheduled` for a scheduled run, `fedcme-smoke` for synthetic data, else `fedcme`."""
    if chosen or config.tracking.mlflow_experiment:
        return chosen or config.tracking.mlflow_experiment
    if scheduled:
        return SCHEDULED_MLFLOW_EXPERIMENT
    return SMOKE_MLFLOW_EXPERIMENT if config.data.dataset == "synthetic" else DEFAULT_MLFLOW_EXPERIMENT
