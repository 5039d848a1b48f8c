"""A training run's MLflow writes go through one background writer (flows/tracking/writer.py): the rounds
never wait for the store, a busy store costs one warning when it first refuses and one when it answers
again, MLflow's own tracebacks go to the run's log file, and a store busy past the wait turns tracking
off with a complete `fedcme sync` command that works as printed and logs nothing the second time."""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from fedcme_core.config import load_config
from fedcme_core.rounds import completed_rounds
from flows.tracking import writer as tracking_writer
from flows.tracking.store import sync_command
from flows.tracking.writer import BusyWait, TrackingWriter, mlflow_log_to

from .conftest import REPO_ROOT, USED_STORES

SMOKE = REPO_ROOT / "configs" / "smoke.yaml"
LOCKED = MlflowException("(sqlite3.OperationalError) database is locked")


class Clock:
    """A BusyWait's clock: a sleep moves it on at once."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def busy_then(result, refusals: int):
    calls = []

    def action():
        calls.append(1)
        if len(calls) <= refusals:
            raise LOCKED
        return result

    return action, calls


def test_a_busy_store_is_one_warning_when_it_refuses_and_one_when_it_answers_again(capsys):
    wait = BusyWait("sqlite:///m.db", wait=120, clock=Clock())

    action, calls = busy_then("logged", refusals=4)
    assert wait(action) == "logged" and len(calls) == 5
    assert wait(lambda: "at once") == "at once"

    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("fedcme: warning: MLflow store sqlite:///m.db is busy (database is locked")
    assert lines[0].endswith("training goes on and its tracking waits for the store, up to 120 s")
    assert lines[1].startswith("fedcme: warning: MLflow store sqlite:///m.db answers again after ")


def test_a_store_busy_past_the_wait_raises_its_error_after_the_real_wait(capsys):
    clock = Clock()
    wait = BusyWait("sqlite:///m.db", wait=120, clock=clock)
    started = clock.now
    action, calls = busy_then(None, refusals=10**6)

    with pytest.raises(MlflowException, match="database is locked"):
        wait(action)

    assert 120 <= clock.now - started < 121  # tries until the wait has passed, never sleeping past it
    assert len(capsys.readouterr().err.strip().splitlines()) == 1  # the refusal's warning; no recovery
    with pytest.raises(ValueError, match="not a busy store"):  # any other error: at once, no warning
        wait(lambda: (_ for _ in ()).throw(ValueError("not a busy store")))
    assert capsys.readouterr().err == ""


class BlockedTracker:
    """A RunTracker stand-in whose store is held until `release` is set."""

    uri = "sqlite:///held.db"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.logged: list[int] = []
        self.failures: list[str] = []
        self.busy = None

    def log_round(self, number: int) -> int:
        self.release.wait(30)
        self.logged.append(number)
        return number

    def fail(self, failure: str) -> None:
        self.failures.append(failure)


def test_the_rounds_never_wait_for_the_writer_and_it_logs_in_order_once_the_store_answers():
    tracker = BlockedTracker()
    writer = TrackingWriter(tracker, wait=60)
    assert isinstance(tracker.busy, BusyWait) and tracker.busy.wait == 60

    waits = []
    for number in range(50):
        started = time.perf_counter()
        writer.submit("log_round", number)
        waits.append(time.perf_counter() - started)
    assert max(waits) < 0.05 and tracker.logged == []
    tracker.release.set()
    assert writer.call("log_round", 50) == 50  # after every call queued before it
    writer.close()
    assert tracker.logged == list(range(51)) and tracker.failures == []


def test_a_full_queue_turns_tracking_off_once_and_never_blocks():
    tracker = BlockedTracker()
    writer = TrackingWriter(tracker, size=2)
    started = time.perf_counter()
    for number in range(6):
        writer.submit("log_round", number)
    assert time.perf_counter() - started < 0.5
    assert len(tracker.failures) >= 1
    assert tracker.failures[0] == "2 calls waiting for a store that does not take them"
    tracker.release.set()
    writer.close(timeout=30)


def test_mlflows_errors_and_tracebacks_go_to_the_runs_log_file_not_the_console(tmp_path):
    consoles = [handler for handler in logging.getLogger("mlflow").handlers]
    store_logger = logging.getLogger("mlflow.store.db.utils")
    with mlflow_log_to(tmp_path) as path:
        try:
            raise RuntimeError("(sqlite3.OperationalError) database is locked")
        except RuntimeError:
            store_logger.exception("SQLAlchemy database error. The following exception is caught.")
        traceback_record = store_logger.makeRecord("mlflow.store", logging.ERROR, __file__, 1, "failed", (),
                                                   sys.exc_info())
        sql_record = store_logger.makeRecord("mlflow.system_metrics", logging.WARNING, __file__, 1,
                                             "Failed to get mlflow run: locked\n[SQL: SELECT ...]", (), None)
        one_line = store_logger.makeRecord("mlflow", logging.WARNING, __file__, 1, "a one-line warning", (), None)
        assert consoles and all(not handler.filter(traceback_record) and not handler.filter(sql_record)
                                and handler.filter(one_line) for handler in consoles)
    logged = path.read_text(encoding="utf-8")
    assert "Traceback" in logged and "database is locked" in logged
    assert all(handler.filter(traceback_record) for handler in consoles)  # as MLflow had it, after the run


def test_the_sync_command_is_complete_and_works_from_anywhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    command = shlex.split(sync_command(Path("runs/x"), "sqlite:///mlflow.db"))
    assert command == ["fedcme", "sync", "--experiment", "x", "--runs-dir", str(tmp_path / "runs"),
                       "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
    assert shlex.split(sync_command(Path("/r/x"), "http://127.0.0.1:5000"))[-1] == "http://127.0.0.1:5000"


def hold_write_lock(database: Path, after_rounds: int, run_dir: Path, seconds: float) -> threading.Thread:
    """A thread that takes the store's write lock once `run_dir` has committed `after_rounds` rounds,
    and holds it for `seconds`."""

    def hold() -> None:
        while completed_rounds(run_dir) < after_rounds:
            time.sleep(0.05)
        connection = sqlite3.connect(database, isolation_level=None, timeout=60)
        connection.execute("begin exclusive")
        hold.held_at = time.monotonic()
        time.sleep(seconds)
        connection.execute("commit")
        connection.close()
        hold.released_at = time.monotonic()

    thread = threading.Thread(target=hold, daemon=True)
    thread.hold = hold
    thread.start()
    return thread


def commit_times(run_dir: Path, rounds: int, stop: threading.Event) -> list[float]:
    """When each round's commit appeared (polled every 20 ms on a thread) until `stop`."""
    seen: list[float] = []

    def watch() -> None:
        while not stop.is_set() and len(seen) < rounds:
            done = completed_rounds(run_dir) if run_dir.exists() else 0
            seen.extend(time.monotonic() for _ in range(done - len(seen)))
            time.sleep(0.02)

    threading.Thread(target=watch, daemon=True).start()
    return seen


@pytest.mark.slow
def test_a_store_locked_past_the_wait_never_slows_the_rounds_and_the_printed_sync_logs_the_rest(
        tmp_path, capfd, monkeypatch, prefect_server):
    from flows.orchestration.train import run_training

    monkeypatch.setattr(tracking_writer, "BUSY_WAIT", 4.0)  # MLflow's own 20 s sqlite wait comes on top
    database, runs, rounds = tmp_path / "mlflow.db", tmp_path / "runs", 14
    USED_STORES.seed(mlflow_db=database)
    uri = f"sqlite:///{database}"
    holder = hold_write_lock(database, after_rounds=3, run_dir=runs / "lk", seconds=23.0)
    stop = threading.Event()
    commits = commit_times(runs / "lk", rounds, stop)

    summary = run_training(load_config(SMOKE, overrides={"federation.rounds": rounds}), "lk", runs_dir=str(runs),
                           tracking_uri=uri)
    stop.set()
    holder.join(60)

    gaps = [later - earlier for earlier, later in zip(commits, commits[1:])]
    held = [gap for gap, at in zip(gaps, commits[1:]) if holder.hold.held_at < at < holder.hold.released_at]
    assert len(held) >= 3, (commits, holder.hold.held_at)
    assert max(held) < max(8.0, 4 * max(gaps[:2])), gaps  # a round that waited on the store would take 20 s
    assert summary["tracking_failure"] and "database is locked" in summary["tracking_failure"]
    errors = capfd.readouterr().err  # INFO records too: this process's logging is not the command's (WARNING)
    lines = [line for line in errors.strip().splitlines() if not re.search(r"\bINFO\b", line)]
    assert "Traceback" not in errors and len(lines) == 2, lines
    assert "MLflow store" in lines[0] and "is busy (database is locked" in lines[0]
    assert lines[1].startswith("fedcme: warning: MLflow tracking failed (")
    hint = lines[1].rsplit("`", 2)[1]
    assert hint == sync_command(runs / "lk", uri)

    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    client = MlflowClient(uri)
    outputs = []
    for _ in range(2):  # as printed, from another folder; the second time nothing is missing
        result = subprocess.run(hint, shell=True, cwd=elsewhere, env=environment, capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0 and result.stderr == "", result.stderr[-3000:]
        outputs.append(json.loads(result.stdout.strip().splitlines()[-1]))
        run = client.get_run(summary["mlflow_run_id"])
        steps = [metric.step for metric in client.get_metric_history(run.info.run_id, "eval/test_accuracy")]
        assert steps == list(range(1, rounds + 1)) and run.info.status == "FINISHED"
    first, second = outputs
    assert first["rounds_logged"] > 0 and first["summary_logged"] and first["model_logged"]
    assert (second["rounds_logged"], second["summary_logged"], second["model_logged"]) == (0, False, False)
    assert len(client.get_metric_history(summary["mlflow_run_id"], "final_accuracy")) == 1
