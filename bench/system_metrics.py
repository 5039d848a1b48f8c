"""The cost of MLflow's system metrics on a training round: the flow with them off, on at the
default 10 s sampling interval, and on at 1 s (the worst case a config allows near), interleaved.

Each variant is a whole run of `--rounds` rounds through ``flows.orchestration.train.run_training`` (Prefect
tasks under a temporary Prefect server in a scratch PREFECT_HOME, MLflow into a scratch sqlite
store); round 0 is excluded. Reported: the median round_seconds of each variant and their ratios
to the run without system metrics, and the number of `system/...` metrics the runs logged.
Default: synthetic data (28x28, 1200 samples), K=8, M=4, E=2, 3 rounds, 2 repeats; quick: 2 rounds, 1 repeat.

    .venv/bin/python bench/system_metrics.py [--rounds 3] [--repeats 2] [--quick]
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import common

SCRATCH = Path(tempfile.mkdtemp(prefix="fedcme-bench-system-metrics-"))
atexit.register(shutil.rmtree, SCRATCH, ignore_errors=True)  # registered first: runs after Prefect's own exit hooks
os.environ["PREFECT_HOME"] = str(SCRATCH / "prefect-home")
os.environ.pop("PREFECT_API_URL", None)  # always a temporary server of our own
common.quiet_environment()

import torch  # noqa: E402

from fedcme_core.config.files import apply_overrides  # noqa: E402
from fedcme_core.config.schema import config_from_dict  # noqa: E402
from fedcme_core.rounds import completed_rounds, load_server_state  # noqa: E402

VARIANTS = {
    "off": {"tracking.system_metrics": False},
    "on_10s": {"tracking.system_metrics": True, "tracking.system_metrics_interval": 10.0},
    "on_1s": {"tracking.system_metrics": True, "tracking.system_metrics_interval": 1.0},
}


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--rounds", type=int, default=None, help="rounds per run (round 0 is excluded)")
    arguments = parser.parse_args()
    rounds, repeats = (arguments.rounds or 2, arguments.repeats or 1) if arguments.quick else (
        arguments.rounds or 3, arguments.repeats or 2)
    runner = {"kind": "threads", "workers": 2, "threads_per_worker": 1}
    values = common.experiment_values(
        data=common.data_section("synthetic", synthetic={"num_train": 1200, "num_test": 300}),
        clients=8, per_round=4, epochs=2, alpha=0.5, runner=runner,
    )
    values["federation"]["rounds"] = rounds
    config = config_from_dict(values)
    torch.set_num_threads(1)
    from mlflow.tracking import MlflowClient

    from flows.orchestration.train import run_training  # imports prefect (after PREFECT_HOME is set)

    runs_dir, uri = SCRATCH / "runs", f"sqlite:///{SCRATCH / 'mlflow.db'}"

    def run(name: str, overrides: dict, rounds_here: int = rounds) -> dict:
        run_config = config_from_dict(apply_overrides(values, {**overrides, "federation.rounds": rounds_here}))
        return run_training(run_config, name, runs_dir=str(runs_dir), tracking_uri=uri)

    run("warm-up", VARIANTS["off"], 1)  # imports, the temporary server, the compute calibration: untimed
    round_seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    call_seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    system_metrics: dict[str, list[int]] = {name: [] for name in VARIANTS}
    client = MlflowClient(tracking_uri=uri)
    for repeat in range(repeats):
        for variant, overrides in VARIANTS.items():
            name = f"{variant}-{repeat}"
            summary: dict = {}
            call_seconds[variant].append(common.timed(lambda: summary.update(run(name, overrides))))
            history = load_server_state(runs_dir / name, completed_rounds(runs_dir / name))["history"]
            round_seconds[variant] += [record["round_seconds"] for record in history[1:]]
            metrics = client.get_run(summary["mlflow_run_id"]).data.metrics
            system_metrics[variant].append(sum(key.startswith("system/") for key in metrics))

    medians = {variant: common.median(values) for variant, values in round_seconds.items()}
    record = {
        **common.describe(config),
        "runner": runner,
        "rounds_per_run": rounds,
        "rounds_measured": list(range(1, rounds)),
        "repeats": repeats,
        "round_seconds": common.rounded(medians, 3),
        "run_call_seconds": {variant: round(common.median(values), 3) for variant, values in call_seconds.items()},
        "system_metric_names_logged": {variant: max(values) for variant, values in system_metrics.items()},
        "ratio_on_10s_vs_off": common.ratio(medians["on_10s"], medians["off"]),
        "ratio_on_1s_vs_off": common.ratio(medians["on_1s"], medians["off"]),
        "target": "ratio_on_10s_vs_off <= 1.02",
    }
    common.emit("system_metrics", record, arguments.results, quick=arguments.quick)


if __name__ == "__main__":
    main()
