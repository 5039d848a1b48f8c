"""A Dask cluster as another machine's would be: a scheduler and workers started with Dask's own
CLI on 127.0.0.1, each in a working directory of its own, used through `runner.dask_address`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from fedcme_core.config import load_config
from fedcme_core.rounds import final_model
from flows.common.errors import OrchestratorError
from flows.orchestration.train import run_training

from .conftest import REPO_ROOT
from .helpers import same_state
from .processes import kill_all, wait_until_none_left

# A real Dask scheduler and workers (processes), the session's Prefect server, a worker killed.
pytestmark = pytest.mark.slow

SMOKE = REPO_ROOT / "configs" / "smoke.yaml"
DASK = str(Path(sys.executable).parent / "dask")


@pytest.fixture(scope="module")
def dask_cli_cluster(tmp_path_factory, prefect_server):
    """`dask scheduler` and two `dask worker` processes, started once for this module's tests (a
    cluster takes seconds to start and to stop); yields (scheduler file, token of their environment).
    Once the tests are done, no process of the cluster is left."""
    token = f"FEDCME_TEST_DASK={uuid.uuid4().hex}"
    environment = {**os.environ, token.split("=")[0]: token.split("=")[1]}
    folder = tmp_path_factory.mktemp("dask-cluster")
    scheduler_file = folder / "scheduler.json"
    started = []
    directories = {name: folder / name for name in ("scheduler", "worker-a", "worker-b")}
    for directory in directories.values():
        directory.mkdir()
    started.append(subprocess.Popen([DASK, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                     "--scheduler-file", str(scheduler_file)], cwd=directories["scheduler"],
                                    env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    for name in ("worker-a", "worker-b"):
        started.append(subprocess.Popen([DASK, "worker", "--scheduler-file", str(scheduler_file), "--host", "127.0.0.1",
                                         "--nworkers", "1", "--nthreads", "1", "--no-dashboard", "--name", name],
                                        cwd=directories[name], env=environment,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        wait_for_workers(scheduler_file, 2)
        yield scheduler_file, token
    finally:
        for process in started:
            process.terminate()
        for process in started:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        kill_all(token)
        assert wait_until_none_left(token, timeout=30) == []


@pytest.fixture
def dask_cluster(dask_cli_cluster):
    """The module's cluster with both workers connected (a killed worker process is replaced by its
    nanny): (address, token of their environment)."""
    scheduler_file, token = dask_cli_cluster
    return wait_for_workers(scheduler_file, 2), token


def wait_for_workers(scheduler_file: Path, count: int, timeout: float = 120.0) -> str:
    from distributed import Client

    deadline = time.monotonic() + timeout
    while not scheduler_file.exists():
        assert time.monotonic() < deadline, "the Dask scheduler did not start"
        time.sleep(0.2)
    address = json.loads(scheduler_file.read_text())["address"]
    with Client(address, timeout=30) as client:
        client.wait_for_workers(count, timeout=timeout)
    return address


def test_a_run_on_external_dask_workers_equals_a_sequential_run(tmp_path, dask_cluster):
    address, _ = dask_cluster
    runs = tmp_path / "runs"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    fixed = {"runner.threads_per_worker": 1}  # the promise: the same threads per worker, any runner
    dask = load_config(SMOKE, overrides={**fixed, "runner.kind": "dask", "runner.dask_address": address})
    on_dask = run_training(dask, "on-dask", runs_dir=str(runs), tracking_uri=uri)
    sequential = run_training(load_config(SMOKE, overrides={**fixed, "runner.kind": "sequential"}), "sequential",
                              runs_dir=str(runs), tracking_uri=uri)

    config = load_config(SMOKE)
    assert same_state(final_model(config, on_dask["run_dir"]), final_model(config, sequential["run_dir"]))
    assert on_dask["final_accuracy"] == sequential["final_accuracy"]


def test_a_worker_that_cannot_load_the_data_is_named_before_the_run_starts(tmp_path, dask_cluster, mirror,
                                                                            monkeypatch):
    address, _ = dask_cluster
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mirror").symlink_to(mirror)  # a relative path: the workers' own directories lack it
    overrides = {"runner.kind": "dask", "runner.dask_address": address, "data.dataset": "fmnist",
                 "data.mirror": "mirror", "data.data_dir": "data", "data.train_subset": 500}

    with pytest.raises(OrchestratorError) as raised:
        run_training(load_config(SMOKE, overrides=overrides), "unseen-data", runs_dir="runs",
                     tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")

    message = str(raised.value)
    assert message.startswith("Dask worker tcp://127.0.0.1:") and "cannot load the run's data" in message
    assert "(and 1 more workers)" in message and "\n" not in message
    assert not (tmp_path / "runs" / "unseen-data").exists()  # nothing of the run was written


def test_a_worker_killed_mid_phase_leaves_the_same_model(tmp_path, dask_cluster):
    import signal
    import threading

    from .processes import children, command_line, processes_with_environment

    address, token = dask_cluster
    runs, uri = tmp_path / "runs", f"sqlite:///{tmp_path / 'mlflow.db'}"
    fixed = {"runner.threads_per_worker": 1, "federation.rounds": 3}
    outcome: dict = {}

    def train_on_dask() -> None:
        try:
            config = load_config(SMOKE, overrides={**fixed, "runner.kind": "dask", "runner.dask_address": address})
            outcome["summary"] = run_training(config, "survivor", runs_dir=str(runs), tracking_uri=uri)
        except BaseException as error:  # reported by the assertion below
            outcome["error"] = error

    thread = threading.Thread(target=train_on_dask)
    thread.start()
    # Mid-round: once the first client of round 2 has written its swap checkpoint (the others still train).
    deadline = time.monotonic() + 300
    while not (runs / "survivor" / "rounds" / "0001").exists() and thread.is_alive():
        assert time.monotonic() < deadline, "round 2 never started"
        time.sleep(0.05)
    (cli,) = [pid for pid in processes_with_environment(token) if "--name worker-a" in command_line(pid)]
    killed = children(cli)  # the nanny's worker process (the nanny starts a new one)
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    thread.join(timeout=600)
    sequential = run_training(load_config(SMOKE, overrides={**fixed, "runner.kind": "sequential"}), "sequential",
                              runs_dir=str(runs), tracking_uri=uri)

    assert killed and "error" not in outcome, outcome.get("error")
    config = load_config(SMOKE, overrides={"federation.rounds": 3})
    assert same_state(final_model(config, outcome["summary"]["run_dir"]), final_model(config, sequential["run_dir"]))
