"""The paper's open readings as options (SPEC.md, "Open readings"), each on a tiny hand-computed
input: the per-sample alignment loss, class-count weights for the global features, the partner's
momentum at the exchange, a two-layer classifier, and NIID-Bench's #C=k partition."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcme_core.common.checkpoints import load_checkpoint
from fedcme_core.config.schema import ConfigError, config_from_dict
from fedcme_core.server.exchange import exchange_checkpoints, receive_optimizer_state
from fedcme_core.client.features import GlobalFeatures, aggregate_global_features, alignment_loss
from fedcme_core.client.models import build_model, classifier_keys, parameter_split
from fedcme_core.data.partition import PartitionError, class_counts, client_label_sets, labels_per_client_partition
from fedcme_core.rounds import final_model, load_server_state, run_experiment, run_partition
from fedcme_core.common.seeding import numpy_rng
from fedcme_core.client.training import start_local_run

from .helpers import TRAINING, phase_one_checkpoints, tiny_client_data, train


# ------------------------------------------------------------------ align_loss: sample
def batch_and_zeta() -> tuple[torch.Tensor, torch.Tensor, GlobalFeatures]:
    features = torch.tensor([[1.0, 2.0], [3.0, 4.0], [0.0, 0.0], [9.0, 9.0]], requires_grad=True)  # [B=4, d=2]
    labels = torch.tensor([0, 0, 1, 2])
    zeta = GlobalFeatures(values=torch.tensor([[1.0, 1.0], [2.0, 0.0], [0.0, 0.0]]),
                          defined=torch.tensor([True, True, False]))
    return features, labels, zeta


def test_sample_alignment_loss_by_hand():
    features, labels, zeta = batch_and_zeta()
    # Samples of defined classes: 0, 1 (class 0, zeta [1, 1]) and 2 (class 1, zeta [2, 0]); sample 3's class
    # has no zeta. Squared differences: [0, 1], [4, 9], [4, 0]; per sample sums 1, 13, 4; means 0.5, 6.5, 2.
    mean_form = alignment_loss(features, labels, zeta, reduction="mean", loss="sample")
    sum_form = alignment_loss(features, labels, zeta, reduction="sum_dims", loss="sample")
    sum_all_form = alignment_loss(features, labels, zeta, reduction="sum_all", loss="sample")

    assert mean_form.item() == pytest.approx((0.5 + 6.5 + 2.0) / 3)
    assert sum_form.item() == pytest.approx((1 + 13 + 4) / 3)
    assert sum_all_form.item() == pytest.approx(1 + 13 + 4)
    sum_form.backward()
    assert torch.equal(features.grad[3], torch.zeros(2))  # no global feature, no pull
    assert features.grad[0].tolist() == pytest.approx([0.0, 2 * 1 / 3])


def test_sample_reading_also_penalises_the_spread_within_a_class():
    features, labels, zeta = batch_and_zeta()
    # Class 0's batch mean [2, 3] against [1, 1]: the class-mean reading sees (1 + 4) and (4 + 0) over 2 classes.
    class_mean = alignment_loss(features, labels, zeta, reduction="sum_dims", loss="class_mean")
    sample = alignment_loss(features, labels, zeta, reduction="sum_dims", loss="sample")

    assert class_mean.item() == pytest.approx(9.0 / 2)
    assert sample.item() == pytest.approx(6.0)
    same_features = torch.tensor([[2.0, 3.0], [2.0, 3.0], [0.0, 0.0]])
    # Without spread, each class's samples weigh by their count: (5 + 5 + 4) / 3 samples.
    assert alignment_loss(same_features, labels[:3], zeta, reduction="sum_dims", loss="sample").item() == pytest.approx(14 / 3)


def test_the_old_reduction_name_is_refused_in_one_line_naming_both_new_ones():
    with pytest.raises(ConfigError) as raised:
        config_from_dict({"algorithm": {"name": "fedcme", "align_reduction": "sum"}}, source="x.yaml")
    message = str(raised.value)
    assert "\n" not in message and "align_reduction" in message and "'sum_dims'" in message and "'sum_all'" in message


def test_sample_alignment_loss_none_without_a_defined_class():
    features, labels, zeta = batch_and_zeta()
    assert alignment_loss(features[3:], labels[3:], zeta, loss="sample") is None
    with pytest.raises(ValueError, match="align_loss"):
        alignment_loss(features, labels, zeta, loss="median")


# ------------------------------------------------------------ feature_weights: class_counts
def test_class_count_weights_by_hand():
    # Client a: 300 samples, 1 of class 0 at [10, 0], 299 of class 1. Client b: 100 samples, 100 of class 0 at [0, 0].
    a = (torch.tensor([[10.0, 0.0], [1.0, 1.0], [0.0, 0.0]]), torch.tensor([1, 299, 0]), 300.0)
    b = (torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]), torch.tensor([100, 0, 0]), 100.0)
    previous = GlobalFeatures(values=torch.tensor([[5.0, 5.0], [3.0, 3.0], [7.0, 7.0]]),
                              defined=torch.tensor([True, True, True]))

    by_samples = aggregate_global_features([a, b], previous, weights="samples")
    by_counts = aggregate_global_features([a, b], previous, weights="class_counts")

    # D_k: class 0 = (300 [10, 0] + 100 [0, 0]) / 400; class 1 = (300 [1, 1] + 100 [3, 3] memory) / 400.
    assert by_samples.values[0].tolist() == pytest.approx([7.5, 0.0])
    assert by_samples.values[1].tolist() == pytest.approx([1.5, 1.5])
    # n_k[c]: class 0 = (1 [10, 0] + 100 [0, 0]) / 101; class 1 only a's; class 2 held by nobody keeps its memory.
    assert by_counts.values[0].tolist() == pytest.approx([10 / 101, 0.0])
    assert by_counts.values[1].tolist() == pytest.approx([1.0, 1.0])
    assert by_counts.values[2].tolist() == [7.0, 7.0] and bool(by_counts.defined.all())


def test_class_count_weights_leave_an_unheld_class_without_memory_undefined():
    upload = (torch.tensor([[1.0], [0.0]]), torch.tensor([4, 0]), 4.0)
    features = aggregate_global_features([upload], None, weights="class_counts")
    assert features.defined.tolist() == [True, False] and features.values[1].item() == 0.0
    with pytest.raises(ValueError, match="feature weights"):
        aggregate_global_features([upload], None, weights="uniform")


# ------------------------------------------------------------- exchange_optimizer: swap
def sgd_state(momenta: dict[int, float]) -> dict:
    return {"state": {index: {"momentum_buffer": torch.tensor([value])} for index, value in momenta.items()},
            "param_groups": [{"lr": 0.01, "params": [0, 1, 2]}]}


def test_received_momentum_reset_or_swapped_by_hand():
    names = ["backbone.0.weight", "classifier.weight", "classifier.bias"]
    receiver, donor = sgd_state({0: 1.0, 1: 2.0, 2: 3.0}), sgd_state({0: -1.0, 1: -2.0, 2: -3.0})
    received = {"classifier.weight", "classifier.bias"}

    reset = receive_optimizer_state(receiver, donor, names, received, "reset")
    swapped = receive_optimizer_state(receiver, donor, names, received, "swap")

    assert {index: value["momentum_buffer"].item() for index, value in reset["state"].items()} == {0: 1.0}
    assert {index: value["momentum_buffer"].item() for index, value in swapped["state"].items()} == {
        0: 1.0, 1: -2.0, 2: -3.0}
    assert swapped["param_groups"] == receiver["param_groups"]
    with pytest.raises(ValueError, match="exchange_optimizer"):
        receive_optimizer_state(receiver, donor, names, received, "average")


def test_checkpoint_exchange_with_swap_receives_the_partners_momentum(tmp_path):
    swap, destinations = phase_one_checkpoints(tmp_path)

    exchange_checkpoints(swap, {0: 1, 1: 0}, "classifier", destinations, optimizer="swap")

    before = {client: load_checkpoint(path) for client, path in swap.items()}
    after = load_checkpoint(destinations[0])
    names = before[0]["parameter_names"]
    for index, name in enumerate(names):
        source = before[1] if name.startswith("classifier.") else before[0]
        assert torch.equal(after["optimizer"]["state"][index]["momentum_buffer"],
                           source["optimizer"]["state"][index]["momentum_buffer"])


# ------------------------------------------------------------- model.classifier_layers: 2
@pytest.mark.parametrize("name, shape, expected", [
    # cifar_cnn: phi = 120 -> 84 -> 10: 120*84 + 84 + 84*10 + 10 = 11,014 of 62,006.
    ("cifar_cnn", (3, 32, 32), (50_992, 11_014, 120)),
    # fmnist_cnn: phi = 1024 -> 512 -> 10: 1024*512 + 512 + 512*10 + 10 = 529,930.
    ("fmnist_cnn", (1, 28, 28), (52_096, 529_930, 1024)),
])
def test_two_layer_classifier_moves_the_split_not_the_function(name, shape, expected):
    one, two = build_model(name, seed=3), build_model(name, seed=3, classifier_layers=2)
    inputs = torch.randn(4, *shape, generator=torch.Generator().manual_seed(0))

    assert (*parameter_split(two), two.feature_dim) == expected
    assert sum(parameter_split(one)) == sum(parameter_split(two))
    assert torch.equal(one(inputs), two(inputs))
    assert two.features(inputs).shape == (4, expected[2])
    assert classifier_keys(two.state_dict()) == ["classifier.0.weight", "classifier.0.bias",
                                                 "classifier.2.weight", "classifier.2.bias"]


def test_fedavg_trains_alike_with_one_or_two_classifier_layers():
    # The degeneracy: the split only says what FedCME exchanges and aligns; FedAvg's training is the same.
    runs = [start_local_run(build_model("fmnist_cnn", seed=0, classifier_layers=layers), TRAINING,
                            torch.Generator().manual_seed(5)) for layers in (1, 2)]
    one, two = (train(run, tiny_client_data(), epochs=1).model for run in runs)
    flat = [torch.cat([p.detach().flatten() for p in model.parameters()]) for model in (one, two)]
    assert torch.equal(*flat)


# --------------------------------------------------- partition.method: labels_per_client
def test_labels_per_client_partition_by_hand():
    labels = np.repeat(np.arange(4), 6)  # 4 classes x 6 samples
    parts = labels_per_client_partition(labels, num_clients=4, labels_per_client=2, seed=0, min_size=1)
    counts = class_counts(labels, parts, 4)

    assert ((counts > 0).sum(axis=1) == 2).all()  # exactly k labels each
    assert [counts[client, client % 4] > 0 for client in range(4)] == [True] * 4  # client i holds label i mod C
    assert sorted(np.concatenate(parts).tolist()) == list(range(24))  # every sample once
    for label in range(4):  # each label split evenly among its holders
        held = counts[:, label][counts[:, label] > 0]
        assert held.max() - held.min() <= 1 and held.sum() == 6
    again = labels_per_client_partition(labels, num_clients=4, labels_per_client=2, seed=0, min_size=1)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))


def test_labels_per_client_with_k_equal_classes_gives_every_client_every_label():
    labels = np.repeat(np.arange(3), 9)
    counts = class_counts(labels, labels_per_client_partition(labels, 3, 3, seed=1, min_size=1), 3)
    assert counts.tolist() == [[3, 3, 3]] * 3


def test_fewer_clients_than_classes_still_cover_every_label():
    label_sets = client_label_sets(num_clients=3, num_classes=5, labels_per_client=2, rng=numpy_rng(0, "partition"))
    assert sorted(set(np.concatenate(label_sets).tolist())) == [0, 1, 2, 3, 4]
    with pytest.raises(PartitionError, match="cannot cover"):
        client_label_sets(num_clients=2, num_classes=5, labels_per_client=2, rng=numpy_rng(0, "partition"))
    with pytest.raises(PartitionError, match="labels_per_client=6"):
        client_label_sets(num_clients=9, num_classes=5, labels_per_client=6, rng=numpy_rng(0, "partition"))


# ------------------------------------------------------------------ config: one line each
@pytest.mark.parametrize("values, expected", [
    ({"algorithm": {"name": "fedavg", "align_loss": "sample"}},
     "algorithm.align_loss: not an option of fedavg (it is read by fedcme only)"),
    ({"algorithm": {"name": "fedcme", "mu": 0.0, "feature_weights": "class_counts"}},
     "algorithm.feature_weights: 'class_counts' has no effect with mu = 0 (no alignment); leave it at 'samples'"),
    ({"algorithm": {"name": "fedcme", "exchange": "none", "exchange_optimizer": "swap"}},
     "algorithm.exchange_optimizer: 'swap' has no effect with exchange none; leave it at 'reset'"),
    ({"partition": {"method": "labels_per_client"}},
     "partition.labels_per_client: missing; method labels_per_client needs k, the labels each client holds"),
    ({"partition": {"alpha": 0.5, "labels_per_client": 2}},
     "partition.labels_per_client: has no effect with method dirichlet; it is read by method labels_per_client only"),
    ({"partition": {"method": "labels_per_client", "labels_per_client": 11}},
     "partition.labels_per_client: 11 exceeds the 10 classes of fmnist"),
    ({"federation": {"num_clients": 4, "clients_per_round": 4},
      "partition": {"method": "labels_per_client", "labels_per_client": 2}},
     "partition.labels_per_client: 4 clients x 2 labels cannot cover the 10 classes"),
    ({"model": {"classifier_layers": 3}}, "model.classifier_layers: Input should be 1 or 2"),
])
def test_a_meaningless_or_bad_reading_is_one_line(values, expected):
    with pytest.raises(ConfigError) as raised:
        config_from_dict(values, source="x.yaml")
    assert str(raised.value) == f"x.yaml: {expected}"


def test_the_readings_are_recorded_in_the_flat_config():
    config = config_from_dict({"model": {"classifier_layers": 2}, "algorithm": {
        "name": "fedcme", "align_loss": "sample", "align_reduction": "sum_dims", "exchange_optimizer": "swap",
        "feature_weights": "class_counts"}, "partition": {"method": "labels_per_client", "labels_per_client": 2}})
    flat = config.flat()
    assert {key: flat[key] for key in ("model.classifier_layers", "algorithm.align_loss", "algorithm.align_reduction",
                                       "algorithm.exchange_optimizer", "algorithm.feature_weights",
                                       "partition.method", "partition.labels_per_client")} == {
        "model.classifier_layers": 2, "algorithm.align_loss": "sample", "algorithm.align_reduction": "sum_dims",
        "algorithm.exchange_optimizer": "swap", "algorithm.feature_weights": "class_counts",
        "partition.method": "labels_per_client", "partition.labels_per_client": 2}


# ------------------------------------------------------------------ the readings in whole rounds
def test_fedcme_rounds_with_every_reading_on(tmp_path, synthetic_config):

    today = synthetic_config()
    readings = synthetic_config(
        {"model.classifier_layers": 2, "partition": {"method": "labels_per_client", "labels_per_client": 3,
                                                     "min_size": 10}},
        algorithm={"name": "fedcme", "mu": 0.1, "align_loss": "sample", "align_reduction": "sum_dims",
                   "exchange_optimizer": "swap", "feature_weights": "class_counts"})

    history = run_experiment(readings, tmp_path / "readings")
    run_experiment(today, tmp_path / "today")

    assert all(len(record["algorithm"]["pairs"]) == 2 for record in history)
    features = load_server_state(tmp_path / "readings", 2)["algorithm"]["global_features"]
    assert features["values"].shape == (10, final_model(readings, tmp_path / "readings").feature_dim)
    partition, counts = run_partition(readings, tmp_path / "readings")
    assert partition.params["labels_per_client"] == 3
    assert ((counts > 0).sum(axis=1) == 3).all()
    assert final_model(readings, tmp_path / "readings").state_dict().keys() != \
        final_model(today, tmp_path / "today").state_dict().keys()


def test_run_start_prints_the_split(synthetic_config):
    from fedcme_core.rounds import split_line

    assert split_line(synthetic_config()) == (
        "model fmnist_cnn: extractor 576,896 + classifier 5,130 parameters (1 layer), feature 512-d")
    assert split_line(synthetic_config({"model.classifier_layers": 2})) == (
        "model fmnist_cnn: extractor 52,096 + classifier 529,930 parameters (2 layers), feature 1024-d")
