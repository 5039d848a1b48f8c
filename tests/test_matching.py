"""Tests of fedcme_core.server.matching: MakeMatching, random pairing, many-to-one, the similarity table."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcme_core.server.matching import (
    cosine_similarity,
    counterparts,
    many_to_one_round,
    matching_similarity,
    match_round,
    pair_clients,
    random_pairs,
)



def vec(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float64)


# Worked example (4 clients, 4 classes):
#   eps_1 = [0,1,1,1], eps_2 = [1,0,0,1], eps_3 = [1,1,1,1], eps_4 = [0,1,0,1]
#   eps_g = [0.5, 0.75, 0.5, 1], |eps_g| = sqrt(2.0625) ~ 1.4361
#   cos(eps_1, eps_g) = 2.25 / (sqrt3 * 1.4361) ~ 0.905
#   cos(eps_2, eps_g) = 1.50 / (sqrt2 * 1.4361) ~ 0.739
#   cos(eps_3, eps_g) = 2.75 / (2     * 1.4361) ~ 0.957
#   cos(eps_4, eps_g) = 1.75 / (sqrt2 * 1.4361) ~ 0.862
#   order ascending: 2, 4, 1, 3.
#   k = 2: cos(2,4) = 1/2 = 0.5, cos(2,1) = 1/sqrt6 ~ 0.408, cos(2,3) = 2/(2 sqrt2) ~ 0.707
#          -> j = 1, pair (2, 1); remaining [4, 3] -> pair (4, 3).
WORKED_EXAMPLE = {
    1: vec(0, 1, 1, 1),
    2: vec(1, 0, 0, 1),
    3: vec(1, 1, 1, 1),
    4: vec(0, 1, 0, 1),
}


def test_cosine_similarity_values() -> None:
    assert cosine_similarity(vec(1, 0), vec(0, 1)) == 0.0
    assert cosine_similarity(vec(1, 1), vec(2, 2)) == pytest.approx(1.0)
    assert cosine_similarity(vec(1, 0), vec(1, 1)) == pytest.approx(1 / math.sqrt(2))
    assert cosine_similarity(vec(0, 0), vec(1, 1)) == 0.0
    assert cosine_similarity(vec(1, 1), vec(0, 0)) == 0.0


def test_pair_clients_worked_example() -> None:
    # Prepare
    vectors = WORKED_EXAMPLE

    # Execute
    pairs = pair_clients(vectors)

    # Assert
    assert pairs == [(2, 1), (4, 3)]


def test_pair_clients_does_not_depend_on_mapping_order() -> None:
    # Prepare
    reversed_vectors = dict(reversed(list(WORKED_EXAMPLE.items())))

    # Execute / Assert
    assert pair_clients(reversed_vectors) == [(2, 1), (4, 3)]


def test_pair_clients_ties_broken_by_lower_id() -> None:
    # Prepare: eps_g = [0.5, 0.5, 0.5]; cos to eps_g: 1, 4 -> 0.577 and 2, 3 -> 0.816,
    # so the order is 1, 4, 2, 3 (1 before 4 and 2 before 3 by id).
    # k = 1: cos(1,4) = 0, cos(1,2) = 0.707, cos(1,3) = 0 -> tie of 3 and 4 -> j = 3.
    # remaining [4, 2] -> (4, 2).
    vectors = {1: vec(1, 0, 0), 2: vec(1, 1, 0), 3: vec(0, 1, 1), 4: vec(0, 0, 1)}

    # Execute
    pairs = pair_clients(vectors)

    # Assert
    assert pairs == [(1, 3), (4, 2)]


def test_pair_clients_zero_vector_and_odd_leftover() -> None:
    # Prepare: eps_g = [1/3, 1/3]; cos to eps_g: 1 -> 0.707, 2 -> 0.707, 3 (zero) -> 0.
    # Order 3, 1, 2; k = 3 has cos 0 with everyone -> j = 1 (lower id); 2 is left over.
    vectors = {1: vec(1, 0), 2: vec(0, 1), 3: vec(0, 0)}

    # Execute
    pairs = pair_clients(vectors)

    # Assert
    assert pairs == [(3, 1)]


def test_pair_clients_all_zero_vectors_pair_by_id() -> None:
    # Prepare: every cosine is 0, so every tie goes to the lower id.
    vectors = {client: vec(0, 0, 0) for client in (5, 2, 9, 7)}

    # Execute / Assert
    assert pair_clients(vectors) == [(2, 5), (7, 9)]


def test_pair_clients_trivial_inputs() -> None:
    assert pair_clients({}) == []
    assert pair_clients({4: vec(1, 0)}) == []


@settings(max_examples=50, deadline=None)
@given(
    st.dictionaries(
        st.integers(0, 100),
        st.lists(st.floats(0, 1), min_size=3, max_size=3),
        max_size=12,
    )
)
def test_pair_clients_pairs_are_disjoint_and_cover_all_but_one(
    vectors: dict[int, list[float]],
) -> None:
    # Prepare
    arrays = {client: np.array(values) for client, values in vectors.items()}

    # Execute
    pairs = pair_clients(arrays)

    # Assert
    matched = [client for pair in pairs for client in pair]
    assert len(matched) == len(set(matched))
    assert set(matched) <= set(vectors)
    assert len(vectors) - len(matched) == len(vectors) % 2


def test_random_pairs_deterministic_and_order_free() -> None:
    # Prepare
    clients = [11, 3, 7, 25, 0, 14]

    # Execute
    first = random_pairs(clients, seed=1, round_index=0)
    again = random_pairs(list(reversed(clients)), seed=1, round_index=0)

    # Assert
    assert first == again
    assert sorted(client for pair in first for client in pair) == sorted(clients)


def test_random_pairs_differs_for_some_round() -> None:
    # Prepare
    clients = list(range(8))
    round_0 = {frozenset(pair) for pair in random_pairs(clients, seed=1, round_index=0)}

    # Execute
    later = [
        {frozenset(pair) for pair in random_pairs(clients, seed=1, round_index=t)}
        for t in range(1, 10)
    ]

    # Assert
    assert any(pairing != round_0 for pairing in later)


def test_random_pairs_odd_leftover_dropped() -> None:
    # Prepare / Execute
    pairs = random_pairs([1, 2, 3, 4, 5], seed=0, round_index=2)

    # Assert
    matched = [client for pair in pairs for client in pair]
    assert len(pairs) == 2
    assert len(set(matched)) == 4


def test_match_round_odd_total_leaves_exactly_one_unmatched() -> None:
    # Prepare: S = {1, 2, 3} (odd), U = {4, 5, 6, 7}.
    table = {1: vec(1, 0), 2: vec(0, 1), 3: vec(1, 1), 99: vec(1, 0)}
    selected = [7, 1, 4, 2, 6, 3, 5]

    # Execute
    pairs = match_round(selected, table, seed=0, round_index=3)

    # Assert
    matched = [client for pair in pairs for client in pair]
    assert len(pairs) == 3
    assert len(set(matched)) == 6
    assert set(matched) <= set(selected)
    assert pairs[0] == pair_clients({k: table[k] for k in (1, 2, 3)})[0]
    assert len(set(selected) - set(matched)) == 1


def test_match_round_without_vectors_is_random_pairing() -> None:
    # Prepare: round 0, nobody has a vector.
    selected = [4, 8, 15, 16, 23, 42]

    # Execute
    pairs = match_round(selected, {}, seed=5, round_index=0)
    again = match_round(list(reversed(selected)), {}, seed=5, round_index=0)

    # Assert
    assert pairs == again == random_pairs(selected, 5, 0)


def test_match_round_even_s_uses_pair_clients_first() -> None:
    # Prepare
    selected = [1, 2, 3, 4, 10, 11]

    # Execute
    pairs = match_round(selected, WORKED_EXAMPLE, seed=0, round_index=1)

    # Assert
    assert pairs[:2] == [(2, 1), (4, 3)]
    assert {frozenset(pair) for pair in pairs[2:]} == {frozenset((10, 11))}


def test_many_to_one_donor_serves_two_and_one_serves_none() -> None:
    # Prepare: cos(1,2) = 0, cos(1,3) = cos(2,3) = 1/sqrt2.
    # donor(1) = 2, donor(2) = 1, donor(3) = tie of 1 and 2 -> 1.
    # So 1 serves {2, 3}, 2 serves {1}, 3 serves nobody. 7 and 8 have no vector.
    table = {1: vec(1, 0), 2: vec(0, 1), 3: vec(1, 1)}
    selected = [1, 2, 3, 7, 8]

    # Execute
    donors = many_to_one_round(selected, table, seed=0, round_index=1)

    # Assert
    assert donors == {1: 2, 2: 1, 3: 1, 7: 8, 8: 7}


def test_many_to_one_lone_client_with_vector_joins_random_pairing() -> None:
    # Prepare
    table = {1: vec(1, 0)}

    # Execute
    donors = many_to_one_round([1, 5], table, seed=0, round_index=0)

    # Assert
    assert donors == {1: 5, 5: 1}


def test_counterparts_symmetric() -> None:
    # Prepare / Execute
    mapping = counterparts([(2, 1), (4, 3)])

    # Assert
    assert mapping == {2: 1, 1: 2, 4: 3, 3: 4}
    assert all(mapping[mapping[client]] == client for client in mapping)


def test_counterparts_rejects_client_in_two_pairs() -> None:
    with pytest.raises(ValueError):
        counterparts([(1, 2), (2, 3)])


def test_matching_similarity_replays_the_servers_table_by_hand():
    history = [
        {"round": 0, "selected": [0, 1, 2, 3], "pairs": [[0, 1], [2, 3]],
         "evaluation_vectors": {"0": [1, 0], "1": [0, 1], "2": [1, 1], "3": [1, 0]}},
        {"round": 1, "selected": [0, 1, 2, 3], "pairs": [[0, 1], [2, 3]], "evaluation_vectors": {"0": [0, 1]}},
        {"round": 2, "selected": [0, 3, 4], "pairs": [[0, 4]], "evaluation_vectors": {}},
    ]

    rounds = matching_similarity(history)

    # Round 1 scores with round 0's uploads: cos(0,1) = 0, cos(2,3) = 1/sqrt 2; all six pairs sum to 3/sqrt 2 + 1.
    assert rounds[0] == {"round": 1, "pairs": [], "matched_cosine": None, "random_cosine": None}
    assert rounds[1]["pairs"] == [[0, 1], [2, 3]]
    assert rounds[1]["matched_cosine"] == pytest.approx(0.5 / np.sqrt(2))
    assert rounds[1]["random_cosine"] == pytest.approx((3 / np.sqrt(2) + 1) / 6)
    # Round 2: client 4 has no vector (its pair was random); 0 now holds [0, 1], so cos(0, 3) = 0.
    assert rounds[2] == {"round": 3, "pairs": [], "matched_cosine": None, "random_cosine": 0.0}
    # The same records with FedCME's keys in the record's algorithm section (the form written now;
    # the one above is the form of the records written before it).
    sectioned = [{"round": record["round"], "selected": record["selected"],
                  "algorithm": {key: record[key] for key in ("pairs", "evaluation_vectors")}} for record in history]
    assert matching_similarity(sectioned) == rounds
