"""A researcher's own data through the DVC pipeline for real: one grid of an ``npz`` file and an
``imagefolder`` folder, generated here, prepared, partitioned, trained by FedCME and reported by
`dvc repro` in a temporary copy of the repository."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from .conftest import REPO_ROOT
from .helpers import dvc_checkout, run_checked
from .test_pipeline import stages_run

pytestmark = pytest.mark.slow

EXPERIMENTS = ["npz-a1.0-k2m2-fedcme-s0", "imagefolder-a1.0-k2m2-fedcme-s0"]


def own_data(folder: Path) -> None:
    """own/digits.npz: 3 classes of grey 28x28 images in HWC floats; own/images: 2 classes of RGB 32x32 PNGs."""
    rng = np.random.default_rng(0)
    labels = np.arange(60) % 3
    images = rng.random((60, 28, 28, 1), dtype=np.float32) + labels[:, None, None, None]
    (folder / "own").mkdir()
    np.savez_compressed(folder / "own" / "digits.npz", x_train=images[:48], y_train=labels[:48], x_test=images[48:],
                        y_test=labels[48:])
    for split, count in (("train", 12), ("test", 3)):
        for name in ("cat", "dog"):
            (folder / "own" / "images" / split / name).mkdir(parents=True)
            for index in range(count):
                pixels = rng.integers(0, 128, size=(32, 32, 3), dtype=np.uint8) + (127 if name == "dog" else 0)
                Image.fromarray(pixels.astype(np.uint8)).save(folder / "own" / "images" / split / name / f"{index}.png")


def own_params(folder: Path) -> Path:
    base = yaml.safe_load((REPO_ROOT / "configs" / "params-smoke.yaml").read_text())
    base["base"]["data"].update(train_subset=None, test_subset=None)
    base["base"]["partition"]["min_size"] = 2
    base["base"]["federation"].update(num_clients=2, clients_per_round=2, rounds=1)
    base["base"]["training"].update(batch_size=8, precision="fp32", channels_last=False)
    params = {**base, "datasets": {"npz": {"name": "fmnist_cnn", "path": "own/digits.npz"},
                                   "imagefolder": {"name": "cifar_cnn", "path": "own/images"}},
              "methods": {"fedcme": {"name": "fedcme", "mu": 0.01, "label": "FedCME(0.01)"}},
              "grid": {"datasets": ["npz", "imagefolder"], "partitions": ["a1.0"], "clients": [[2, 2]], "seeds": [0],
                       "methods": ["fedcme"]},
              "ablation": {"datasets": ["npz"], "partitions": ["a1.0"], "clients": [[2, 2]], "seeds": [0],
                           "methods": []},
              "report": {"name": "own", "target_accuracy": 0.5, "published": []}}
    path = folder / "params-own.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, mirror, prefect_server):
    """A copy of the repository whose params.yaml is the own-data grid, reproduced once."""
    workdir = tmp_path_factory.mktemp("repo")
    params = own_params(tmp_path_factory.mktemp("params"))
    environment = dvc_checkout(REPO_ROOT, workdir, params, mirror, {
        **os.environ, "PREFECT_API_URL": prefect_server, "MLFLOW_TRACKING_URI": f"sqlite:///{workdir / 'mlflow.db'}"})
    shutil.copytree(REPO_ROOT / ".dvc" / "plots", workdir / ".dvc" / "plots")
    own_data(workdir)
    return workdir, environment, run_checked(["dvc", "repro"], workdir, environment)


def test_repro_prepares_partitions_trains_and_reports_own_npz_and_imagefolder_data(pipeline):
    workdir, _, output = pipeline

    assert {"prepare@npz", "prepare@imagefolder", "report"} <= set(stages_run(output))
    npz = json.loads((workdir / "data/prepared/npz/meta.json").read_text())
    images = json.loads((workdir / "data/prepared/imagefolder/meta.json").read_text())
    assert (npz["derived"]["num_classes"], npz["derived"]["input_shape"]) == (3, [1, 28, 28])
    assert (images["derived"]["num_classes"], images["derived"]["input_shape"]) == (2, [3, 32, 32])
    assert npz["source"]["path"] == "own/digits.npz" and len(npz["source"]["sha256"]) == 64
    for experiment in EXPERIMENTS:
        results = json.loads((workdir / "metrics" / f"{experiment}.json").read_text())
        assert 0.0 <= results["final_accuracy"] <= 1.0
    about = json.loads((workdir / "metrics" / "about" / f"{EXPERIMENTS[0]}.json").read_text())
    assert about["setting"] == "npz α=1.0 K=2 M=2" and about["dataset_facts"] == npz["derived"]  # the run's record
    assert "| FedCME(0.01) |" in (workdir / "reports" / "results.md").read_text()


def test_a_new_data_path_prepares_and_partitions_that_dataset_again(pipeline):
    workdir, environment, _ = pipeline
    shutil.copy2(workdir / "own" / "digits.npz", workdir / "own" / "digits-copy.npz")
    params = yaml.safe_load((workdir / "params.yaml").read_text())
    params["datasets"]["npz"]["path"] = "own/digits-copy.npz"
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    output = run_checked(["dvc", "repro", "partition@npz-a1.0-clients0-0"], workdir, environment)

    # meta.json records the path read, so the prepared folder, and the partition made from it, are new.
    assert stages_run(output) == ["prepare@npz", "partition@npz-a1.0-clients0-0"]
    assert json.loads((workdir / "data/prepared/npz/meta.json").read_text())["source"]["path"] == "own/digits-copy.npz"
