"""Client matching by evaluation vectors (FedCME's MakeMatching) and its evaluation set.

Nie et al., "FedCME", arXiv:2307.08574, Algorithm 1, line 8 (SPEC steps 2 and 7):
eps_g = mean_S eps_k; repeat: k = argmin_k cos(eps_k, eps_g), j = argmin_j cos(eps_k, eps_j).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn

from fedcme_core.client.evaluation import evaluate
from fedcme_core.common.seeding import numpy_rng

Pair = tuple[int, int]


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> float:
    """cos(a, b); 0.0 when either vector is all zeros (SPEC step 2 choice)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"vectors have different shapes {a.shape} and {b.shape}")
    norm_a = float(np.linalg.norm(a))
    norm_b = float(np.linalg.norm(b))
    if norm_a == 0.0 or norm_b == 0.0:
        return 0.0
    return float(np.dot(a, b) / (norm_a * norm_b))


def pair_clients(vectors: Mapping[int, np.ndarray]) -> list[Pair]:
    """Algorithm 1, line 8: MakeMatching over clients that all have an evaluation vector.

    Clients are sorted by cos(eps_k, eps_g) ascending (ties: lower id); the first, k, is
    paired with the remaining j of smallest cos(eps_k, eps_j) (ties: lower id) until
    fewer than two remain. Pairs come in the order formed, (k, j); an odd leftover is
    not returned.
    """
    if not vectors:
        return []
    clients = sorted(int(client) for client in vectors)
    eps = {client: np.asarray(vectors[client], dtype=np.float64) for client in clients}
    global_vector = np.mean([eps[client] for client in clients], axis=0)
    remaining = sorted(
        clients, key=lambda client: (cosine_similarity(eps[client], global_vector), client)
    )
    pairs: list[Pair] = []
    while len(remaining) >= 2:
        first = remaining.pop(0)
        counterpart = min(
            remaining, key=lambda other: (cosine_similarity(eps[first], eps[other]), other)
        )
        remaining.remove(counterpart)
        pairs.append((first, counterpart))
    return pairs


def random_pairs(clients: Sequence[int], seed: int, round_index: int) -> list[Pair]:
    """SPEC step 2 choice: pair clients without a vector at random, seeded by (seed, t).

    The clients are sorted before shuffling, so their input order does not matter; an
    odd leftover is dropped.
    """
    ordered = _sorted_unique(clients)
    rng = numpy_rng(seed, "match", round_index)
    shuffled = [ordered[position] for position in rng.permutation(len(ordered))]
    return [(shuffled[i], shuffled[i + 1]) for i in range(0, len(shuffled) - 1, 2)]


def match_round(
    selected: Sequence[int],
    table: Mapping[int, np.ndarray],
    *,
    seed: int,
    round_index: int,
) -> list[Pair]:
    """SPEC step 2: match the selected clients of round `round_index`.

    Clients with a vector in `table` (S) are paired by `pair_clients`; the rest (U), plus
    S's leftover, are paired at random. With an odd total one client stays unmatched.
    """
    clients = _sorted_unique(selected)
    with_vector = [client for client in clients if client in table]
    pairs = pair_clients({client: table[client] for client in with_vector})
    matched = {client for pair in pairs for client in pair}
    without_vector = [client for client in clients if client not in matched]
    return pairs + random_pairs(without_vector, seed, round_index)


def many_to_one_round(
    selected: Sequence[int],
    table: Mapping[int, np.ndarray],
    *,
    seed: int,
    round_index: int,
) -> dict[int, int]:
    """SPEC step 2 ablation `many_to_one`: receiver -> donor of the classifier.

    Each client k of S (when |S| >= 2) receives from argmin_{j in S, j != k} cos(eps_k,
    eps_j) (ties: lower id), so one donor may serve several receivers and some none.
    Clients of U (and a lone client of S) are paired at random and swap both ways.
    """
    clients = _sorted_unique(selected)
    with_vector = [client for client in clients if client in table]
    donors: dict[int, int] = {}
    if len(with_vector) >= 2:
        eps = {client: np.asarray(table[client], dtype=np.float64) for client in with_vector}
        for receiver in with_vector:
            donors[receiver] = min(
                (other for other in with_vector if other != receiver),
                key=lambda other: (cosine_similarity(eps[receiver], eps[other]), other),
            )
    unassigned = [client for client in clients if client not in donors]
    donors.update(counterparts(random_pairs(unassigned, seed, round_index)))
    return donors


def counterparts(pairs: Sequence[Pair]) -> dict[int, int]:
    """Each matched client's counterpart, in both directions of every pair."""
    counterpart_of: dict[int, int] = {}
    for first, second in pairs:
        if first == second:
            raise ValueError(f"client {first} is paired with itself")
        for client in (first, second):
            if client in counterpart_of:
                raise ValueError(f"client {client} appears in more than one pair")
        counterpart_of[first] = second
        counterpart_of[second] = first
    return counterpart_of


def eval_subset(
    labels: np.ndarray,
    fraction: float,
    *,
    seed: int,
    round_index: int,
    client_id: int,
) -> np.ndarray:
    """SPEC step 7: positions of D_eval_k, a random subset of the client's data.

    Size round(fraction * n) (half rounded up), at least 1. One random sample of every
    present class is taken first, then the rest is filled at random; when the size is
    smaller than the number of present classes, that many classes are drawn at random
    and one sample taken from each. Sorted ascending, int64.
    """
    labels = np.asarray(labels)
    num_samples = len(labels)
    if num_samples == 0:
        raise ValueError("cannot draw an evaluation subset of an empty client")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    subset_size = max(1, min(num_samples, int(np.floor(fraction * num_samples + 0.5))))
    rng = numpy_rng(seed, "eval-subset", round_index, client_id)
    present_classes = np.unique(labels)
    if subset_size < len(present_classes):
        present_classes = rng.choice(present_classes, size=subset_size, replace=False)
    one_per_class = np.array(
        [rng.choice(np.flatnonzero(labels == label)) for label in present_classes],
        dtype=np.int64,
    )
    rest = np.setdiff1d(np.arange(num_samples, dtype=np.int64), one_per_class)
    fill = rng.choice(rest, size=subset_size - len(one_per_class), replace=False)
    return np.sort(np.concatenate([one_per_class, fill.astype(np.int64)]))


def evaluation_vector(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    batch_size: int | None = None,
) -> np.ndarray:
    """SPEC step 7 (Eq. 4): per-class accuracy [C] float64 of the model; 0 for absent classes."""
    result = evaluate(model, x, y, num_classes, batch_size=batch_size)
    return result.per_class_accuracy.astype(np.float64)


def _sorted_unique(clients: Sequence[int]) -> list[int]:
    ordered = sorted(int(client) for client in clients)
    if len(set(ordered)) != len(ordered):
        raise ValueError(f"client ids must be distinct, got {ordered}")
    return ordered


def matching_similarity(history: Sequence[Mapping]) -> list[dict]:
    """What the matching did each round, replayed from a run's history (SPEC step 2).

    The server's table starts empty and takes each round's uploaded ``evaluation_vectors`` (in the
    record's algorithm section) after that round, so round r's pairs are scored with the vectors
    the server held when it matched them. Per round (1-based ``round``): ``pairs`` (those whose two clients both had a
    vector, so the similarity chose them), ``matched_cosine`` (their mean cos) and
    ``random_cosine`` (the mean cos over every pair of selected clients with a vector: what a
    random pairing gives on average); the cosines are None when there is nothing to score.
    """
    table: dict[int, np.ndarray] = {}
    rounds = []
    for record in sorted(history, key=lambda record: int(record["round"])):
        # The algorithm's section of the record (``fedcme_core.results.records.algorithm_section``);
        # a record written before the section existed holds FedCME's keys at its top level.
        section = record.get("algorithm", record)
        scored = [int(client) for client in record.get("selected", []) if int(client) in table]
        pairs = [[int(a), int(b)] for a, b in section.get("pairs", []) if int(a) in table and int(b) in table]
        everyone = [(a, b) for position, a in enumerate(scored) for b in scored[position + 1:]]
        rounds.append({
            "round": int(record["round"]) + 1,
            "pairs": pairs,
            "matched_cosine": _mean_cosine(table, pairs),
            "random_cosine": _mean_cosine(table, everyone),
        })
        for client, vector in (section.get("evaluation_vectors") or {}).items():
            table[int(client)] = np.asarray(vector, dtype=np.float64)
    return rounds


def _mean_cosine(table: Mapping[int, np.ndarray], pairs: Sequence[Sequence[int]]) -> float | None:
    if not pairs:
        return None
    return float(np.mean([cosine_similarity(table[a], table[b]) for a, b in pairs]))
