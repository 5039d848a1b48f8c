"""A full or read-only disk is the machine's fault, not a client's: the run stops at the first
failed write with one line naming the path and the errno, nothing written is half-overwritten, and
the run resumed after the fix ends bit-identical to an uninterrupted one."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys

import pytest

from fedcme_core import rounds
from fedcme_core.common import atomic
from fedcme_core.common.errors import StorageError, machine_error
from fedcme_core.common.run_lock import hold_run
from fedcme_core.rounds import RunPaths, completed_rounds, run_experiment

from .conftest import REPO_ROOT, USED_STORES
from .helpers import same_state
from .test_federation import without_timings

NO_SPACE = f"[Errno {errno.ENOSPC}] {os.strerror(errno.ENOSPC)}"


class FullDiskForClient:
    """The real local-training step, except that `client`'s in round `round_index` meets a full disk."""

    def __init__(self, client: int, round_index: int) -> None:
        self.real = rounds.train_phase_step
        self.client, self.round_index, self.calls = client, round_index, 0

    def __call__(self, config, run_dir, round_index, client_id, phase_index, start_checkpoint=None):
        if client_id == self.client and round_index == self.round_index:
            self.calls += 1
            path = RunPaths(run_dir).upload(round_index, client_id)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return self.real(config, run_dir, round_index, client_id, phase_index, start_checkpoint)


class FullDiskOnWrite:
    """os.fdopen for atomic writes whose file name contains `marker`: half the bytes go in, then ENOSPC."""

    def __init__(self, marker: str) -> None:
        self.real = os.fdopen
        self.marker = marker

    def __call__(self, descriptor, *args, **kwargs):
        handle = self.real(descriptor, *args, **kwargs)
        if self.marker not in os.readlink(f"/proc/self/fd/{descriptor}"):
            return handle
        real_write = handle.write

        def write(data):
            real_write(bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        handle.write = write
        return handle


def test_enospc_in_a_client_stops_the_run_naming_the_path_and_is_not_a_client_failure(
        tmp_path, synthetic_config, finished_run, monkeypatch):
    config = synthetic_config({"federation.rounds": 3, "runner.retries": 2})
    straight, straight_dir = finished_run({"federation.rounds": 3, "runner.retries": 2})
    client = rounds.select_step(config, 1).clients[0]
    full = FullDiskForClient(client, round_index=1)
    monkeypatch.setattr(rounds.loop, "train_phase_step", full)
    run_dir = tmp_path / "run"

    with pytest.raises(StorageError) as raised:
        run_experiment(config, run_dir)

    assert full.calls == 1  # not retried: the disk is not the client's
    assert str(raised.value).startswith(f"{RunPaths(run_dir).upload(1, client)}: cannot write: {NO_SPACE}; free space")
    assert "\n" not in str(raised.value) and "client" not in str(raised.value).split(":")[-1]
    assert completed_rounds(run_dir) == 1
    monkeypatch.setattr(rounds.loop, "train_phase_step", full.real)  # space freed
    resumed = run_experiment(config, run_dir)
    assert without_timings(resumed) == without_timings(straight)
    assert same_state(rounds.final_model(config, run_dir), rounds.final_model(config, straight_dir))


def test_enospc_on_the_servers_commit_keeps_the_last_state_whole_and_resumes_bit_identical(
        tmp_path, synthetic_config, finished_run, monkeypatch):
    config = synthetic_config({"federation.rounds": 3})
    straight, straight_dir = finished_run({"federation.rounds": 3})
    run_dir = tmp_path / "run"
    run_experiment(synthetic_config({"federation.rounds": 1}), run_dir)
    paths = RunPaths(run_dir)
    kept = paths.server_state(1).read_bytes()
    full = FullDiskOnWrite("round-0002.pt")
    monkeypatch.setattr(os, "fdopen", full)

    with pytest.raises(StorageError, match=rf"^{paths.server_state(2)}: cannot write: \[Errno 28\] No space left"):
        run_experiment(config, run_dir)

    assert completed_rounds(run_dir) == 1 and paths.server_state(1).read_bytes() == kept
    assert sorted(path.name for path in paths.server_state(0).parent.iterdir()) == ["round-0000.pt", "round-0001.pt"]
    monkeypatch.setattr(os, "fdopen", full.real)  # space freed
    resumed = run_experiment(config, run_dir)
    assert without_timings(resumed) == without_timings(straight)
    assert same_state(rounds.final_model(config, run_dir), rounds.final_model(config, straight_dir))


def test_an_atomic_write_refused_by_a_read_only_folder_names_the_file(tmp_path, monkeypatch):
    target = tmp_path / "metrics.json"
    target.write_bytes(b"old")

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(tmp_path))

    monkeypatch.setattr(atomic.tempfile, "mkstemp", read_only)
    with pytest.raises(StorageError, match=rf"^{target}: cannot write: \[Errno 30\] Read-only file system; make"):
        atomic.atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old"


def test_a_read_only_runs_folder_is_one_line_naming_the_lock_file(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    runs.mkdir()
    real_open = os.open

    def read_only(path, *args, **kwargs):  # a read-only mount, as root cannot make one with chmod
        if str(path).startswith(str(runs)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(StorageError) as raised:
        with hold_run(runs / "x"):
            pass
    assert str(raised.value) == (f"{runs / '.x.lock'}: cannot create the run's lock file: [Errno 30] Read-only file "
                                 "system; make that folder writable (or use another --runs-dir), then run the same "
                                 "command again to resume")


def test_only_the_machines_errnos_are_machine_errors():
    assert machine_error(OSError(errno.ENOSPC, "full", "/x")) is not None
    assert machine_error(OSError(errno.EDQUOT, "quota")) is not None
    assert machine_error(OSError("injected failure of a client")) is None
    assert machine_error(OSError(errno.ENOENT, "missing", "/x")) is None
    assert machine_error(ValueError("bad")) is None


# `fedcme train` whose round 2 meets a full disk: in a client's local training (`client`), or in the
# server's commit of its state (`server`).
FULL_DISK_IN_ROUND_2 = """
import errno, os, sys
from fedcme_core import rounds
import fedcme_core.rounds.loop
from fedcme_core.rounds import RunPaths
from flows.cli import main
where = sys.argv.pop(1)
real_step, real_fdopen = rounds.loop.train_phase_step, os.fdopen
def step(config, run_dir, round_index, client_id, phase_index, start=None):
    if where == "client" and round_index == 1:
        path = RunPaths(run_dir).upload(round_index, client_id)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    return real_step(config, run_dir, round_index, client_id, phase_index, start)
def fdopen(descriptor, *args, **kwargs):
    handle = real_fdopen(descriptor, *args, **kwargs)
    if where == "server" and "round-0002.pt" in os.readlink(f"/proc/self/fd/{descriptor}"):
        def write(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        handle.write = write
    return handle
rounds.loop.train_phase_step, os.fdopen = step, fdopen
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_enospc_through_the_flow_ends_in_one_line_naming_the_disk_not_the_clients(tmp_path, prefect_server):
    database = tmp_path / "mlflow.db"
    USED_STORES.seed(mlflow_db=database)
    environment = {**os.environ, "PREFECT_API_URL": prefect_server, "PYTHONPATH": str(REPO_ROOT)}
    processes = {where: subprocess.Popen(
        [sys.executable, "-c", FULL_DISK_IN_ROUND_2, where, "train", "--config", str(REPO_ROOT / "configs" / "smoke.yaml"),
         "--experiment", where, "--runs-dir", str(tmp_path / "runs"), "--tracking-uri", f"sqlite:///{database}",
         "--set", "runner.retries=1"], cwd=tmp_path, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True) for where in ("client", "server")}
    outcomes = {where: (process.wait(timeout=300), process.stderr.read()) for where, process in processes.items()}

    runs = tmp_path / "runs"
    expected = {"client": rf"{runs}/client/rounds/0001/client-\d{{4}}-upload\.pt",
                "server": rf"{runs}/server/server/round-0002\.pt"}
    for where, (status, errors) in outcomes.items():
        lines = errors.strip().splitlines()
        assert status == 2 and len(lines) == 1 and "Traceback" not in errors, (where, errors[-3000:])
        assert re.fullmatch(rf"fedcme: error: {expected[where]}: cannot write: {re.escape(NO_SPACE)}; free space on "
                            "that disk, then run the same command again to resume", lines[0]), (where, lines)
        assert completed_rounds(runs / where) == 1
