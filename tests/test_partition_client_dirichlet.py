"""Tests for fedcme_core.data.client_dirichlet: Hsu et al.'s per-client Dir(alpha * prior) partition,
its dispatch, config, grid tag, `fedcme check` and the partition stage's heat map."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedcme_core.config.params import load_params
from fedcme_core.config.partition_tags import partition_description
from fedcme_core.config.schema import config_from_dict
from fedcme_core.data import client_dirichlet
from fedcme_core.data.client_dirichlet import (
    _draws_within,
    client_class_counts,
    client_dirichlet_partition,
    client_sizes,
)
from fedcme_core.data.partition import PartitionError, PartitionSpec, class_counts, partition_labels
from fedcme_core.data.partition_file import Partition

from .conftest import REPO_ROOT


def assert_disjoint_cover(parts: list[np.ndarray], num_samples: int) -> None:
    for indices in parts:
        assert indices.dtype == np.int64
        assert np.all(np.diff(indices) > 0), "each client's indices are sorted and unique"
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(num_samples))


def fixed_mixes(mixes: list[list[float]]):
    """A stand-in for client_class_mixes that returns `mixes` whatever the draw."""
    return lambda rng, concentration, num_clients: np.array(mixes, dtype=np.float64)


# --- hand-computed cases ------------------------------------------------------------------


@pytest.mark.parametrize(("num_samples", "num_clients", "expected"),
                         [(10, 4, [3, 3, 2, 2]), (12, 3, [4, 4, 4]), (7, 3, [3, 2, 2]), (5, 5, [1, 1, 1, 1, 1])])
def test_client_sizes_are_equal_with_the_remainder_on_the_first_clients(num_samples, num_clients, expected):
    sizes = client_sizes(num_samples, num_clients)

    assert sizes.dtype == np.int64
    assert sizes.tolist() == expected


@pytest.mark.parametrize(("draws", "remaining", "kept"), [
    ([0, 1, 0, 0], [2, 5], 3),      # the third 0 is one beyond class 0's two samples
    ([1, 1, 0, 1], [1, 2], 3),      # class 1's third draw; class 0's first is within
    ([0, 1, 1, 0], [2, 2], 4),      # nothing beyond: all kept
    ([2, 0, 2, 0], [1, 1, 1], 2),   # class 2's second draw at 2 comes before class 0's at 3
])
def test_draws_are_kept_up_to_the_first_beyond_a_class(draws, remaining, kept):
    assert _draws_within(np.array(draws), np.array(remaining)) == kept


@pytest.mark.parametrize("seed", range(5))
def test_a_class_that_runs_out_renormalises_the_mix(seed):
    # Client 0 (q = [.5, .5, 0]) needs 3 samples and classes 0 and 1 hold 1 + 2: whichever runs out
    # first, q renormalised over the rest puts all its mass on the other one -> [1, 2, 0].
    # Client 1 (q = [.2, .3, .5]) then finds only class 2 left -> [0, 0, 3].
    counts = client_class_counts(np.random.default_rng(seed), np.array([1, 2, 3]), np.array([3, 3]),
                                 np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]), np.array([0.5, 0.5, 0.5]))

    assert counts.dtype == np.int64
    assert counts.tolist() == [[1, 2, 0], [0, 0, 3]]


@pytest.mark.parametrize("seed", range(5))
def test_a_mix_that_is_zero_on_every_class_left_is_drawn_again_over_them(seed):
    # Client 0 (q = [.5, .5, 0]) takes the one sample of classes 0 and 1, then q is 0 on class 2,
    # the only class left: q is drawn again over {2} (Dir of one class is [1]) -> [1, 1, 2].
    counts = client_class_counts(np.random.default_rng(seed), np.array([1, 1, 10]), np.array([4, 4, 4]),
                                 np.array([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0]]), np.full(3, 0.1))

    assert counts.tolist() == [[1, 1, 2], [0, 0, 4], [0, 0, 4]]


def test_a_client_that_finds_nothing_left_is_refused():
    with pytest.raises(PartitionError, match="client 1 needs 2 more samples"):
        client_class_counts(np.random.default_rng(0), np.array([1, 1]), np.array([2, 2]),
                            np.array([[0.5, 0.5], [0.5, 0.5]]), np.array([1.0, 1.0]))


def test_fixed_one_hot_mixes_give_each_client_its_class_exactly(monkeypatch):
    monkeypatch.setattr(client_dirichlet, "client_class_mixes", fixed_mixes(np.eye(3).tolist()))
    labels = np.array([2, 0, 1, 1, 0, 2, 2, 1, 0, 0, 1, 2])  # 4 of each class, N // K = 4

    parts = client_dirichlet_partition(labels, num_clients=3, alpha=1.0, seed=0, min_size=1)

    assert [part.tolist() for part in parts] == [[1, 4, 8, 9], [2, 3, 7, 10], [0, 5, 6, 11]]


def test_fixed_mixes_with_a_remainder_and_an_exhausted_class(monkeypatch):
    # N = 7, K = 2: sizes [4, 3]. Client 0 (q = [1, 0]) takes the 3 samples of class 0, then q is 0
    # on class 1, the only class left, and is drawn again over it: 1 of class 1. Client 1: 3 of class 1.
    monkeypatch.setattr(client_dirichlet, "client_class_mixes", fixed_mixes([[1.0, 0.0], [0.3, 0.7]]))
    labels = np.array([1, 0, 1, 1, 0, 1, 0])

    parts = client_dirichlet_partition(labels, num_clients=2, alpha=0.5, seed=4, min_size=1)

    assert class_counts(labels, parts, 2).tolist() == [[3, 1], [0, 3]]
    assert_disjoint_cover(parts, 7)


@pytest.mark.parametrize("seed", range(8))
def test_a_tiny_alpha_gives_each_client_one_class(seed):
    # alpha * p = 1e-12 / 3 per class: q_k is one-hot to float precision, so three clients of 4 take
    # the three classes of 4 samples one each: a client whose class is used up draws q again over the
    # two left, one-hot again (following the samples left instead would mix them).
    labels = np.array([0, 1, 2] * 4)

    parts = client_dirichlet_partition(labels, num_clients=3, alpha=1e-12, seed=seed, min_size=1)

    assert sorted(class_counts(labels, parts, 3).tolist()) == [[0, 0, 4], [0, 4, 0], [4, 0, 0]]


def test_a_huge_alpha_gives_each_client_the_prior():
    # alpha = 1e12: q_k = p = [.75, .25] to within 1e-5, so a client's 400 draws give 300 +- 9 (1 std)
    # of class 0 (the last client takes what is left: its count is not one client's draw).
    labels = np.repeat([0, 1], [1500, 500])

    counts = class_counts(labels, client_dirichlet_partition(labels, 5, alpha=1e12, seed=0, min_size=1), 2)

    assert counts.sum(axis=1).tolist() == [400] * 5
    assert np.all(np.abs(counts[:4, 0] - 300) <= 45)


# --- properties -----------------------------------------------------------------------------


@st.composite
def label_arrays_and_clients(draw: st.DrawFn) -> tuple[np.ndarray, int]:
    num_clients = draw(st.integers(1, 8))
    num_classes = draw(st.integers(1, 6))
    num_samples = draw(st.integers(num_clients, 200))
    labels = draw(st.lists(st.integers(0, num_classes - 1), min_size=num_samples, max_size=num_samples))
    return np.array(labels, dtype=np.int64), num_clients


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=label_arrays_and_clients(), alpha=st.floats(1e-6, 1e4), seed=st.integers(0, 2**31 - 1))
def test_every_sample_is_assigned_once_and_sizes_are_as_documented(case, alpha, seed):
    labels, num_clients = case  # classes may be missing, N need not divide by K

    parts = client_dirichlet_partition(labels, num_clients, alpha, seed, min_size=0)

    assert_disjoint_cover(parts, len(labels))
    assert [len(part) for part in parts] == client_sizes(len(labels), num_clients).tolist()


def test_classes_much_smaller_than_a_client_are_exhausted_and_the_rest_filled():
    labels = np.repeat(np.arange(5), [3, 1, 40, 2, 54])  # N = 100, K = 4: 25 each

    for seed in range(20):
        parts = client_dirichlet_partition(labels, num_clients=4, alpha=0.05, seed=seed, min_size=1)

        assert [len(part) for part in parts] == [25, 25, 25, 25]
        assert class_counts(labels, parts, 5).sum(axis=0).tolist() == [3, 1, 40, 2, 54]


def test_a_single_client_gets_everything():
    labels = np.array([2, 0, 1, 0, 2, 1, 1, 0])

    parts = client_dirichlet_partition(labels, 1, 0.5, seed=3, min_size=1)

    assert [part.tolist() for part in parts] == [list(range(8))]


def test_min_size_beyond_an_equal_share_is_refused_and_an_equal_share_always_holds():
    labels = np.arange(10) % 3

    with pytest.raises(PartitionError, match="min_size"):
        client_dirichlet_partition(labels, num_clients=3, alpha=0.1, seed=0, min_size=4)
    assert min(len(part) for part in client_dirichlet_partition(labels, 3, alpha=0.01, seed=0, min_size=3)) == 3


# --- seeding and dispatch -------------------------------------------------------------------


def labels_for_seeding() -> np.ndarray:
    return np.random.default_rng(7).integers(0, 10, size=2000)


def test_same_seed_same_partition_and_other_seeds_differ():
    labels = labels_for_seeding()
    spec = PartitionSpec(method="client_dirichlet", num_clients=20, alpha=0.5, seed=1, min_size=10)

    first, again = Partition.create(labels, spec), Partition.create(labels, spec)
    others = {Partition.create(labels, dataclasses.replace(spec, seed=seed)).content_hash for seed in (0, 2, 3)}

    assert first.content_hash == again.content_hash
    assert first.content_hash not in others and len(others) == 3


def digest(parts: list[np.ndarray]) -> str:
    return hashlib.sha256(np.concatenate(parts).tobytes() + np.array([len(p) for p in parts]).tobytes()).hexdigest()


def test_the_partition_is_bit_identical_in_a_fresh_process():
    script = ("import numpy as np\n"
              "from fedcme_core.data.client_dirichlet import client_dirichlet_partition\n"
              "from tests.test_partition_client_dirichlet import digest, labels_for_seeding\n"
              "print(digest(client_dirichlet_partition(labels_for_seeding(), 20, 0.5, 1, 10)))\n")
    expected = digest(client_dirichlet_partition(labels_for_seeding(), 20, 0.5, 1, 10))

    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, check=True)

    assert result.stdout.strip() == expected


def test_partition_labels_dispatches_to_it_and_records_alpha():
    labels = labels_for_seeding()
    spec = PartitionSpec(method="client_dirichlet", num_clients=10, alpha=0.3, seed=5, min_size=10)

    parts = partition_labels(labels, spec)

    direct = client_dirichlet_partition(labels, 10, 0.3, 5, 10)
    assert all(np.array_equal(a, b) for a, b in zip(parts, direct))
    other = partition_labels(labels, PartitionSpec(method="dirichlet", num_clients=10, alpha=0.3, seed=5))
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other))
    assert spec.record()["alpha"] == 0.3 and spec.record()["method"] == "client_dirichlet"


# --- config, grid tag, `fedcme check`, the partition stage ----------------------------------


def client_dirichlet_params(tmp_path):
    text = (REPO_ROOT / "params.yaml").read_text(encoding="utf-8")
    for old, new in (("    method: dirichlet ", "    method: client_dirichlet "),
                     ("  partitions: [a1.0]", "  partitions: [a0.1]")):
        assert old in text
        text = text.replace(old, new, 1)
    path = tmp_path / "params.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_config_accepts_client_dirichlet():
    config = config_from_dict({"partition": {"method": "client_dirichlet", "alpha": 0.1}})

    assert (config.partition.method, config.partition.alpha) == ("client_dirichlet", 0.1)
    assert partition_description(config.partition) == "client_dirichlet(0.1)"


def test_a_params_file_with_client_dirichlet_and_tag_a01_passes_check(tmp_path, capsys):
    from flows.cli import check
    from flows.tracking.names import setting

    path = client_dirichlet_params(tmp_path)
    params = load_params(path)

    partition = params.partition_config("a0.1")
    assert (partition.method, partition.alpha) == ("client_dirichlet", 0.1)
    assert {cell[2] for cell in params.grid.cells()} == {"a0.1"}
    assert check(argparse.Namespace(params=[str(path)], dvc_yaml=str(REPO_ROOT / "dvc.yaml"))) == 0
    assert f"{path}: ok, " in capsys.readouterr().out
    config = config_from_dict({"partition": {"method": "client_dirichlet", "alpha": 0.1}})
    assert "client-Dir α=0.1" in setting(config)


def test_the_partition_stage_writes_counts_and_heat_map(tmp_path, monkeypatch):
    from flows.pipeline import stages

    labels = np.random.default_rng(0).integers(0, 10, size=600)
    params = load_params(client_dirichlet_params(tmp_path))
    monkeypatch.setattr(stages, "experiment_train_labels", lambda *arguments: labels)
    monkeypatch.chdir(tmp_path)

    stages.partition(argparse.Namespace(dataset="fmnist", partition="a0.1", clients=10, seed=0), params)

    out = tmp_path / "data" / "partitions" / "fmnist-a0.1-k10-s0"
    written = json.loads((out / "class_counts.json").read_text(encoding="utf-8"))
    assert (written["params"]["method"], written["params"]["alpha"]) == ("client_dirichlet", 0.1)
    assert written["sizes"] == [60] * 10
    assert np.array(written["class_counts"]).sum(axis=0).tolist() == np.bincount(labels, minlength=10).tolist()
    assert (out / "heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
