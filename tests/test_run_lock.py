"""The run directory's lock (fedcme_core/common/run_lock.py) is taken in a command's first second, before
its start-up, so a duplicate launch is refused at once; a command stopped by bad input before writing
anything takes its lock file away again, and a process that opened that file meanwhile locks anew."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from fedcme_core.common import locks
from fedcme_core.common.errors import RunError
from fedcme_core.common.locks import FileLock
from fedcme_core.common.run_lock import hold_run, run_lock_path

from .conftest import REPO_ROOT, USED_STORES


def test_a_hold_that_wrote_nothing_takes_its_lock_file_and_runs_folder_away(tmp_path):
    runs = tmp_path / "new" / "runs"
    with hold_run(runs / "x", tidy=True):
        assert run_lock_path(runs / "x").is_file()
    assert not (tmp_path / "new").exists()

    with hold_run(runs / "y", tidy=True):
        (runs / "y").mkdir()  # the command wrote its run directory: the lock file stays, as always
    assert run_lock_path(runs / "y").is_file()
    with hold_run(runs / "z"):
        pass
    assert run_lock_path(runs / "z").is_file()  # without tidy, nothing is removed


def test_a_process_that_opened_a_lock_file_just_before_its_removal_locks_the_new_file(tmp_path, monkeypatch):
    path = tmp_path / ".x.lock"
    first = FileLock(path)
    assert first.try_acquire()
    real_flock = locks.fcntl.flock
    calls = []

    def flock(descriptor, operation):
        if operation == locks.fcntl.LOCK_UN:
            return real_flock(descriptor, operation)
        calls.append(descriptor)
        if len(calls) == 1:  # the holder removes the file between our open and our flock
            first.remove()
        return real_flock(descriptor, operation)

    monkeypatch.setattr(locks.fcntl, "flock", flock)
    second = FileLock(path)
    assert second.try_acquire()
    monkeypatch.setattr(locks.fcntl, "flock", real_flock)
    assert len(calls) == 2  # its first lock was on the removed file: it locked again
    assert os.path.samestat(os.fstat(second._fd), os.stat(path))  # it holds the file the path names now
    assert not FileLock(path).try_acquire()  # so a third process is refused
    second.release()


def test_a_run_held_by_another_process_is_refused_in_one_line(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom fedcme_core.common.run_lock import hold_run\n"
                               "with hold_run(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(60)",
                               str(tmp_path / "x")], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunError, match=rf"^{tmp_path / 'x'} is in use by PID {holder.pid} \(started "):
            with hold_run(tmp_path / "x", tidy=True):
                pass
        assert run_lock_path(tmp_path / "x").is_file()  # the holder's file is never taken away
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_a_duplicate_launch_is_refused_within_seconds_while_the_first_trains(tmp_path, prefect_server):
    database, runs = tmp_path / "mlflow.db", tmp_path / "runs"
    USED_STORES.seed(mlflow_db=database)
    command = [sys.executable, "-m", "flows.cli", "train", "--config", str(REPO_ROOT / "configs" / "smoke.yaml"),
               "--experiment", "twice", "--runs-dir", str(runs), "--tracking-uri", f"sqlite:///{database}"]
    environment = {**os.environ, "PREFECT_API_URL": prefect_server, "PYTHONPATH": str(REPO_ROOT)}
    first = subprocess.Popen(command, cwd=tmp_path, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        lock = run_lock_path(runs / "twice")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (json.loads(lock.read_text() or "{}") if lock.exists() else {}
                                               ).get("pid") != first.pid:
            time.sleep(0.05)
        started = time.monotonic()
        second = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=120)
        elapsed = time.monotonic() - started
        status = first.wait(timeout=300)
    finally:
        first.kill()
        first.wait()

    lines = second.stderr.strip().splitlines()
    assert second.returncode == 2 and len(lines) == 1, second.stderr[-3000:]
    assert re.match(rf"fedcme: error: {re.escape(str(runs / 'twice'))} is in use by PID {first.pid} \(started ", lines[0])
    assert elapsed < 10, elapsed
    assert status == 0, first.stderr.read()[-3000:]
