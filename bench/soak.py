"""Memory soak: many FedCME rounds through the real Prefect flow and MLflow store, with this
process's resident memory (VmRSS) sampled every round. Reports RSS after the warm-up rounds
and at the end, and the growth per round after warm-up (the long form of tests/test_soak.py).

    .venv/bin/python bench/soak.py [--rounds 200] [--quick]
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

WARMUP_ROUNDS = 10


def resident_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--rounds", type=int, default=200)
    arguments = parser.parse_args()
    rounds = 20 if arguments.quick else arguments.rounds
    common.quiet_environment()
    from prefect.testing.utilities import prefect_test_harness

    from fedcme_core.config import load_config
    from fedcme_core.rounds import completed_rounds
    from flows.orchestration.train import run_training

    scratch = Path(tempfile.mkdtemp(prefix="fedcme-bench-soak-"))
    run_dir = scratch / "runs" / "soak"
    by_round: dict[int, float] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            finished = completed_rounds(run_dir) if (run_dir / "server").exists() else 0
            by_round[finished] = max(by_round.get(finished, 0.0), resident_mib())

    overrides = {
        "federation.rounds": rounds, "federation.num_clients": 4, "federation.clients_per_round": 2,
        "data.synthetic.num_train": 160, "data.synthetic.num_test": 40, "partition.min_size": 20,
        "runner.workers": 2,
    }
    sampler = threading.Thread(target=sample, daemon=True)
    started = time.perf_counter()
    with prefect_test_harness(server_startup_timeout=180):
        sampler.start()
        try:
            run_training(load_config(common.REPO_ROOT / "configs" / "smoke.yaml", overrides=overrides), "soak",
                         runs_dir=str(scratch / "runs"), tracking_uri=f"sqlite:///{scratch / 'mlflow.db'}")
        finally:
            done.set()
            sampler.join()
    warm = max(rss for finished, rss in by_round.items() if WARMUP_ROUNDS <= finished <= WARMUP_ROUNDS + 2)
    end = max(rss for finished, rss in by_round.items() if finished >= rounds - 2)
    checkpoints = {str(r): round(by_round[r], 1) for r in sorted(by_round) if r % max(1, rounds // 10) == 0}
    common.emit("soak", {
        "rounds": rounds, "clients_per_round": 2, "algorithm": "fedcme", "runner": "threads x2",
        "rss_mib_after_warmup": round(warm, 1), "rss_mib_at_end": round(end, 1),
        "growth_mib": round(end - warm, 1),
        "growth_kib_per_round": round(1024 * (end - warm) / max(1, rounds - WARMUP_ROUNDS), 1),
        "rss_mib_by_round": checkpoints, "wall_seconds": round(time.perf_counter() - started, 1),
    }, arguments.results, quick=arguments.quick)
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
