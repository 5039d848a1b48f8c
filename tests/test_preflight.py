"""What a run can check before it trains is checked at its entry point, before a Prefect flow or an
MLflow run is opened (flows/orchestration/preflight.py): a damaged partition (given with --partition or in the run
directory), damaged checkpoints, a read-only runs folder or run directory, and free disk against the
run's footprint. Each ends in one line with no traceback, and leaves earlier runs, quarantines and
MLflow records as they were."""

from __future__ import annotations

import errno
import json
import os
import shutil

import pytest
from mlflow.tracking import MlflowClient

from fedcme_core.rounds import RunPaths, run_experiment
from flows.orchestration import preflight
from flows.cli import main
from flows.tracking.run import RunTracker

from .conftest import REPO_ROOT, USED_STORES

SMOKE = REPO_ROOT / "configs" / "smoke.yaml"


def flip_byte(content: bytes) -> bytes:
    changed = bytearray(content)
    changed[len(changed) // 2] ^= 0xFF
    return bytes(changed)


CORRUPTIONS = {
    "flipped byte": flip_byte,
    "truncated": lambda content: content[: len(content) // 3],
    "bad zip header": lambda content: b"XX" + content[2:],
}


def console_lines(capfd) -> list[str]:
    """What the command left on the console's stderr (Prefect's and MLflow's handlers included)."""
    return capfd.readouterr().err.strip().splitlines()


@pytest.fixture(scope="module")
def smoke_partition(tmp_path_factory):
    """The smoke config's partition file, as `fedcme train` would write it."""
    from fedcme_core.config import load_config

    run_dir = tmp_path_factory.mktemp("smoke") / "run"
    run_experiment(load_config(SMOKE, overrides={"federation.rounds": 1}), run_dir)
    return RunPaths(run_dir).partition.read_bytes()


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_a_damaged_partition_file_is_one_line_and_opens_nothing(tmp_path, capfd, monkeypatch, smoke_partition,
                                                                 corruption):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "given.npz").write_bytes(CORRUPTIONS[corruption](smoke_partition))

    status = main(["train", "--config", str(SMOKE), "--experiment", "x", "--partition", "given.npz",
                   "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"])

    lines = console_lines(capfd)
    assert status == 2 and len(lines) == 1, lines
    assert lines[0].startswith("fedcme: error: partition file given.npz "), lines
    assert sorted(os.listdir(tmp_path)) == ["given.npz"]  # no run directory, lock file or MLflow store


@pytest.fixture
def finished_mlflow_run(tmp_path, smoke_partition):
    """A run directory of the smoke config (2 rounds) whose MLflow run is FINISHED, as `fedcme train`
    leaves it; returns (runs folder, tracking URI, the run's MLflow record)."""
    from fedcme_core.config import load_config
    from fedcme_core.rounds import load_server_state

    from flows.tracking.views import run_tags

    runs, database = tmp_path / "runs", tmp_path / "mlflow.db"
    USED_STORES.seed(mlflow_db=database)
    uri = f"sqlite:///{database}"
    config = load_config(SMOKE)
    run_experiment(config, runs / "x")
    tracker = RunTracker.open(uri, "fedcme-smoke", "x", runs / "x", params=config.flat(), tags=run_tags(config, "x", "commit"))
    tracker.sync(load_server_state(runs / "x", 2)["history"])
    tracker.finish("FINISHED")
    return runs, uri, MlflowClient(uri).get_run(tracker.run_id)


def assert_mlflow_as_it_was(uri: str, before) -> None:
    client = MlflowClient(uri)
    runs = client.search_runs([before.info.experiment_id])
    assert [run.info.run_id for run in runs] == [before.info.run_id]  # no new (FAILED) run
    after = client.get_run(before.info.run_id)
    assert (after.info.status, after.info.end_time) == ("FINISHED", before.info.end_time)


@pytest.mark.slow
def test_a_damaged_partition_in_the_run_directory_leaves_its_finished_mlflow_run_as_it_was(
        capfd, finished_mlflow_run):
    runs, uri, before = finished_mlflow_run
    partition = RunPaths(runs / "x").partition
    partition.write_bytes(flip_byte(partition.read_bytes()))
    capfd.readouterr()

    status = main(["train", "--config", str(SMOKE), "--experiment", "x", "--runs-dir", str(runs),
                   "--tracking-uri", uri, "--set", "federation.rounds=3"])

    lines = console_lines(capfd)
    assert status == 2 and len(lines) == 1 and lines[0].startswith(f"fedcme: error: partition file {partition}"), lines
    assert_mlflow_as_it_was(uri, before)


@pytest.mark.slow
def test_both_kept_checkpoints_corrupt_is_one_line_keeping_the_earlier_quarantine_and_the_mlflow_run(
        capfd, finished_mlflow_run):
    runs, uri, before = finished_mlflow_run
    paths = RunPaths(runs / "x")
    earlier = paths.server_state(2).with_name("round-0002.pt.corrupt-20261201T000000000000Z")
    earlier.write_bytes(b"an earlier incident")
    for round_index in (1, 2):
        state = paths.server_state(round_index)
        state.write_bytes(state.read_bytes()[:-10])
    capfd.readouterr()

    status = main(["train", "--config", str(SMOKE), "--experiment", "x", "--runs-dir", str(runs),
                   "--tracking-uri", uri, "--set", "federation.rounds=3"])

    lines = console_lines(capfd)
    assert status == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"fedcme: error: {paths.server_state(2)}: content hash mismatch"), lines
    assert lines[0].endswith("no earlier intact round to resume from"), lines
    assert earlier.read_bytes() == b"an earlier incident"
    assert sorted(path.name for path in paths.server_state(0).parent.iterdir()) == [
        "round-0001.pt", "round-0002.pt", earlier.name]
    assert_mlflow_as_it_was(uri, before)


def test_a_read_only_runs_folder_is_one_line_naming_the_path_and_errno(tmp_path, capfd, monkeypatch):
    runs = tmp_path / "runs"
    runs.mkdir()
    real_open = os.open

    def read_only(path, *args, **kwargs):  # root ignores modes, and no read-only mount can be made here
        if str(path).startswith(str(runs)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    status = main(["train", "--config", str(SMOKE), "--experiment", "x", "--runs-dir", str(runs),
                   "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"])

    lines = console_lines(capfd)
    assert status == 2 and lines == [
        f"fedcme: error: {runs / '.x.lock'}: cannot create the run's lock file: [Errno 30] Read-only file system; "
        "make that folder writable (or use another --runs-dir), then run the same command again to resume"], lines
    assert sorted(os.listdir(tmp_path)) == ["runs"] and os.listdir(runs) == []


def test_a_read_only_run_directory_is_found_before_training(tmp_path, monkeypatch, synthetic_config):
    run_dir = tmp_path / "run"
    run_experiment(synthetic_config({"federation.rounds": 1}), run_dir)

    def read_only(*args, dir=None, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dir))

    monkeypatch.setattr(preflight.tempfile, "mkstemp", read_only)
    with pytest.raises(preflight.StorageError, match=rf"^{run_dir}: cannot create files in this folder: \[Errno 30\]"):
        preflight.check_run(synthetic_config({"federation.rounds": 2}), run_dir, None)


def test_less_free_disk_than_the_runs_footprint_is_one_warning(tmp_path, capsys, monkeypatch, synthetic_config):
    config = synthetic_config()
    needed = preflight.footprint(config, 10, 240)
    model_bytes = 4 * 582_026  # fmnist_cnn's parameters, float32: the estimate is a multiple of the model
    assert needed > model_bytes * (4 + 5 * 4)
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda folder: shutil._ntuple_diskusage(1, 1, needed - 1))

    preflight.check_run(config, tmp_path / "run", None)

    lines = capsys.readouterr().err.strip().splitlines()
    megabytes = f"{(needed - 1) / 2**20:.1f} MB free, less than this run's estimated {needed / 2**20:.1f} MB"
    assert len(lines) == 1 and lines[0].startswith(f"fedcme: warning: {tmp_path}: {megabytes}"), lines
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda folder: shutil._ntuple_diskusage(1, 1, needed))
    preflight.check_run(config, tmp_path / "run", None)
    assert capsys.readouterr().err == ""
    assert json.dumps(os.listdir(tmp_path)) == "[]"  # the checks write nothing
