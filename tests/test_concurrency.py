"""Several commands at once on one machine: a run directory has one holder at a time (a kernel
lock that dies with it), the shared stores' first use is serialised, and a device the machine
lacks is one line. The slow test launches 4 experiments and a duplicate pair at the same moment
on a fresh PREFECT_HOME and a fresh MLflow store, as researchers do from two terminals."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient

from flows.cli import main

from .conftest import REPO_ROOT, SYNTHETIC
from .processes import kill_all, wait_until_none_left

# The session's Prefect server, processes holding a run directory, and commands launched at once.
pytestmark = pytest.mark.slow

ROUNDS = 2
HOLDER = """
import sys, time
from fedcme_core.rounds.lock import hold_run
with hold_run(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


def tiny_config(folder: Path) -> Path:
    """SYNTHETIC cut to 4 clients, 2 per round, `ROUNDS` rounds, on one worker thread."""
    values = {**SYNTHETIC, "federation": {"num_clients": 4, "clients_per_round": 2, "rounds": ROUNDS},
              "runner": {"workers": 1, "threads_per_worker": 1}}
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


@pytest.fixture
def holder():
    """Start a process that holds a run directory (returns it once it holds); killed at the end."""
    started: list[subprocess.Popen] = []

    def hold(run_dir: Path) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                                   text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        started.append(process)
        assert process.stdout.readline().strip() == "held"
        return process

    yield hold
    for process in started:
        process.kill()
        process.wait()


def refusal(run_dir: Path, pid: int) -> re.Pattern:
    return re.compile(rf"fedcme: error: {re.escape(str(run_dir))} is in use by PID {pid} "
                      r"\(started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d .*\); a run directory belongs to one command at a time")


def test_a_held_run_directory_stops_train_simulate_and_sync_in_one_line_and_dies_with_its_holder(
        tmp_path, capsys, holder, prefect_server):
    config, runs = tiny_config(tmp_path), tmp_path / "runs"
    run_dir = runs / "held"
    holding = holder(run_dir)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    commands = {
        "simulate": ["simulate", "--config", str(config), "--experiment", "held", "--runs-dir", str(runs)],
        "train": ["train", "--config", str(config), "--experiment", "held", "--runs-dir", str(runs),
                  "--tracking-uri", uri],
    }
    for name, arguments in commands.items():
        status = main(arguments)
        error = capsys.readouterr().err.strip().splitlines()
        assert status == 2 and len(error) == 1 and refusal(run_dir, holding.pid).match(error[0]), (name, error)
    assert not run_dir.exists() and not (tmp_path / "mlflow.db").exists()  # the refused commands wrote nothing

    run_dir.mkdir()
    status = main(["sync", "--experiment", "held", "--runs-dir", str(runs), "--tracking-uri", uri])
    error = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(error) == 1 and refusal(run_dir, holding.pid).match(error[0]), error
    run_dir.rmdir()

    holding.send_signal(signal.SIGKILL)  # no stale lock: the kernel drops it with the holder
    holding.wait()
    assert main(commands["simulate"]) == 0
    assert (run_dir / "server" / f"round-{ROUNDS:04d}.pt").is_file()


def test_a_cuda_device_without_a_gpu_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch, prefect_server):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config, runs = tiny_config(tmp_path), tmp_path / "runs"
    for command in ("simulate", "train"):
        status = main([command, "--config", str(config), "--experiment", "gpu", "--runs-dir", str(runs),
                       "--set", "device=cuda", *(["--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
                                                 if command == "train" else [])])
        error = capsys.readouterr().err.strip().splitlines()
        assert status == 2, command
        assert error == ["fedcme: error: device: 'cuda' was requested but no CUDA device is available"], error
    assert sorted(path.name for path in tmp_path.iterdir()) == ["tiny.yaml"]


@pytest.mark.slow
def test_experiments_launched_at_once_on_fresh_stores_all_succeed_and_a_duplicate_is_refused(tmp_path):
    config = tiny_config(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    token = f"FEDCME_CONCURRENCY_TEST_TOKEN={uuid.uuid4().hex}"
    environment = {key: value for key, value in os.environ.items() if key != "PREFECT_API_URL"}
    environment.update(PREFECT_HOME=str(tmp_path / "prefect-home"), PYTHONPATH=str(REPO_ROOT),
                       **dict([token.split("=", 1)]))
    launches = [(f"e{seed}", seed) for seed in range(2)] + [("same", 9), ("same", 9)]  # 4 first uses at once
    try:
        processes = [
            subprocess.Popen(
                [sys.executable, "-m", "flows.cli", "train", "--config", str(config), "--experiment", experiment,
                 "--runs-dir", str(tmp_path / "runs"), "--tracking-uri", uri, "--set", f"seed={seed}"],
                cwd=tmp_path, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for experiment, seed in launches
        ]
        outputs = [process.communicate(timeout=600) for process in processes]
        left = wait_until_none_left(token, timeout=30)
    finally:
        kill_all(token)
    assert left == [], "processes outlived their commands:\n" + "\n".join(left)

    for (experiment, _), process, (_, errors) in list(zip(launches, processes, outputs))[:2]:
        assert process.returncode == 0, (experiment, errors[-3000:])
    duplicates = sorted(zip((process.returncode for process in processes[2:]), processes[2:], outputs[2:]),
                        key=lambda item: item[0])
    (finished, _, (_, finished_errors)), (refused, _, (_, refused_errors)) = duplicates
    assert (finished, refused) == (0, 2), finished_errors[-3000:] + refused_errors[-3000:]
    holder_pid = duplicates[0][1].pid
    assert len(refused_errors.strip().splitlines()) == 1, refused_errors
    assert refusal(tmp_path / "runs" / "same", holder_pid).match(refused_errors.strip()), refused_errors

    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("fedcme-smoke").experiment_id])  # synthetic data
    assert sorted(run.data.tags["experiment"] for run in runs) == ["e0", "e1", "same"]
    for run in runs:
        assert run.info.status == "FINISHED", run.data.tags["experiment"]
        steps = [metric.step for metric in client.get_metric_history(run.info.run_id, "eval/test_accuracy")]
        assert steps == list(range(1, ROUNDS + 1)), (run.data.tags["experiment"], steps)
    with sqlite3.connect(tmp_path / "prefect-home" / "prefect.db") as database:
        flow_runs = database.execute("select name, state_type from flow_run").fetchall()
    assert sorted(flow_runs) == [(name, "COMPLETED") for name in ["e0", "e1", "same"]]


def test_a_dvc_train_stage_on_a_held_run_directory_is_refused_before_any_start_up(tmp_path, holder):
    """The stage takes its cell's run directory first: a duplicate stage ends in one line within seconds,
    before its Prefect server, its grid's MLflow parent run or torch start."""
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({
        "base": {**SYNTHETIC, "data": {"dataset": "fmnist"}, "model": {"name": "fmnist_cnn"}},
        "methods": {"fedavg": {"name": "fedavg"}},
        "grid": {"datasets": ["fmnist"], "partitions": ["a1.0"], "clients": [[4, 2]], "seeds": [0], "methods": ["fedavg"]},
    }))
    run_dir = tmp_path / "runs" / "fmnist-a1.0-k4m2-fedavg-s0"
    holding = holder(run_dir)
    environment = {key: value for key, value in os.environ.items() if key != "PREFECT_API_URL"}
    environment.update(PREFECT_HOME=str(tmp_path / "prefect-home"), PYTHONPATH=str(REPO_ROOT),
                       MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "flows.pipeline.stages", "--params", str(params), "train",
                             "--method", "fedavg", "--per-round", "2", "--dataset", "fmnist", "--partition", "a1.0",
                             "--clients", "4", "--seed", "0", "--runs-dir", str(tmp_path / "runs")],
                            cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - started

    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and refusal(run_dir, holding.pid).match(lines[0]), result.stderr
    assert elapsed < 10, elapsed
    assert sorted(path.name for path in tmp_path.iterdir()) == ["params.yaml", "runs"]  # no Prefect home, no MLflow store
