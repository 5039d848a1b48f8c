"""No process outlives `fedcme train`: SIGKILLed at any moment, it leaves no Prefect server or
Dask worker behind; a Ctrl-C or SIGTERM to its process group stops it within seconds.

Each command runs with a token in its environment, which every process it starts inherits; after
the kill the process table (/proc) must hold no process with that token. The moments are found
on the command's own output and process tree: while it imports, while its temporary Prefect
server starts, mid-round, while the final model is logged, during shutdown, and mid-round on a
Dask LocalCluster.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from fedcme_core.config import load_config
from fedcme_core.rounds import completed_rounds, final_model

from .conftest import REPO_ROOT, SYNTHETIC, USED_STORES
from .helpers import same_state
from .processes import kill_all, processes_with_environment, sigint_as_in_a_terminal, wait_until_none_left

# `fedcme train` commands (each with its own temporary Prefect server) killed and signalled.
pytestmark = pytest.mark.slow

ROUNDS = 3
TOKEN_KEY = "FEDCME_KILL_TEST_TOKEN"


class Command:
    """`fedcme train` of a small synthetic FedCME run, its output lines read with their times."""

    def __init__(self, tmp_path: Path, runner: str = "threads") -> None:
        tmp_path.mkdir(parents=True, exist_ok=True)
        config = tmp_path / "config.yaml"
        values = {**SYNTHETIC, "federation": {"num_clients": 6, "clients_per_round": 4, "rounds": ROUNDS},
                  "runner": {"kind": runner, "workers": 2, "threads_per_worker": 1}}
        config.write_text(yaml.safe_dump(values))
        # A Prefect home and an MLflow store set up as by an earlier command (not this test's subject).
        USED_STORES.seed(prefect_home=tmp_path / "prefect-home", mlflow_db=tmp_path / "mlflow.db")
        self.token = f"{TOKEN_KEY}={uuid.uuid4().hex}"
        environment = {key: value for key, value in os.environ.items() if key != "PREFECT_API_URL"}
        environment.update(PREFECT_HOME=str(tmp_path / "prefect-home"), PYTHONPATH=str(REPO_ROOT),
                           **dict([self.token.split("=", 1)]))
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", "train", "--config", str(config), "--experiment", "killed",
             "--runs-dir", str(tmp_path / "runs"), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"],
            cwd=tmp_path, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True, preexec_fn=sigint_as_in_a_terminal,  # as a terminal's foreground job
        )
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append((time.monotonic() - self.started, line.rstrip()))

    def children(self) -> list[int]:
        return [pid for pid in processes_with_environment(self.token) if pid != self.process.pid]

    def wait_for(self, condition, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert self.process.poll() is None, f"the command ended before the moment: {self.output()}"
            assert time.monotonic() < deadline, f"the moment never came: {self.output()}"
            time.sleep(0.01)

    def saw(self, text: str) -> bool:
        return any(text in line for _, line in self.lines)

    def line_time(self, text: str) -> float:
        return next(at for at, line in self.lines if text in line)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def output(self) -> str:
        return "\n".join(line for _, line in self.lines[-30:])


LAST_ROUND = f"round {ROUNDS:>4}/{ROUNDS}"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[dict[str, float], Path, list[str]]:
    """An uninterrupted run: its times (seconds from start: its last round line and its exit), its
    folder and its output lines. It leaves no process either."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    command = Command(folder)
    try:
        assert command.process.wait(timeout=600) == 0, command.output()
        command._reader.join(timeout=10)
        exited = time.monotonic() - command.started
        assert wait_until_none_left(command.token, timeout=10) == []
        return {"last_round": command.line_time(LAST_ROUND), "exit": exited}, folder, [line for _, line in command.lines]
    finally:
        kill_all(command.token)


@pytest.fixture(scope="module")
def timeline(uninterrupted) -> dict[str, float]:
    return uninterrupted[0]


def test_train_without_an_api_url_runs_on_its_own_server_records_its_flow_run_and_stops_it(uninterrupted):
    _, folder, lines = uninterrupted

    assert any("uses a temporary Prefect server" in line for line in lines)
    summary = json.loads(lines[-1])
    # The run waited for the server to store every task run before stopping it.
    assert summary["prefect_task_runs_recorded"] == summary["prefect_task_runs"] > 0
    # The flow run is recorded in the temporary server's database under this PREFECT_HOME.
    with sqlite3.connect(folder / "prefect-home" / "prefect.db") as database:
        runs = database.execute(
            "select flow.name, flow_run.state_type from flow_run join flow on flow.id = flow_run.flow_id").fetchall()
    assert runs == [("fedcme-train", "COMPLETED")]
    # No process of that server is left (the fixture's check by the command's token; here by its home).
    assert processes_with_environment(f"PREFECT_HOME={folder / 'prefect-home'}") == []


def kill_when(command: Command, moment: str, timeline: dict[str, float], fraction: float = 0.8) -> bool:
    """SIGKILL `command` at `moment`; False when it had already exited (the moment was missed)."""
    if moment == "importing":
        time.sleep(0.3)
    elif moment == "server starting":
        command.wait_for(lambda: command.children(), timeout=60)
    elif moment in ("mid-round", "dask mid-round"):
        command.wait_for(lambda: command.saw("round    1/"))
    elif moment == "model logging":
        command.wait_for(lambda: command.saw(LAST_ROUND))
    elif moment == "shutdown":
        # Past the model logging, `fraction` of the way from the last round line to the exit.
        command.wait_for(lambda: command.saw(LAST_ROUND))
        delay = fraction * (timeline["exit"] - timeline["last_round"])
        time.sleep(max(0.0, delay - (time.monotonic() - command.started - command.line_time(LAST_ROUND))))
        if command.process.poll() is not None:
            return False
    command.kill()
    return True


@pytest.mark.parametrize("moment", ["importing", "server starting", "mid-round", "model logging", "shutdown",
                                    "dask mid-round"])
def test_no_process_outlives_a_killed_train(tmp_path, timeline, moment):
    # On a loaded machine the shutdown moment can come later than the uninterrupted run's timing
    # says: a command that exited first (and must have left nothing either) is run again, killed sooner.
    for attempt, fraction in enumerate((0.8, 0.5, 0.25)):
        command = Command(tmp_path / str(attempt), runner="dask" if moment.startswith("dask") else "threads")
        try:
            killed = kill_when(command, moment, timeline, fraction)
            # bounded: Dask's worker processes notice their nanny's death within seconds, more under load
            left = wait_until_none_left(command.token, timeout=30)
            assert left == [], f"killed while {moment}, these processes outlived it:\n" + "\n".join(left)
        finally:
            kill_all(command.token)
        if killed:
            return
    pytest.fail(f"the command always exited before its {moment} moment")


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_to_the_whole_process_group_stops_train_within_seconds(tmp_path, signal_number):
    # Ctrl-C signals the terminal's whole foreground group: the command and, unless it has a
    # session of its own, its Prefect server, after which the command's last state report would
    # retry against a dead server for minutes. The command stops within seconds and leaves nothing.
    command = Command(tmp_path)
    try:
        command.wait_for(lambda: command.saw("round    1/"))
        signalled = time.monotonic()
        os.killpg(command.process.pid, signal_number)
        status = command.process.wait(timeout=60)
        stopped_after = time.monotonic() - signalled
        assert wait_until_none_left(command.token, timeout=30) == []
    finally:
        kill_all(command.token)
    assert status != 0 and not command.saw(LAST_ROUND)
    assert stopped_after < 20, f"{stopped_after:.1f} s to stop after the signal:\n{command.output()}"


def test_a_killed_train_leaves_no_lock_and_the_same_command_resumes_its_run_to_the_same_model(tmp_path, uninterrupted):
    # The run directory's lock is the kernel's (flock): it ends with the killed command, so the
    # rerun takes the directory at once, with nothing to clean by hand, and resumes it: to the
    # model of the uninterrupted run, with every round logged to MLflow once.
    command = Command(tmp_path)
    try:
        kill_when(command, "mid-round", {})
        assert wait_until_none_left(command.token, timeout=30) == []
    finally:
        kill_all(command.token)
    assert (tmp_path / "runs" / ".killed.lock").is_file()  # the file stays; the lock died with its holder
    killed_at = completed_rounds(tmp_path / "runs" / "killed")

    rerun = Command(tmp_path)
    try:
        status = rerun.process.wait(timeout=600)
        rerun._reader.join(timeout=10)
        assert wait_until_none_left(rerun.token, timeout=30) == []
    finally:
        kill_all(rerun.token)
    assert status == 0, rerun.output()
    assert rerun.saw(f"resuming after round {killed_at} of {ROUNDS}") and 0 < killed_at < ROUNDS, rerun.output()
    assert rerun.saw(LAST_ROUND) and not rerun.saw("is in use"), rerun.output()
    config = load_config(tmp_path / "config.yaml")
    assert same_state(final_model(config, tmp_path / "runs" / "killed"),
                      final_model(config, uninterrupted[1] / "runs" / "killed"))
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = json.loads(rerun.lines[-1][1])["mlflow_run_id"]  # the command's summary, its last line
    for metric in ("eval/test_accuracy", "train/loss", "time/round_seconds"):
        assert [point.step for point in client.get_metric_history(run_id, metric)] == list(range(1, ROUNDS + 1))
