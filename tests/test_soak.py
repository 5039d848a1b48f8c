"""Memory soak, quick form: many rounds through the real Prefect flow and MLflow store while
this process's resident memory is sampled; it must stay flat (no per-round objects, Prefect
results or MLflow buffers piling up). The long form is `bench/soak.py` (200 rounds)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from fedcme_core.config import load_config
from fedcme_core.rounds import completed_rounds
from flows.orchestration.train import run_training

from .conftest import REPO_ROOT

pytestmark = pytest.mark.slow  # 30 rounds through the session's Prefect server and an MLflow store

ROUNDS = 30
# Allowed growth of resident memory from rounds 10-15 to the last rounds (15 rounds later). Over
# 35 rounds (a 50-round form of this test) it grew 10-20 MB, nearly all of it allocator arenas of
# the worker threads (Python objects grow about 5 KB a round: Prefect's per-flow-run result
# links); one leaked fmnist_cnn copy per round would add 6.6 MB a round, about 100 MB here.
GROWTH_BOUND_MB = 40.0


def resident_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_resident_memory_stays_flat_over_many_rounds(tmp_path, prefect_server):
    run_dir = tmp_path / "runs" / "soak"
    samples: list[tuple[int, float]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.1):
            rounds = completed_rounds(run_dir) if (run_dir / "server").exists() else 0
            samples.append((rounds, resident_mb()))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    overrides = {
        "federation.rounds": ROUNDS, "federation.num_clients": 4, "federation.clients_per_round": 2,
        "data.synthetic.num_train": 160, "data.synthetic.num_test": 40, "partition.min_size": 20,
        "runner.workers": 2,
    }
    try:
        summary = run_training(load_config(REPO_ROOT / "configs" / "smoke.yaml", overrides=overrides), "soak",
                               runs_dir=str(tmp_path / "runs"), tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    finally:
        done.set()
        sampler.join()

    assert summary["rounds"] == ROUNDS
    warm = max(rss for rounds, rss in samples if 10 <= rounds < 15)
    late = max(rss for rounds, rss in samples if rounds >= ROUNDS - 5)
    print(f"soak: round 10-15 {warm:.1f} MB, last rounds {late:.1f} MB")
    assert late - warm < GROWTH_BOUND_MB, f"resident memory grew {late - warm:.1f} MB from round 10 to {ROUNDS}"
