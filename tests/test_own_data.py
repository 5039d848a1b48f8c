"""A researcher's own data: the ``npz`` and ``imagefolder`` sources, what the prepare stage derives and
records, every bad data case as one line with nothing written, and a toy source added to the registry."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from fedcme_core.config.files import ConfigError
from fedcme_core.config.schema import config_from_dict
from fedcme_core.data import catalog
from fedcme_core.data.catalog import Source, SourceSettings, preparable_names, read_source
from fedcme_core.data.catalog.checks import as_images, channel_statistics
from fedcme_core.data.datasets import DataError, load_dataset, load_prepared
from fedcme_core.data.prepared import prepared_facts, prepared_record, save_prepared
from flows.pipeline import stages


# --- the checks, on tiny hand-made arrays --------------------------------------------------------

def test_hwc_chw_and_grey_images_become_nchw_and_floats_float32():
    hwc = np.arange(2 * 2 * 2 * 3, dtype=np.uint8).reshape(2, 2, 2, 3)  # [N, H, W, C]
    grey = np.zeros((2, 4, 5), dtype=np.float64)  # [N, H, W]

    chw = as_images(hwc, "x")
    assert chw.shape == (2, 3, 2, 2) and chw.dtype == np.uint8 and chw.flags.c_contiguous
    assert chw[1, 2, 0, 1] == hwc[1, 0, 1, 2] == 17  # image 1, row 0, column 1, blue: 12 + 3 + 2
    assert np.array_equal(as_images(chw, "x"), chw)  # CHW stays as it is
    assert as_images(grey, "x").shape == (2, 1, 4, 5) and as_images(grey, "x").dtype == np.float32


def test_channel_statistics_of_pixels_over_255_and_of_floats_as_they_are():
    pixels = np.array([[[[0, 255]]], [[[255, 255]]]], dtype=np.uint8)  # [2, 1, 1, 2]: 0, 1, 1, 1 after /255

    assert channel_statistics(pixels, "t") == (pytest.approx((0.75,)), pytest.approx((np.sqrt(0.75 * 0.25),)))
    assert channel_statistics(pixels.astype(np.float32) * 2, "t") == (pytest.approx((382.5,)),
                                                                      pytest.approx((510 * np.sqrt(0.1875),)))
    with pytest.raises(DataError, match="t dataset: a channel has zero variance"):
        channel_statistics(np.zeros((2, 1, 1, 1), dtype=np.uint8), "t")


# --- generated data -------------------------------------------------------------------------------

def write_npz(path: Path, **arrays) -> Path:
    """`arrays` saved as an .npz: x_test and y_test default to the first 6 training ones; one given as None is left out."""
    arrays = {"x_test": arrays["x_train"][:6], "y_test": arrays["y_train"][:6], **arrays}
    np.savez(path, **{key: value for key, value in arrays.items() if value is not None})
    return path


def rgb_hwc(count: int = 24, size: int = 8, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(count, size, size, 3), dtype=np.uint8)


def write_image_folder(root: Path, classes: dict[str, dict[str, int]], size=(8, 6), mode: str = "L") -> Path:
    """root/<split>/<class>/<i>.png, `classes[split][class]` images each, of `size` (width, height)."""
    rng = np.random.default_rng(1)
    for split, counts in classes.items():
        for name, count in counts.items():
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for index in range(count):
                shape = (size[1], size[0]) if mode == "L" else (size[1], size[0], 3)
                Image.fromarray(rng.integers(0, 256, size=shape, dtype=np.uint8), mode=mode).save(folder / f"{index}.png")
    return root


def write_params(folder: Path, dataset: str, path: str | None, model: str = "fmnist_cnn") -> Path:
    """A params file whose grid trains `dataset` (read from `path`) with FedAvg."""
    entry = {"name": model, **({"path": path} if path is not None else {})}
    params = {"base": {"device": "cpu", "data": {"dataset": "fmnist", "mirror": None, "data_dir": "data/raw"},
                       "partition": {"method": "dirichlet", "alpha": 1.0, "min_size": 2},
                       "federation": {"num_clients": 2, "clients_per_round": 2, "rounds": 1},
                       "training": {"local_epochs": 1, "batch_size": 8, "precision": "fp32", "channels_last": False},
                       "model": {"name": "fmnist_cnn"}, "algorithm": {"name": "fedavg"}, "runner": {"kind": "sequential"}},
              "datasets": {dataset: entry},
              "methods": {"fedavg": {"name": "fedavg", "label": "FedAvg"}},
              "grid": {"datasets": [dataset], "partitions": ["a1.0"], "clients": [[2, 2]], "seeds": [0],
                       "methods": ["fedavg"]},
              "report": {"name": "own"}}
    params_file = folder / "params.yaml"
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    return params_file


def prepare(folder: Path, dataset: str, monkeypatch, capsys) -> tuple[int, str]:
    """`python -m flows.pipeline.stages prepare --dataset <dataset>` in `folder`: (exit status, stderr)."""
    monkeypatch.chdir(folder)
    status = stages.main(["--params", "params.yaml", "prepare", "--dataset", dataset])
    return status, capsys.readouterr().err


def test_npz_prepare_derives_the_facts_and_records_them_with_the_files_sha256(tmp_path, monkeypatch, capsys):
    x_train = rgb_hwc(24, size=32)
    y_train = np.arange(24) % 4  # 4 classes, 6 images each
    source = write_npz(tmp_path / "own.npz", x_train=x_train, y_train=y_train)
    write_params(tmp_path, "npz", "own.npz", model="cifar_cnn64")

    status, errors = prepare(tmp_path, "npz", monkeypatch, capsys)

    assert (status, errors) == (0, "")
    meta = json.loads((tmp_path / "data/prepared/npz/meta.json").read_text())
    chw = x_train.transpose(0, 3, 1, 2) / 255.0
    assert meta["derived"]["num_classes"] == 4 and meta["derived"]["input_shape"] == [3, 32, 32]
    assert np.allclose(meta["derived"]["mean"], chw.mean(axis=(0, 2, 3))) and np.allclose(
        meta["derived"]["std"], chw.std(axis=(0, 2, 3)))
    assert meta["source"] == {"path": "own.npz", "sha256": hashlib.sha256(source.read_bytes()).hexdigest()}
    dataset = load_prepared(tmp_path / "data/prepared/npz", "npz")
    assert dataset.num_classes == 4 and dataset.input_shape == (3, 32, 32)
    assert torch.allclose(dataset.x_train.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-5)  # its own statistics


def test_npz_in_grey_floats_chw_with_many_classes_loads_as_the_config_names_it(tmp_path):
    x_train = np.random.default_rng(2).random((30, 1, 28, 28))  # float64, CHW, grey
    y_train = np.arange(30) % 15  # 15 classes
    write_npz(tmp_path / "own.npz", x_train=x_train, y_train=y_train, x_test=x_train[:15], y_test=y_train[:15])
    config = config_from_dict({"data": {"dataset": "npz", "path": str(tmp_path / "own.npz")},
                               "model": {"name": "fmnist_cnn"}})

    dataset = load_dataset("npz", data_dir=tmp_path, path=config.data.path)

    assert config.input_shape == (1, 28, 28) and dataset.num_classes == 15
    assert dataset.x_test.dtype == torch.float32 and dataset.y_test.tolist() == list(range(15))
    assert np.isclose(dataset.mean[0], x_train.mean()) and np.isclose(dataset.std[0], x_train.std())


def test_imagefolder_classes_are_trains_sorted_folders_and_test_may_hold_fewer(tmp_path):
    root = write_image_folder(tmp_path / "images", {"train": {"zebra": 2, "ant": 3}, "test": {"zebra": 2}}, (28, 28))
    data = {"dataset": "imagefolder", "path": str(root)}

    dataset = load_dataset("imagefolder", data_dir=tmp_path, path=root)
    config = config_from_dict({"data": data, "partition": {"method": "labels_per_client", "labels_per_client": 2}})

    assert dataset.num_classes == 2 and dataset.input_shape == (1, 28, 28) == config.input_shape  # grey
    assert dataset.y_train.tolist() == [0, 0, 0, 1, 1] and dataset.y_test.tolist() == [1, 1]  # ant 0, zebra 1
    pixels = np.asarray(Image.open(root / "train/ant/0.png"), dtype=np.float32) / 255
    assert torch.allclose(dataset.x_train[0, 0] * dataset.std[0] + dataset.mean[0], torch.from_numpy(pixels), atol=1e-5)
    with pytest.raises(ConfigError, match="partition.labels_per_client: 3 exceeds the 2 classes of imagefolder"):
        config_from_dict({"data": data, "partition": {"method": "labels_per_client", "labels_per_client": 3}})
    with pytest.raises(ConfigError, match=r"model.name: cifar_cnn expects inputs \(3, 32, 32\), but data.dataset "
                                          r"imagefolder gives \(1, 28, 28\)$"):
        config_from_dict({"data": data, "model": {"name": "cifar_cnn"}})


def test_the_facts_of_a_prepared_official_dataset_are_its_declared_ones_and_its_meta_is_as_before(tmp_path):
    arrays = {"x_train": np.zeros((4, 1, 28, 28), np.uint8), "y_train": np.arange(4), "x_test": np.zeros((2, 1, 28, 28),
              np.uint8), "y_test": np.arange(2)}

    meta = save_prepared("fmnist", arrays, tmp_path, prepared_record(read_source_like("fmnist", arrays)))

    assert set(meta) == {"dataset", "format", "arrays"}  # no derived facts, no source: byte for byte as before
    assert prepared_facts(tmp_path) == {"num_classes": 10, "input_shape": [1, 28, 28], "mean": [0.2860], "std": [0.3530]}


def read_source_like(name: str, arrays: dict) -> catalog.SourceData:
    """What read_source gives for an official dataset (its facts declared, nothing derived)."""
    return catalog.SourceData(arrays, catalog.declared_facts(name, (1, 28, 28)), derived=False, origin=None)


# --- bad data: one line, nothing written -----------------------------------------------------------

def _npz(**arrays):
    def write(folder: Path) -> tuple[str, str]:
        base = {"x_train": rgb_hwc(12), "y_train": np.arange(12) % 3}
        return "npz", str(write_npz(folder / "own.npz", **{**base, **arrays}))  # an array given as None: left out
    return write


def _folder(classes, size=(8, 6), damage=None):
    def write(folder: Path) -> tuple[str, str]:
        root = write_image_folder(folder / "images", classes, size)
        if damage is not None:
            damage(root)
        return "imagefolder", str(root)
    return write


def _ragged(root: Path) -> None:
    Image.fromarray(np.zeros((6, 7), dtype=np.uint8), mode="L").save(root / "train/b/9.png")


def _corrupt(root: Path) -> None:
    (root / "train/a/5.png").write_bytes(b"not an image")


def _not_a_zip(folder: Path) -> tuple[str, str]:
    (folder / "own.npz").write_text("x_train,y_train\n")
    return "npz", str(folder / "own.npz")


TWO = {"train": {"a": 2, "b": 2}, "test": {"a": 1}}
BAD_DATA = {
    "ragged image sizes": (_folder(TWO, damage=_ragged), "9.png: 7x6 pixels, but the first training image is 8x6"),
    "ragged splits": (_npz(x_test=rgb_hwc(6, size=7)), "train images are 3x8x8 but test images are 3x7x7"),
    "labels out of range": (_npz(y_train=np.arange(12) % 3 - 1), "y_train: label -1 out of range"),
    "a class with no training sample": (_npz(y_train=np.arange(12) % 3 * 2),
                                        "classes 1, 3 have no training sample"),
    "an empty class folder": (_folder({"train": {"a": 2, "b": 0}, "test": {"a": 1}}),
                              "class b has no training sample"),
    "test classes unseen in training": (_npz(y_test=np.array([0, 1, 2, 3, 5, 5])), "y_test has classes 3, 5 unseen in training"),
    "a test folder unseen in training": (_folder({"train": {"a": 2}, "test": {"a": 1, "c": 1}}),
                                         "class c unseen in training"),
    "an unreadable image": (_folder(TWO, damage=_corrupt), "5.png: cannot read as an image"),
    "an unreadable npz": (_not_a_zip, "own.npz: cannot read as an .npz archive"),
    "a missing array": (_npz(y_test=None), "own.npz: lacks the array y_test"),
    "a missing file": (lambda folder: ("npz", str(folder / "gone.npz")), "gone.npz: no such file"),
    "float labels": (_npz(y_train=np.arange(12) % 3 * 1.0), "y_train: labels must be integers"),
}


@pytest.mark.parametrize("case", BAD_DATA, ids=list(BAD_DATA))
def test_bad_data_is_one_line_and_the_prepare_stage_writes_nothing(case, tmp_path, monkeypatch, capsys):
    write, message = BAD_DATA[case]
    dataset, path = write(tmp_path)
    write_params(tmp_path, dataset, path)

    status, errors = prepare(tmp_path, dataset, monkeypatch, capsys)

    assert status == 2 and errors.count("\n") == 1 and errors.startswith("fedcme: error: "), errors
    assert message in errors
    assert not (tmp_path / "data" / "prepared").exists()


def test_a_grid_dataset_without_its_path_is_one_line(tmp_path, monkeypatch, capsys):
    write_params(tmp_path, "npz", None)

    status, errors = prepare(tmp_path, "npz", monkeypatch, capsys)

    assert status == 2 and errors == ("fedcme: error: params.yaml: datasets.npz.path: missing; the prepare stage reads "
                                      "the npz data from it\n")


# --- a toy source: one module plus one line -------------------------------------------------------

class Toy(Source):
    """Three classes of 2x3 grey images whose pixels are their label times 100."""

    name = "toy"
    label = "Toy"

    def arrays(self, settings: SourceSettings) -> dict[str, np.ndarray]:
        labels = np.array([0, 1, 2, 0, 1, 2], dtype=np.int64)
        images = (np.ones((6, 2, 3), dtype=np.uint8) * (labels * 100)[:, None, None]).astype(np.uint8)
        return {"x_train": images, "y_train": labels, "x_test": images[:3], "y_test": labels[:3]}


def test_a_toy_source_registered_in_one_line_is_a_dataset_like_any_other(tmp_path, monkeypatch):
    monkeypatch.setitem(catalog.SOURCES, "toy", Toy())  # the one line, in SOURCES

    data = read_source("toy", SourceSettings())
    save_prepared("toy", data.arrays, tmp_path / "toy", prepared_record(data))
    dataset = load_prepared(tmp_path / "toy", "toy")
    config = config_from_dict({"data": {"dataset": "toy"}, "model": {"name": "fmnist_cnn"}})

    assert "toy" in preparable_names() and config.data.dataset == "toy" and config.input_shape is None
    assert dataset.num_classes == 3 and dataset.input_shape == (1, 2, 3)
    assert dataset.mean == pytest.approx((100 / 255,)) and dataset.std == pytest.approx((np.sqrt(20000 / 3) / 255,))
    assert dataset.x_train[:, 0, 0, 0].tolist() == pytest.approx([-np.sqrt(1.5), 0.0, np.sqrt(1.5)] * 2, abs=1e-6)
    with pytest.raises(ConfigError, match="data.dataset: unknown dataset 'toys': expected one of .*, toy"):
        config_from_dict({"data": {"dataset": "toys"}})
