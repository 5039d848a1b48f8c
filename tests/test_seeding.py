"""Golden values of fedcme_core.common.seeding: every random choice of a run rests on them, so a change
to the derivation (or to the libraries' generators under it) shows here first."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcme_core.common.seeding import derive_seed, numpy_rng, torch_generator


@pytest.mark.parametrize(("seed", "tags", "expected"), [
    (0, (), 6375474603054492659),
    (0, ("select", 3), 1149984794682156612),
    (7, ("train", 2, 15), 8395379845122499117),
    (1, ("subset",), 4236857224610314930),
])
def test_derive_seed_golden_values(seed, tags, expected):
    assert derive_seed(seed, *tags) == expected


def test_derived_seeds_are_63_bit_and_depend_on_every_tag_and_its_order():
    seeds = {derive_seed(0, "train", round_index, client) for round_index in range(5) for client in range(5)}

    assert len(seeds) == 25 and all(0 <= seed < 2**63 for seed in seeds)
    assert derive_seed(0, 1, 2) != derive_seed(0, 2, 1)
    assert derive_seed(0, "select") == derive_seed(np.int64(0), "select")


def test_generators_golden_draws():
    assert numpy_rng(0, "match", 1).permutation(6).tolist() == [4, 1, 2, 5, 3, 0]
    assert numpy_rng(3, "eval-subset", 0, 2).random(2).tolist() == [0.24334405782743218, 0.8548597970632488]
    assert torch.randperm(6, generator=torch_generator(0, "train", 0, 1)).tolist() == [3, 1, 5, 0, 2, 4]


@pytest.mark.parametrize("tag", [-1, 1.5, True, None])
def test_bad_tags_are_refused(tag):
    with pytest.raises((TypeError, ValueError)):
        derive_seed(0, tag)
