"""Prefect's temporary server as `fedcme train` starts it itself (flows.orchestration.prefect_server), for real:
launched before the heavy imports, stopped when the command ends or dies (a whole `fedcme train` on
it, its flow run recorded: tests/test_kill.py), and started by several commands at once on a fresh
PREFECT_HOME (one sets the database up first)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import prefect
import pytest

from flows.common.errors import OrchestratorError
from flows.orchestration.prefect_server import TemporaryServer, temporary_prefect_server
from flows.common.shared_stores import FirstUse
from .conftest import REPO_ROOT
from .processes import children, is_gone, processes_with_environment


def environment_without_api(prefect_home: Path) -> dict[str, str]:
    environment = {key: value for key, value in os.environ.items() if key != "PREFECT_API_URL"}
    environment.update(PREFECT_HOME=str(prefect_home), PYTHONPATH=str(REPO_ROOT))
    return environment


@pytest.mark.slow
def test_the_server_stops_when_the_command_is_killed(tmp_path):
    script = textwrap.dedent("""
        import time
        from flows.orchestration.prefect_server import temporary_prefect_server
        with temporary_prefect_server() as server:
            print(server.process.pid, flush=True)
            time.sleep(600)
    """)
    command = subprocess.Popen([sys.executable, "-c", script], cwd=REPO_ROOT, env=environment_without_api(tmp_path / "home"),
                               stdout=subprocess.PIPE, text=True)
    server_pid = int(command.stdout.readline())
    assert not is_gone(server_pid)
    command.send_signal(signal.SIGKILL)
    command.wait()
    deadline = time.monotonic() + 20
    while not is_gone(server_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert is_gone(server_pid)


def test_a_configured_api_url_starts_nothing_and_changes_nothing():
    from prefect.settings import PREFECT_API_URL, temporary_settings

    before = os.environ.get("PREFECT_API_URL")
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        with temporary_prefect_server() as server:
            assert server is None
            assert os.environ.get("PREFECT_API_URL") == before


def test_a_server_that_exits_while_starting_is_a_one_line_error():
    server = TemporaryServer()
    server.process.kill()
    server.process.wait()
    with pytest.raises(OrchestratorError, match="exited with status -9 while starting"):
        server.wait_ready(timeout=30)


WAIT_FOR_SERVER = """
import sys, time
from pathlib import Path
from flows.orchestration.prefect_server import temporary_prefect_server
go = Path(sys.argv[1]) if len(sys.argv) > 1 else None
while go is not None and not go.exists():  # every process past its imports, then all at once
    time.sleep(0.005)
with temporary_prefect_server() as server:
    print("launched" if server.process is not None else "waiting", flush=True)
    server.wait_ready(120)
    print("ready", flush=True)
"""


@pytest.mark.slow
def test_a_server_started_while_another_command_sets_the_database_up_waits_for_it(tmp_path):
    home = tmp_path / "home"
    setup = FirstUse(home / "prefect.db", "prefect", prefect.__version__)
    assert setup.try_begin()  # another command's server is migrating the fresh database
    command = subprocess.Popen([sys.executable, "-c", WAIT_FOR_SERVER], cwd=REPO_ROOT, env=environment_without_api(home),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert command.stdout.readline().strip() == "waiting"
        time.sleep(1.0)
        assert children(command.pid) == []  # no server launched while the set-up is another's
        setup.abandon()
        output, errors = command.communicate(timeout=300)
    finally:
        command.kill()
    assert command.returncode == 0 and output.strip() == "ready", errors[-3000:]
    assert setup.is_done()  # the server that set the database up recorded it


@pytest.mark.slow
def test_servers_started_at_once_on_a_fresh_prefect_home_all_start(tmp_path):
    home, go = tmp_path / "home", tmp_path / "go"
    commands = [subprocess.Popen([sys.executable, "-c", WAIT_FOR_SERVER, str(go)], cwd=REPO_ROOT,
                                 env=environment_without_api(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for _ in range(3)]
    try:
        time.sleep(3.0)  # their imports
        go.touch()
        results = [command.communicate(timeout=300) for command in commands]
    finally:
        for command in commands:
            command.kill()
    for command, (output, errors) in zip(commands, results):
        assert command.returncode == 0 and output.split()[-1:] == ["ready"], errors[-3000:]
    assert FirstUse(home / "prefect.db", "prefect", prefect.__version__).is_done()
    assert processes_with_environment(f"PREFECT_HOME={home}") == []


def test_a_process_started_under_a_temporary_server_knows_it_stops_with_its_command(monkeypatch):
    """`make run`: flows.pipeline.repro starts the temporary server and its stages inherit PREFECT_API_URL;
    a stage still knows the server dies with the grid, so its MLflow -> Prefect links name the UI that
    `prefect server start` serves from the same PREFECT_HOME (flows.tracking.views.prefect_flow_run_url)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.orchestration import prefect_server

    class Started:  # the server as launched (its process and health are other tests' subject)
        api_url, ready = "http://127.0.0.1:5999/api", False

        def stop(self) -> None:
            pass

    monkeypatch.setattr(prefect_server, "TemporaryServer", Started)
    monkeypatch.delenv(prefect_server.TEMPORARY_API_ENV, raising=False)
    child = "import os\nfrom flows.orchestration.prefect_server import is_temporary\nprint(is_temporary(os.environ['PREFECT_API_URL']))"
    with temporary_settings(restore_defaults={PREFECT_API_URL}), temporary_prefect_server():
        inherited = subprocess.run([sys.executable, "-c", child], env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                                   capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    assert inherited == "True"
    assert prefect_server.TEMPORARY_API_ENV not in os.environ  # the command's environment as it was
    assert not prefect_server.is_temporary(Started.api_url) and not prefect_server.is_temporary("http://lab:4200/api")
