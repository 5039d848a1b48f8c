"""Typed, frozen experiment configuration (pydantic v2), loaded from ``params.yaml``.

One config class per algorithm, declared in the algorithm's own module and chosen by
``algorithm.name`` (a discriminated union built from the registry in ``fedcme_core.algorithms``),
so each algorithm owns exactly its hyper-parameters: FedProx its ``mu``, MOON ``mu``/``tau``,
FedRS ``alpha``/``scaling``, FedCME ``mu``/``exchange``/``matching``/``eval_fraction``.
Defaults follow ``SPEC.md`` (MOON's CIFAR-10 local-training settings, the paper's grid).
Every bad value is reported as one line naming the key and the reason (:class:`ConfigError`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_serializer, model_validator

from fedcme_core.algorithms import DEFAULT_ALGORITHM, AlgorithmConfig
from fedcme_core.config.data_sources import DatasetName, ModelName, check_data_model, data_input_shape, data_num_classes
from fedcme_core.common.frozen import Frozen
from fedcme_core.config.files import ConfigError, apply_overrides, read_yaml
from fedcme_core.config.messages import format_validation_error


class SyntheticConfig(Frozen):
    """Class-dependent random patterns, for fast tests (any shape)."""

    num_train: int = Field(2000, ge=10)
    num_test: int = Field(500, ge=10)
    shape: tuple[int, int, int] = (1, 28, 28)
    noise: float = Field(1.0, ge=0)


class DataConfig(Frozen):
    dataset: DatasetName = "fmnist"  # a registered source (fedcme_core/data/catalog): fmnist, cifar10, synthetic, npz, ...
    # The data of a source that reads a researcher's own files (npz: one .npz file; imagefolder: a folder).
    path: str | None = None
    # Local mirror folder (holding fashion-mnist/ and cifar-10/); None: env FEDCME_DATA_MIRROR, else download.
    mirror: str | None = None
    # The project's own data folder, where the mirror's files are decompressed or downloaded.
    data_dir: str = "data/raw"
    # A folder written by the DVC `prepare` stage (verified arrays); when set, it is the source.
    prepared_dir: str | None = None
    # Seeded random subsets of the splits (None: the whole split).
    train_subset: int | None = Field(None, ge=10)
    test_subset: int | None = Field(None, ge=10)
    # Training-batch augmentation (fedcme_core/data/augment.py): crop_flip is NIID-Bench's and MOON's
    # CIFAR-10 transform (reflect-pad 4, random crop, random horizontal flip). None: the dataset's
    # default, crop_flip for cifar10 and none otherwise (SPEC.md, Data).
    augment: Literal["none", "crop_flip"] | None = None
    # Input scaling: "channel" normalises with the dataset's channel mean/std (SPEC.md, Data); "none"
    # keeps the images in [0, 1], as NIID-Bench feeds CIFAR-10 (its get_dataloader has no Normalize).
    normalise: Literal["channel", "none"] = "channel"
    synthetic: SyntheticConfig = SyntheticConfig()
    # A stratified, seeded part of the training set held out before partitioning (no client trains on
    # it; fedcme_core/data/validation.py), and what the run evaluates on: "validation" (a tuning run)
    # replaces the test set with it. Left out of config.json at their defaults (0, test): older runs match.
    validation_fraction: float = Field(0.0, ge=0, lt=1)
    evaluate_on: Literal["test", "validation"] = "test"

    @model_validator(mode="after")
    def _validation_to_evaluate_on(self) -> DataConfig:
        if self.evaluate_on == "validation" and self.validation_fraction == 0:
            raise ValueError("evaluate_on: validation needs a data.validation_fraction above 0")
        return self

    @model_serializer(mode="wrap")
    def _without_default_holdout(self, handler) -> dict[str, Any]:
        values = handler(self)
        for key, default in (("validation_fraction", 0.0), ("evaluate_on", "test")):
            if values.get(key) == default:
                values.pop(key)
        return values


class PartitionConfig(Frozen):
    """Label skew + quantity skew: NIID-Bench label-dir by default (SPEC.md, Data); or
    NIID-Bench's #C=k (`labels_per_client`: each client holds exactly k labels); or Hsu et al.'s
    per-client Dir(alpha * prior) (`client_dirichlet`; fedcme_core/data/partition.py lists them)."""

    method: Literal["dirichlet", "iid", "lognormal_dirichlet", "labels_per_client", "client_dirichlet"] = "dirichlet"
    alpha: float = Field(0.1, gt=0)
    min_size: int = Field(10, ge=1)
    sigma: float = Field(0.3, gt=0)
    # k of NIID-Bench's noniid-#label{k}; read by method labels_per_client only.
    labels_per_client: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _labels_per_client_with_its_method(self) -> PartitionConfig:
        if self.method == "labels_per_client" and self.labels_per_client is None:
            raise ValueError("labels_per_client: missing; method labels_per_client needs k, the labels each client holds")
        if self.method != "labels_per_client" and self.labels_per_client is not None:
            raise ValueError(f"labels_per_client: has no effect with method {self.method}; it is read by method "
                             "labels_per_client only")
        return self


class FederationConfig(Frozen):
    num_clients: int = Field(50, ge=1, description="K")
    clients_per_round: int = Field(20, ge=1, description="M")
    rounds: int = Field(100, ge=1, description="T")
    # A round is aggregated when at least this many selected clients return a usable update;
    # fewer stops the run with an error naming the failures (see README, When things go wrong).
    min_clients: int = Field(1, ge=1)
    # Simulated availability: each selected client drops out of a round with this probability
    # (seeded by seed, round and client); its FedCME counterpart trains on without exchange.
    dropout: float = Field(0.0, ge=0, lt=1)
    # An update whose last local-epoch loss exceeds this is rejected as diverged (None: only
    # non-finite losses, parameters or features are rejected).
    max_update_loss: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _selected_within_clients(self) -> FederationConfig:
        if self.clients_per_round > self.num_clients:
            raise ValueError(
                f"clients_per_round (M={self.clients_per_round}) must be <= num_clients (K={self.num_clients})"
            )
        if self.min_clients > self.clients_per_round:
            raise ValueError(
                f"min_clients ({self.min_clients}) must be <= clients_per_round (M={self.clients_per_round})"
            )
        return self


class TrainingConfig(Frozen):
    """Local SGD of every algorithm (SPEC.md, Local training)."""

    local_epochs: int = Field(10, ge=1, description="E")
    batch_size: int = Field(64, ge=1)
    lr: float = Field(0.01, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(1e-5, ge=0)
    # Memory layout of the images and the model: channels_last (NHWC) or PyTorch's default
    # NCHW, equal within float rounding; "auto" times both on the run's model and batch shape at
    # run start and keeps the faster (fedcme_core/client/compute.py; README, Performance options).
    channels_last: bool | Literal["auto"] = "auto"
    # fp32, or bf16 autocast of the forward pass and the loss (weights, optimizer state and
    # aggregation stay fp32); "auto" lets the calibration pick bf16 where the device computes it
    # natively and it is faster. "auto" by default since bf16 kept fp32's accuracy over 30-round
    # runs (BENCHMARKS.md, "bf16 accuracy"). "tf32" (CUDA only, never chosen by
    # "auto"): fp32 products in TensorFloat-32; fp32 is IEEE fp32 on every device.
    precision: Literal["fp32", "bf16", "tf32", "auto"] = "auto"


class ModelConfig(Frozen):
    name: ModelName = "fmnist_cnn"  # a registered architecture (fedcme_core/client/architectures)
    # The classifier phi: the last linear layer (1, SPEC.md) or the last two (2; "one or two linear
    # layers" in the paper). The feature theta(x) is then the input of the first of them. A model
    # with one linear layer (resnet18_gn) offers 1 only (checked with the dataset, below).
    classifier_layers: Literal[1, 2] = 1
    # The projection head's output size; None: the algorithm's own (BaseAlgorithmConfig.projection_dim:
    # MOON's 256), else no head.
    projection_dim: int | None = Field(None, ge=1)


class RunnerConfig(Frozen):
    """Where the clients of a round train; never changes the results (see README)."""

    kind: Literal["sequential", "threads", "dask"] = "threads"
    # Parallel client trainings; None: one per CPU core (1 for sequential).
    workers: int | None = Field(None, ge=1)
    # torch intra-op threads per client training; None: max(1, cores // workers).
    threads_per_worker: int | None = Field(None, ge=1)
    # An existing Dask scheduler (tcp://host:port); None: a LocalCluster on 127.0.0.1.
    dask_address: str | None = None
    # Keep each round's swap/exchanged/upload checkpoints instead of deleting them at commit.
    keep_round_files: bool = False
    # How often a client's local training that raised is run again before the client counts
    # as dropped from the round (its inputs are files, so a retry starts afresh).
    retries: int = Field(1, ge=0)
    # Prefect tasks of a training phase: "client", one task per client (2 x M local-training
    # tasks a round, each client its own line in the Prefect UI, handed to the workers largest
    # first); "worker", the phase's clients packed by size into one task per worker (2 x workers
    # a round: fewer task runs for the Prefect server to store, for long grids).
    client_tasks: Literal["client", "worker"] = "client"


class TrackingConfig(Frozen):
    """What the MLflow run records beyond the rounds; never changes the results, and is no part of
    a run's identity (left out of config.json, so switching it resumes the same run)."""

    # MLflow's system metrics (CPU, memory, disk, network, GPU: `system/...`), sampled on a thread
    # every `system_metrics_interval` seconds (BENCHMARKS.md, "System metrics": their cost).
    system_metrics: bool = True
    system_metrics_interval: float = Field(10.0, ge=0.5, le=3600)
    # Register the final model in MLflow's model registry under this name, as a new version
    # (`fedcme train --register-model NAME` sets it); None: no registry entry.
    register_model: str | None = Field(None, min_length=1, max_length=256, pattern=r"^[A-Za-z0-9][\w.\- ]*$")
    # The MLflow experiment of the run; None: chosen by the kind of run (flows/tracking/names.py:
    # `fedcme-scheduled` for scheduled runs, `fedcme-smoke` for synthetic data, else `fedcme`).
    mlflow_experiment: str | None = Field(None, min_length=1, max_length=256)


class ExperimentConfig(Frozen):
    seed: int = Field(0, ge=0)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    data: DataConfig = DataConfig()
    partition: PartitionConfig = PartitionConfig()
    federation: FederationConfig = FederationConfig()
    training: TrainingConfig = TrainingConfig()
    model: ModelConfig = ModelConfig()
    algorithm: AlgorithmConfig = DEFAULT_ALGORITHM
    runner: RunnerConfig = RunnerConfig()
    tracking: TrackingConfig = Field(TrackingConfig(), exclude=True)  # not dumped: no part of a run's identity

    @model_validator(mode="after")
    def _cross_field_checks(self) -> ExperimentConfig:
        self.algorithm.check_experiment(self)  # what the algorithm needs of the experiment (FedCME: E >= 2 to swap)
        if self.device == "cpu" and self.training.precision == "tf32":
            raise ValueError("training.precision: tf32 is TensorFloat-32 of CUDA GPUs; with device: cpu use fp32")
        check_data_model(self.data, self.model)  # data.path, input shape, classifier split
        partition = self.partition
        if partition.method == "labels_per_client":
            num_classes = data_num_classes(self.data) or 0  # 0: derived when loaded (then checked by the partition)
            if num_classes and partition.labels_per_client > num_classes:
                raise ValueError(f"partition.labels_per_client: {partition.labels_per_client} exceeds the "
                                 f"{num_classes} classes of {self.data.dataset}")
            if partition.labels_per_client * self.federation.num_clients < num_classes:
                raise ValueError(
                    f"partition.labels_per_client: {self.federation.num_clients} clients x "
                    f"{partition.labels_per_client} labels cannot cover the {num_classes} classes"
                )
        if self.data.dataset == "synthetic" and self.partition.min_size * self.federation.num_clients > self.data.synthetic.num_train:
            raise ValueError(
                f"partition.min_size: federation.num_clients ({self.federation.num_clients}) x partition.min_size "
                f"({self.partition.min_size}) samples exceed data.synthetic.num_train ({self.data.synthetic.num_train})"
            )
        return self

    @property
    def input_shape(self) -> tuple[int, int, int] | None:
        return data_input_shape(self.data)  # None: a file not there yet (fedcme_core/config/data_sources.py)

    @property
    def augmentation(self) -> str:
        """`data.augment`, or the dataset's default when unset."""
        if self.data.augment is not None:
            return self.data.augment
        return "crop_flip" if self.data.dataset == "cifar10" else "none"

    @property
    def projection_dim(self) -> int | None:
        """`model.projection_dim`, else the algorithm's (MOON: 256); None for models without a head."""
        if self.model.projection_dim is not None:
            return self.model.projection_dim
        return self.algorithm.projection_dim

    def flat(self) -> dict[str, Any]:
        """The config as {"training.lr": 0.01, ...} (for tracking and grids)."""
        return flatten(self.model_dump(mode="json"))


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{dotted}."))
        else:
            flat[dotted] = value
    return flat


def config_from_dict(values: Mapping[str, Any], source: str = "config") -> ExperimentConfig:
    if not isinstance(values, Mapping):
        raise ConfigError(f"{source}: the top level must be a mapping of keys, got {type(values).__name__}")
    try:
        return ExperimentConfig.model_validate(dict(values))
    except ValidationError as error:
        raise ConfigError(format_validation_error(error, source)) from None
