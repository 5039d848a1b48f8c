"""`python -m flows.pipeline.repro` (what `make run` runs) for real: one temporary Prefect server for
every stage of the smoke grid, and a signal that stops the command, its stage and its server."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

from .conftest import REPO_ROOT
from .helpers import dvc_checkout, run_checked
from .processes import sigint_as_in_a_terminal, wait_until_none_left
from .test_pipeline import EXPERIMENTS, children_of, grid_runs, stages_run

pytestmark = pytest.mark.slow


def repro_checkout(tmp_path: Path, mirror: Path) -> tuple[Path, dict]:
    """A copy of the repository with the smoke grid, and an environment with no Prefect API configured."""
    workdir = tmp_path / "repo"
    workdir.mkdir()
    environment = {key: value for key, value in os.environ.items() if not key.startswith("PREFECT_API")} | {
        "PREFECT_HOME": str(tmp_path / "prefect-home"), "MLFLOW_TRACKING_URI": f"sqlite:///{workdir / 'mlflow.db'}"}
    return workdir, dvc_checkout(REPO_ROOT, workdir, REPO_ROOT / "configs" / "params-smoke.yaml", mirror, environment)


def documented_ui(command: str) -> tuple[str, int]:
    """(host, port) of the UI that docs/orchestration.md's `.venv/bin/<command> ... --host 127.0.0.1` line
    serves (its comment's http://host:port)."""
    text = (REPO_ROOT / "docs" / "orchestration.md").read_text(encoding="utf-8")
    (address,) = {match for line in text.splitlines() if line.startswith(f".venv/bin/{command} ")
                  for match in re.findall(r"http://[\w.]+:\d+", line)}
    parsed = urlparse(address)
    return parsed.hostname, parsed.port


def links(text: str) -> list[str]:
    """Every http(s) URL in `text` (a tag, or a markdown artifact's `[text](url)`)."""
    return re.findall(r"https?://[^\s)\]]+", text)


def prefect_records(prefect_home: Path) -> tuple[list[str], list[str]]:
    """(every flow run's tags, every artifact's key, data and description) in the Prefect database that a
    temporary server left in `prefect_home` (the server is gone: its sqlite file is what stays)."""
    with contextlib.closing(sqlite3.connect(prefect_home / "prefect.db")) as database:
        tags = [tag for (row,) in database.execute("SELECT tags FROM flow_run") for tag in json.loads(row)]
        artifacts = [" ".join(str(field) for field in row)
                     for row in database.execute("SELECT key, data, description FROM artifact")]
    return tags, artifacts


def test_make_runs_repro_starts_one_prefect_server_for_every_stage(tmp_path, mirror):
    # `make run` runs `python -m flows.pipeline.repro`: with no Prefect API configured, one temporary server
    # serves every stage (none starts its own), and nothing outlives the command.
    workdir, environment = repro_checkout(tmp_path, mirror)
    for name in ("FEDCME_PREFECT_UI_URL", "FEDCME_MLFLOW_UI_URL"):  # the documented UIs, not a machine's own
        environment.pop(name, None)
    stage = "train@fedavg-fmnist-a0.5-clients0-0"

    output = run_checked([sys.executable, "-m", "flows.pipeline.repro", stage], workdir, environment)

    assert stages_run(output) == ["prepare@fmnist", "partition@fmnist-a0.5-clients0-0", stage]
    assert output.count("uses a temporary Prefect server") == 1
    assert "so the whole grid (every stage) uses a temporary Prefect server" in output
    assert (workdir / "metrics" / f"{EXPERIMENTS[0]}.json").is_file()
    # The grid's progress: one line per finished experiment, k of N with its final accuracy.
    assert "[grid] 1 experiment to train" in output
    assert re.search(rf"\[grid\] 1 of 1 done: {EXPERIMENTS[0]}: final accuracy \d+\.\d\d%, elapsed \S+, grid done",
                     output), output
    # The grid run's parent MLflow run, its experiment nested under it; no report yet, so still running.
    client, experiment_id, parents = grid_runs(workdir)
    (parent,) = parents
    assert parent.info.status == "RUNNING" and parent.data.tags["commit"] == "unknown"  # a repository with no commit
    children = children_of(client, experiment_id, parent.info.run_id)
    assert list(children) == [EXPERIMENTS[0]]
    assert wait_until_none_left(f"PREFECT_HOME={tmp_path / 'prefect-home'}", timeout=30) == []
    # Every stored link leads where a UI is once the command is over: the documented `prefect server start`
    # of the same PREFECT_HOME (never the temporary server's port) and `mlflow ui` of the same store.
    prefect_ui, mlflow_ui = documented_ui("prefect"), documented_ui("mlflow")
    mlflow_links = [link for run in [parent, *(client.get_run(run_id) for run_id in children.values())]
                    for value in run.data.tags.values() for link in links(value)]
    child_tags = [client.get_run(run_id).data.tags for run_id in children.values()]
    assert all(links(tags["prefect_flow_run"]) == [tags["prefect_flow_run"]] and urlparse(
        tags["prefect_flow_run"]).path == f"/runs/flow-run/{tags['prefect_flow_run_id']}" for tags in child_tags)
    assert {(urlparse(link).hostname, urlparse(link).port) for link in mlflow_links} == {prefect_ui}, mlflow_links
    flow_run_tags, artifacts = prefect_records(tmp_path / "prefect-home")
    prefect_links = [link for text in flow_run_tags + artifacts for link in links(text)]
    assert len([text for text in artifacts if text.startswith("mlflow-run ")]) == len(children), artifacts
    assert {(urlparse(link).hostname, urlparse(link).port) for link in prefect_links} == {mlflow_ui}, prefect_links
    run_pages = {f"/#/experiments/{experiment_id}/runs/{run_id}" for run_id in children.values()}
    assert {link.split(f":{mlflow_ui[1]}", 1)[1] for link in prefect_links} == run_pages


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_stops_repro_its_stage_and_its_server_within_seconds(tmp_path, mirror, signal_number):
    # Ctrl-C signals the terminal's foreground group (make, flows.pipeline.repro); flows.pipeline.repro passes a SIGTERM
    # to dvc's group (dvc, the train stage), and the server, in a session of its own, stays up until
    # the stage has recorded its end, then stops.
    workdir, environment = repro_checkout(tmp_path, mirror)
    process = subprocess.Popen([sys.executable, "-m", "flows.pipeline.repro"], cwd=workdir, env=environment, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                               preexec_fn=sigint_as_in_a_terminal)
    lines: list[str] = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("round    1/"):
            break
    assert lines and lines[-1].startswith("round    1/"), "".join(lines)
    signalled = time.monotonic()

    os.killpg(process.pid, signal_number)
    rest = process.communicate(timeout=120)[0]

    assert time.monotonic() - signalled < 30, rest
    assert process.returncode != 0
    assert wait_until_none_left(f"PREFECT_HOME={tmp_path / 'prefect-home'}", timeout=30) == []
    assert "Connection refused" not in rest  # the stage reported to a server that was still up
