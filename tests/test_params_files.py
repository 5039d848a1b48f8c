"""Every shipped grid file (params.yaml, configs/params-*.yaml) works, and a bad one stops early.

A shipped grid file validates against the whole-file schema, holds every params path dvc.yaml
reads, and its first partition stage (with its prepare) reproduces for real in a fresh copy of
the repository. A new grid file under configs/ is covered without editing this test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedcme_core.config.schema import ConfigError
from fedcme_core.config.params import load_params
from flows.pipeline.dvc_params import check_dvc_params, lookup, needed_params

from .conftest import REPO_ROOT
from .helpers import dvc_checkout, run_checked

GRID_FILES = [REPO_ROOT / "params.yaml", *sorted((REPO_ROOT / "configs").glob("params-*.yaml"))]
GRID_IDS = [str(path.relative_to(REPO_ROOT)) for path in GRID_FILES]


PREPARE_AND_PARTITION = {"stages": {name: stage for name, stage in
                                    yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"].items()
                                    if name in ("prepare", "partition")}}


def first_partition_stage(params: dict) -> str:
    """What `dvc repro` of a grid's first partition stage (with its prepare) runs: the stage's matrix
    item and the value of every params path the two stages read (dvc.yaml's own lists)."""
    grid = params["grid"]
    item = (grid["datasets"][0], grid["partitions"][0], grid["clients"][0][0], grid["seeds"][0])
    read = needed_params(PREPARE_AND_PARTITION, params)
    return repr((item, [(key, lookup(params, key)) for key in read if not key.startswith("grid.")]))


# Grid files whose first partition stage is the same command on the same params values are one
# reproduction: DVC would run exactly the same stages for each of them.
SAME_FIRST_STAGE: dict[str, list[Path]] = {}
for _path in GRID_FILES:
    SAME_FIRST_STAGE.setdefault(first_partition_stage(yaml.safe_load(_path.read_text())), []).append(_path)
FIRST_STAGE_GROUPS = list(SAME_FIRST_STAGE.values())
FIRST_STAGE_IDS = ["+".join(path.name for path in group) for group in FIRST_STAGE_GROUPS]


def test_every_grid_file_is_found():
    assert {"params.yaml", "configs/params-smoke.yaml", "configs/params-paper.yaml"} <= set(GRID_IDS)


@pytest.mark.parametrize("path", GRID_FILES, ids=GRID_IDS)
def test_shipped_grid_file_validates(path):
    params = load_params(path)

    assert list(params.grid.cells()), "a grid with no experiment"
    for method in params.grid.methods:
        assert method in params.methods


@pytest.mark.parametrize("path", GRID_FILES, ids=GRID_IDS)
def test_shipped_grid_file_has_every_param_dvc_yaml_reads(path):
    count = check_dvc_params(REPO_ROOT / "dvc.yaml", path)

    assert count > 0


def test_grid_files_share_a_first_partition_stage_only_where_dvc_runs_the_same_stages():
    by_file = {path.name: first_partition_stage(yaml.safe_load(path.read_text())) for path in GRID_FILES}

    assert sum(map(len, FIRST_STAGE_GROUPS)) == len(GRID_FILES)
    for group in FIRST_STAGE_GROUPS:
        assert len({by_file[path.name] for path in group}) == 1
    # CIFAR-10's alpha=0.1, K=50 partition is the same stage in the T=100, reference and sensitivity
    # grids; K, the partition tag, the subset and the data source each tell stages apart.
    assert by_file["params-cifar10-t100.yaml"] == by_file["params-sensitivity.yaml"]
    assert by_file["params-niid-bench.yaml"] == by_file["params-niid-bench-raw.yaml"]
    assert len({by_file[name] for name in ("params-cifar10-t100.yaml", "params-paper-k80.yaml",
                                            "params-sensitivity-c2.yaml", "params-niid-bench.yaml")}) == 4
    assert by_file["params-paper.yaml"] != by_file["params-reference-fmnist.yaml"]  # train_subset 20000
    for key, value in (("data_dir", "elsewhere"), ("train_subset", 2000)):  # read by prepare, by partition
        changed = yaml.safe_load(GRID_FILES[0].read_text())
        changed["base"]["data"][key] = value
        assert first_partition_stage(changed) != by_file["params.yaml"]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory, mirror):
    """One fresh copy of the repository (git and DVC initialised) for every grid file's stages: each
    test makes its grid file params.yaml there, so a prepare stage that another grid file has run
    on the same params is DVC's cache hit, as in a real checkout that switches grid files."""
    workdir = tmp_path_factory.mktemp("grid-files")
    return workdir, dvc_checkout(REPO_ROOT, workdir, GRID_FILES[0], mirror, dict(os.environ))


@pytest.mark.slow  # a real `dvc repro` of prepare and partition, per distinct first partition stage of the grid files
@pytest.mark.parametrize("group", FIRST_STAGE_GROUPS, ids=FIRST_STAGE_IDS)
def test_first_partition_stage_of_grid_file_reproduces(checkout, group):
    workdir, environment = checkout
    path = group[0]
    (workdir / "params.yaml").write_text(path.read_text())
    stages = run_checked(["dvc", "stage", "list", "--name-only"], workdir, environment).split()
    first = next(stage for stage in stages if stage.startswith("partition@"))

    output = run_checked(["dvc", "repro", first], workdir, environment)

    params = yaml.safe_load(path.read_text())
    dataset, seed = params["grid"]["datasets"][0], params["grid"]["seeds"][0]
    tag, clients = params["grid"]["partitions"][0], params["grid"]["clients"][0][0]
    partition = workdir / "data" / "partitions" / f"{dataset}-{tag}-k{clients}-s{seed}"
    # Its prepare ran here, or an earlier grid file's run of it on the same params is reused.
    assert (f"Running stage 'prepare@{dataset}'" in output
            or f"Stage 'prepare@{dataset}' didn't change" in output), output
    assert f"Running stage '{first}'" in output
    assert (partition / "partition.npz").is_file() and (partition / "class_counts.json").is_file()


# ----------------------------------------------------------------------------- bad input
def write_variant(tmp_path: Path, old: str, new: str) -> Path:
    text = (REPO_ROOT / "params.yaml").read_text()
    assert old in text
    path = tmp_path / "params.yaml"
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.mark.parametrize(("old", "new", "message"), [
    ("\ngrid:", "\ngird:", "grid: missing; gird: unknown key"),
    ("  seeds: [0, 1]\n  methods: [fedavg,", "  seed: [0, 1]\n  methods: [fedavg,", "grid.seeds: missing; grid.seed: unknown key"),
    ("{name: fedprox, mu: 0.01,", "{name: fedprox, mu_: 0.01,", "methods.fedprox-mu001.mu_: unknown key"),
    ("{name: fedprox, mu: 0.01,", "{name: fedprx, mu: 0.01,", "methods.fedprox-mu001.name: unknown algorithm 'fedprx'"),
    ("fedrs-a05, fedcme-mu001]", "fedrs-a05, fedcme-mu0001]", "grid.methods: fedcme-mu0001 not defined in methods"),
    ("  target_accuracy: 0.7", "  target_acuracy: 0.7", "report.target_acuracy: unknown key"),
    ("    lr: 0.01\n", "    lr: -1\n", "base.training.lr: Input should be greater than 0"),
    ("  clients:                # (K, M) pairs; K must differ between pairs\n    - [10, 10]",
     "  clients:\n    - [10, 10]\n    - [10, 5]", "grid.clients: K must differ between (K, M) pairs"),
    ("  partitions: [a1.0]\n  clients:\n    - [10, 10]\n  seeds: [0]\n  methods: []",
     "  partitions: [a0.5]\n  clients:\n    - [10, 10]\n  seeds: [0]\n  methods: [fedcme-no-exchange]",
     "ablation: settings [('fmnist', 'a0.5', 10, 10, 0)] are not in grid"),
    ("  partitions: [a1.0]\n  clients:                #", "  partitions: [a1.0, x3]\n  clients:                #",
     "grid.partitions: 'x3' is not a partition tag; write a<alpha> (Dirichlet alpha) or c<k> (k labels per client)"),
    ("  partitions: [a1.0]\n  clients:                #", "  partitions: [a1]\n  clients:                #",
     "grid.partitions: 'a1' is spelled a1.0"),
    ("  partitions: [a1.0]\n  clients:                #", "  partitions: [c2, c2]\n  clients:                #",
     "grid.partitions: 'c2' given twice"),
    ("  partitions: [a1.0]\n  clients:                #", "  partitions: [c11]\n  clients:                #",
     "partition.labels_per_client: 11 exceeds the 10 classes"),
    ("    method: dirichlet ", "    labels_per_client: 2\n    method: labels_per_client ",
     "grid.partitions: 'a1.0' sets a Dirichlet alpha, but base.partition.method is labels_per_client"),
    ("{name: fedavg, label: FedAvg}", "{name: fedavg, label: FedAvg, setup: {federation.num_clients: 5}}",
     "methods.fedavg.setup.federation.num_clients: a grid dimension; the grid and ablation sections set it"),
    ("{name: fedavg, label: FedAvg}", "{name: fedavg, label: FedAvg, setup: {partition.alpha: 5}}",
     "methods.fedavg.setup.partition.alpha: a grid dimension"),
    ("{name: fedavg, label: FedAvg}", "{name: fedavg, label: FedAvg, setup: {seed: 5}}",
     "methods.fedavg.setup.seed: a grid dimension"),
    ("{name: fedavg, label: FedAvg}", "{name: fedavg, label: FedAvg, setup: {algorithm.name: fedprox}}",
     "methods.fedavg.setup.algorithm.name: the method's algorithm; write it in the method itself"),
    ("{name: fedavg, label: FedAvg}", "{name: fedavg, label: FedAvg, setup: {training: {local_epochs: 4}}}",
     "methods.fedavg.setup.training: give each key dotted"),
    ("{name: fedcme, mu: 0.01, label: FedCME(0.01)}", "{name: fedcme, mu: 0.01, label: FedCME(0.01), "
     "setup: {training.local_epochs: 1}}", "[grid cell fedcme-mu001 fmnist a1.0 K=10 M=10 seed=0]: "
     "training.local_epochs: FedCME with exchange 'classifier' needs at least 2 local epochs"),
    ("{name: fedavg, label: FedAvg}", "{name: fedavg, label: FedAvg, setup: {training.local_epoch: 4}}",
     "[grid cell fedavg fmnist a1.0 K=10 M=10 seed=0]: training.local_epoch: unknown key"),
    ("\nreport:\n", "\nreport:\n  name: x\n", "key 'name' given twice"),
    ("  published: []", "  published: [{method: fedavg, dataset: cifar10, partition: a0.5, clients: [10, 10], "
     "accuracy: 68.2, source: NIID-Bench}]", "report.published.0: no grid or ablation run of fedavg in cifar10 a0.5 K=10 M=10"),
    ("  published: []", "  published: [{method: fedavg, dataset: fmnist, partition: a1.0, clients: [10, 10], measure: final, "
     "accuracy: 68.2, source: x}]", "report.published.0.measure: Input should be 'final_accuracy'"),
    ("  published: []", "  published: [{method: fedavg, dataset: fmnist, partition: a1.0, clients: [10, 10], accuracy: 68.2, "
     "source: x}, {method: fedavg, dataset: fmnist, partition: a1.0, clients: [10, 10], accuracy: 682, source: x}]",
     "report.published.1.accuracy: Input should be less than or equal to 100"),
    ("  published: []", "  published: [{method: fedavg, dataset: fmnist, partition: a1.0, clients: [10, 10], accuracy: 0.682, "
     "source: x}]", "report.published.0.accuracy: 0.682 looks like a fraction: give the published figure in percent"),
    ("  published: []", "  published: [{method: fedavg, dataset: fmnist, alpha: 1.0, clients: [10, 10], accuracy: 68.2, "
     "source: x}]", "report.published.0.partition: missing; report.published.0.alpha: unknown key"),
    ("  published: []", "  published: [{method: fedavg, dataset: fmnist, partition: 1.0, clients: [10, 10], accuracy: 68.2, "
     "source: x}]", "report.published.0.partition: Input should be a valid string"),
    ("    local_epochs: 2 ", "    local_epochs: 1 ", "base.training.local_epochs: FedCME with exchange 'classifier' needs at least 2 local epochs"),
])
def test_a_bad_params_file_is_one_line_naming_file_and_key(tmp_path, old, new, message):
    path = write_variant(tmp_path, old, new)

    with pytest.raises(ConfigError) as error:
        load_params(path)

    assert str(error.value).startswith((f"{path}: ", f"{path} [grid cell ")) and message in str(error.value)
    assert "\n" not in str(error.value)


def test_a_missing_dvc_param_is_named(tmp_path):
    path = write_variant(tmp_path, "    train_subset: 3000", "    test_subset: 3000")

    with pytest.raises(ConfigError, match=r"params.yaml: base.data.train_subset: missing \(read by .*dvc.yaml"):
        check_dvc_params(REPO_ROOT / "dvc.yaml", path)


def test_needed_params_expand_the_matrix_as_dvc_does():
    params = {"grid": {"methods": ["a", "b"], "datasets": ["fmnist"], "partitions": ["a0.1", "c2"], "clients": [[5, 2]],
                       "seeds": [0]},
              "ablation": {"methods": ["c"], "datasets": ["fmnist"], "partitions": ["a0.1"], "clients": [[5, 2]],
                           "seeds": [0]}}
    dvc_yaml = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())

    needed = needed_params(dvc_yaml, params)

    assert {"methods.a", "methods.b", "methods.c", "datasets.fmnist", "base.data.train_subset", "grid.seeds",
            "ablation.methods", "report.target_accuracy"} <= set(needed)
    assert not any("${" in path for path in needed)
    assert "grid.partitions" in needed and "base.partition.method" in needed


def cli(arguments: list[str], cwd: Path) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "flows.cli", *arguments], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # `fedcme check` as commands
def test_check_command_passes_the_shipped_files_and_names_a_typo(tmp_path):
    shipped = cli(["check", *map(str, GRID_FILES), "--dvc-yaml", str(REPO_ROOT / "dvc.yaml")], tmp_path)
    typo = cli(["check", str(write_variant(tmp_path, "\ngrid:", "\ngird:"))], tmp_path)

    assert shipped.returncode == 0, shipped.stderr
    assert shipped.stdout.count(": ok, ") == len(GRID_FILES)
    assert typo.returncode == 2
    assert typo.stderr.strip().splitlines() == [f"fedcme: error: {tmp_path / 'params.yaml'}: grid: missing; gird: unknown key"]


@pytest.mark.slow  # `fedcme train` and the stage as commands
def test_train_and_stages_refuse_a_typo_before_writing_anything(tmp_path):
    path = write_variant(tmp_path, "\ngrid:", "\ngird:")
    before = set(tmp_path.iterdir())

    train = cli(["train", "--config", str(path), "--experiment", "typo"], tmp_path)
    stage = subprocess.run([sys.executable, "-m", "flows.pipeline.stages", "--params", str(path), "partition", "--dataset", "fmnist",
                            "--partition", "a0.1", "--clients", "50", "--seed", "0"], cwd=tmp_path,
                           env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, capture_output=True, text=True, timeout=300)

    for result in (train, stage):
        assert result.returncode == 2
        assert result.stderr.strip().splitlines() == [f"fedcme: error: {path}: grid: missing; gird: unknown key"]
    assert set(tmp_path.iterdir()) == before  # no runs/, mlflow.db, data/ or partition
